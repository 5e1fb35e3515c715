// The gRPC client of the atl.v1 protocol (src/transport/atoll.proto, docs/wire-protocol.md): a
// SyncerApi over a channel, with a deadline on every call (a push's and a pull's grow with their
// bytes), counting the bytes it sends and receives. Optionally TLS and mutual TLS.
// Thread-safety: every method may be called from several threads at once (a learner agent's
// exchange and heartbeat threads).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "atoll/syncer/api.h"
#include "atoll/syncer/replication.h"
#include "atoll/transport/credentials.h"

namespace atl::transport {

inline constexpr size_t kMaxChunkBytes = 1 << 20;  // a push's or pull's chunk: 1 MiB (gRPC's default limit is 4 MiB)

struct ClientOptions {
  std::string target;  // host:port
  std::string token;
  TlsOptions tls;
  double call_timeout_s = 10.0;  // deadline for join/heartbeat/status
  double push_timeout_s = 60.0;  // deadline for one push (and what a pull may take beyond its wait)
  // Pushes and pulls get push_timeout_s plus the time their payload takes at this rate: a push
  // its own size, a pull the largest fragment a full copy can be (fp32, from the join's sizes).
  double min_link_mbps = 10.0;
  // A pull whose stream breaks after part of its payload arrived is resumed from the bytes held
  // (the syncer continues the same payload, or starts over where it has moved on) this many times.
  int pull_resumes = 3;
};

// Receives one replicated file: the reply's header (epoch, seq, snapshot; no files), the file's
// name in the state folder and its bytes. An error ends the reply.
using ReplicaFileSink =
    std::function<Status(const syncer::ReplicateBatch& reply, const std::string& name, std::string bytes)>;

// push_timeout_s + the seconds `bytes` take at `mbps` (mbps ≤ 0: no allowance).
double PayloadDeadlineSeconds(double base_s, int64_t bytes, double mbps);

class GrpcSyncerClient final : public syncer::SyncerApi {
 public:
  static StatusOr<std::unique_ptr<GrpcSyncerClient>> Connect(const ClientOptions& options);
  ~GrpcSyncerClient() override;

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& request) override;
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int learner_id, const syncer::LearnerProgress& progress) override;
  Status Leave(int learner_id) override;
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& header, std::span<const std::byte> payload) override;
  StatusOr<syncer::PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                     int64_t want_version) override;
  StatusOr<std::string> StatusJson();
  StatusOr<std::string> Finish(bool evaluate);
  // A standby's ask for the leader's commits (docs/decisions/023), with operator credentials: the
  // files arrive through `on_file` in write order; returns what they bring the follower to. The
  // deadline is the ask's wait plus push_timeout_s plus the time the files take at min_link_mbps.
  StatusOr<syncer::ReplicateBatch> Replicate(const syncer::ReplicateAsk& ask, const ReplicaFileSink& on_file);
  // Ends a Replicate call in progress on another thread (it returns CANCELLED), and the next one
  // before it starts.
  void CancelReplicate();

  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }
  // Pull streams resumed after a break (ClientOptions::pull_resumes).
  int64_t pulls_resumed() const { return pulls_resumed_.load(); }
  // Channels opened: one at Connect, and one more at each join after a call failed UNAVAILABLE (a
  // server that went away is reached again over a new channel).
  int64_t channels_opened() const;

  // Test hooks: send a push whose stream is cut after `chunks` data chunks, or whose chunk
  // `corrupt_chunk` carries a wrong checksum.
  struct PushFault {
    int truncate_after_chunks = -1;
    int corrupt_chunk = -1;
    size_t chunk_bytes = kMaxChunkBytes;
  };
  StatusOr<syncer::PushResult> PushWithFault(const syncer::PushHeaderData& header, std::span<const std::byte> payload,
                                             const PushFault& fault);

 private:
  struct Impl;
  explicit GrpcSyncerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0}, pulls_resumed_{0};
};

}  // namespace atl::transport
