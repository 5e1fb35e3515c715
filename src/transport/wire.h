// The wire mapping, private to the gRPC server and client: every conversion between the protobuf
// messages of atoll.proto and the structs of syncer/api.h (Fill* writes a message, Parse* reads
// and validates one), status mapping and chunking. grpc_server.cc and grpc_client.cc only move
// these messages and bytes. Not installed; includes generated protobuf headers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "atoll.grpc.pb.h"
#include "atoll/syncer/api.h"
#include "atoll/syncer/replication.h"
#include "atoll/transport/grpc_client.h"

namespace atl::transport {

inline constexpr const char* kTokenKey = "x-atoll-token";
// A push's learner id, in decimal: the server checks its token and limits before reading.
inline constexpr const char* kLearnerKey = "x-atoll-learner";

grpc::Status ToGrpc(const Status& st);
Status FromGrpc(const grpc::Status& st, const std::string& what);

// Validates a push header; returns the decoded header and the payload checksum.
// A compression field of a header or join reply: "" (a peer from before compression: none),
// "none" or "deflate"; InvalidArgument otherwise.
StatusOr<diloco::Compression> ParseWireCompression(const std::string& s);
StatusOr<std::pair<syncer::PushHeaderData, uint64_t>> ParsePushHeader(const atl::v1::PushHeader& h);
void FillPushHeader(const syncer::PushHeaderData& h, int64_t payload_bytes, uint64_t checksum,
                    atl::v1::PushHeader* out);

// Appends one data chunk after validating its offset, size, bound and checksum.
Status AppendChunk(const atl::v1::DataChunk& chunk, int64_t total, std::vector<std::byte>& payload);

// How a pull's reply is streamed: from byte `from` of the payload (a resumed pull), in chunks of
// `chunk_bytes`, and (a test hook) at most `max_chunks` data chunks (< 0: all).
struct PullWrite {
  int64_t from = 0;
  size_t chunk_bytes = kMaxChunkBytes;
  int max_chunks = -1;
  uint64_t epoch = 0;  // the header's leader_epoch (the payload is shared, the epoch the server's)
};
// Streams a pull result (header then chunks), `payload_checksum` being Checksum64(p.bytes);
// returns the payload bytes written.
int64_t WritePull(const syncer::PullPayload& p, uint64_t payload_checksum, const PullWrite& w,
                  grpc::ServerWriter<atl::v1::PullChunk>* writer);
// Where a resumed pull continues in `p` (checksum `payload_checksum`): its resume_offset when the
// reply is the very payload it was receiving and the offset lies inside it, else 0.
// InvalidArgument for a negative offset.
StatusOr<int64_t> ResumeOffset(const atl::v1::PullRequest& r, const syncer::PullPayload& p, uint64_t payload_checksum);
// The mirror of WritePull's header: fills `out` (all but the bytes) and the announced payload
// size and checksum. InvalidArgument for an encoding other than the lattice's or an unknown
// compression; DataLoss for sizes out of range.
inline constexpr const char* kLatticeEncoding = "lattice";
Status ParsePullHeader(const atl::v1::PullHeader& h, int64_t max_payload_bytes, syncer::PullPayload& out,
                       int64_t& payload_bytes, uint64_t& payload_checksum);

// Replication (docs/decisions/023). The server's side: opens every file of `batch` in `dir` (each
// is then a consistent version: files are only ever replaced by rename), writes the header and
// the files' bytes back to back in checked chunks. A file of a snapshot that does not exist is left
// out, except meta.json (NotFound). Returns the bytes written.
StatusOr<int64_t> WriteReplicate(const syncer::ReplicateBatch& batch, const std::string& dir,
                                 grpc::ServerWriter<atl::v1::ReplicateChunk>* writer);
// The follower's side: reads one reply, calling `on_file` with each file as soon as its bytes are
// all in. DataLoss for a stream that does not match its header; InvalidArgument for a file name
// that is not a plain name. `ended` says whether the stream was read to its end (the server's
// status then awaits; else the call must be cancelled).
StatusOr<syncer::ReplicateBatch> ReadReplicate(grpc::ClientReaderInterface<atl::v1::ReplicateChunk>* reader,
                                               const ReplicaFileSink& on_file, bool& ended);

// The pull's reply assembled from its stream: one header (ParsePullHeader, its payload bounded by
// `max_payload_bytes`), then the chunks (AppendChunk). DataLoss for a second header, data before
// the header, a missing header or a payload that does not add up to the announced size and
// checksum. A pull whose stream broke is resumed (Resume, then a new stream): its header either
// continues the payload held (same version, size and checksum, resume_offset = the bytes held) or
// starts over (resume_offset 0, what was held is dropped).
class PullAssembler {
 public:
  explicit PullAssembler(int64_t max_payload_bytes) : max_payload_bytes_(max_payload_bytes) {}
  Status Add(const atl::v1::PullChunk& msg);
  StatusOr<syncer::PullPayload> Finish() &&;

  // Part of a payload is held: a new stream can continue it.
  bool Resumable() const;
  // The next stream's request resumes this reply; its header may follow the one received.
  void Resume(atl::v1::PullRequest& request);
  int64_t held_bytes() const { return static_cast<int64_t>(out_.bytes.size()); }
  int64_t missing_bytes() const { return have_header_ ? total_ - held_bytes() : 0; }

 private:
  Status AddHeader(const atl::v1::PullHeader& h);
  int64_t max_payload_bytes_;
  syncer::PullPayload out_;
  bool have_header_ = false;
  bool resuming_ = false;
  int64_t total_ = 0;
  uint64_t checksum_ = 0;
};

void FillJoinRequest(const syncer::JoinRequestData& r, atl::v1::JoinRequest* out);
// The host is cut to 256 bytes of valid UTF-8; a shard count of 0 (a learner that does not say)
// reads as unsharded.
syncer::JoinRequestData ParseJoinRequest(const atl::v1::JoinRequest& r);
void FillJoinReply(const syncer::JoinReplyData& r, atl::v1::JoinReply* out);
StatusOr<syncer::JoinReplyData> ParseJoinReply(const atl::v1::JoinReply& r);

void FillHeartbeat(int learner_id, const syncer::LearnerProgress& p, atl::v1::HeartbeatRequest* out);
// InvalidArgument for an unknown learner state or negative or non-finite progress values.
StatusOr<syncer::LearnerProgress> ParseHeartbeat(const atl::v1::HeartbeatRequest& r);
void FillHeartbeatReply(const syncer::HeartbeatReplyData& d, atl::v1::HeartbeatReply* out);
syncer::HeartbeatReplyData ParseHeartbeatReply(const atl::v1::HeartbeatReply& r);

void FillPushReply(const syncer::PushResult& r, atl::v1::PushReply* out);
syncer::PushResult ParsePushReply(const atl::v1::PushReply& r);

StatusOr<std::string> ReadPem(const std::string& path, const std::string& what);

}  // namespace atl::transport
