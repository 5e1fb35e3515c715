// Private helpers shared by the gRPC server and client: status mapping, message validation,
// chunking. Not installed; includes generated protobuf headers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "atoll.grpc.pb.h"
#include "atoll/syncer/syncer_core.h"

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

// Streams a pull result (header then chunks); returns the payload bytes written.
int64_t WritePull(const syncer::PullPayload& p, grpc::ServerWriter<atl::v1::PullChunk>* writer);
// The mirror of WritePull's header: fills `out` (all but the bytes) and the announced payload
// size and checksum. InvalidArgument for an encoding other than the lattice's or an unknown
// compression; DataLoss for sizes out of range.
inline constexpr const char* kLatticeEncoding = "lattice";
Status ParsePullHeader(const atl::v1::PullHeader& h, int64_t max_payload_bytes, syncer::PullPayload& out, int64_t& payload_bytes,
                       uint64_t& payload_checksum);

void FillJoinReply(const syncer::JoinReplyData& r, atl::v1::JoinReply* out);
StatusOr<syncer::JoinReplyData> ParseJoinReply(const atl::v1::JoinReply& r);

StatusOr<std::string> ReadPem(const std::string& path, const std::string& what);

}  // namespace atl::transport
