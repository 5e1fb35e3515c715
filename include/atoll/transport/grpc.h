// The gRPC transport of the atoll.v1 protocol (src/transport/atoll.proto, docs/wire-protocol.md).
//
// Server: wraps a SyncerLoop. Every call must carry the shared token (metadata "x-atoll-token");
// a push names its learner in metadata ("x-atoll-learner"), so its credential and limits are
// checked before its first message is read; pushes arrive as a header then checksummed chunks of
// ≤ 1 MiB; every field is validated before the loop sees it. Errors map 1:1 to gRPC codes with a
// readable message.
// Client: implements SyncerApi over a channel, with a deadline on every call, and counts the
// bytes it sends and receives. Both optionally use TLS.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "atoll/syncer/syncer_loop.h"

namespace atl::transport {

inline constexpr size_t kMaxChunkBytes = 1 << 20;          // 1 MiB (gRPC's default limit is 4 MiB)

struct TlsOptions {
  bool enabled = false;
  // Server: its certificate and key (PEM). Client: its own certificate and key for mutual TLS
  // (both empty: no client certificate).
  std::string cert_file, key_file;
  std::string ca_file;              // client: the CA that signed the server certificate
  std::string server_name;          // client: override of the expected host name
  // Server: mutual TLS — every client must present a certificate signed by this CA (PEM);
  // empty: clients are not asked for one.
  std::string client_ca_file;
};

// Limits against hostile or broken clients (docs/security.md). Each refusal is
// RESOURCE_EXHAUSTED with a message; connection limits are gRPC's own channel arguments.
// Descriptors the gRPC port's connection cap leaves for the rest of the process.
inline constexpr int kFdHeadroom = 256;

struct ServerLimits {
  int64_t max_inflight_push_bytes = int64_t{2} << 30;  // payload bytes of all pushes being received
  // Open connections on the port; one beyond is closed at accept. Never more than the process's
  // descriptor limit (RLIMIT_NOFILE) minus kFdHeadroom, so connections cannot starve a commit.
  int max_connections = 4096;
  int max_concurrent_streams = 64;          // per connection (GRPC_ARG_MAX_CONCURRENT_STREAMS)
  int max_threads = 256;                    // handler threads (ResourceQuota::SetMaxThreads)
  int64_t memory_quota_bytes = int64_t{4} << 30;  // gRPC's buffers (ResourceQuota::Resize)
  int handshake_timeout_ms = 10'000;        // a connection must finish its handshake within this
  int max_connection_idle_ms = 120'000;     // a connection without calls for this long is closed
  int keepalive_time_ms = 30'000;           // the server pings an idle transport this often,
  int keepalive_timeout_ms = 10'000;        // and closes it when the ping is not answered
  // Calls that hold a handler thread, admitted before anything is read (src/transport/admission.h):
  // per learner id at once, and all learners together max_threads − 64 (threads left for joins,
  // heartbeats and status).
  int max_pushes_per_learner = 4;
  int max_polls_per_learner = 4;            // pulls, long polls included
  double max_heartbeats_per_s = 20;         // per learner (a learner sends 2)
  int push_timeout_ms = 120'000;            // a push stream still open after this is cancelled
};

struct ServerOptions {
  std::string address = "127.0.0.1:0";  // port 0: choose a free port
  std::string token;                    // shared auth token ("" = none required)
  // Run secret for per-learner credentials (transport/credentials.h); when set it replaces the
  // shared token: learner m must present LearnerToken(secret, run id, m), Status and Finish need
  // OperatorToken(secret, run id).
  std::string secret;
  // With a secret: the learner ids whose tokens are accepted ("" = any; e.g. "0-3"). Others are
  // refused with PERMISSION_DENIED: leaving an id out revokes that learner's credential.
  std::string allowed_learners;
  TlsOptions tls;
  ServerLimits limits;
};

class GrpcSyncerServer {
 public:
  // Starts listening. `loop` must outlive the server. `on_finish` is called (on a gRPC thread)
  // when a Finish RPC arrives and must return the summary JSON text.
  static StatusOr<std::unique_ptr<GrpcSyncerServer>> Start(
      const ServerOptions& options, syncer::SyncerLoop& loop,
      std::function<std::string(bool evaluate)> on_finish);
  virtual ~GrpcSyncerServer() = default;
  virtual int port() const = 0;
  // Connections closed at accept because ServerLimits::max_connections were open.
  virtual int64_t connections_refused() const = 0;
  virtual void Shutdown() = 0;
  // Blocks until Shutdown().
  virtual void Wait() = 0;
};

struct ClientOptions {
  std::string target;   // host:port
  std::string token;
  TlsOptions tls;
  double call_timeout_s = 10.0;   // deadline for join/heartbeat/status
  double push_timeout_s = 60.0;   // deadline for one push (and what a pull may take beyond its wait)
  // Pushes and pulls get push_timeout_s plus the time their payload takes at this rate: a push
  // its own size, a pull the largest fragment a full copy can be (fp32, from the join's sizes).
  double min_link_mbps = 10.0;
};

// push_timeout_s + the seconds `bytes` take at `mbps` (mbps ≤ 0: no allowance).
double PayloadDeadlineSeconds(double base_s, int64_t bytes, double mbps);

class GrpcSyncerClient final : public syncer::SyncerApi {
 public:
  static StatusOr<std::unique_ptr<GrpcSyncerClient>> Connect(const ClientOptions& options);
  ~GrpcSyncerClient() override;

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& request) override;
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int learner_id,
                                                 const syncer::LearnerProgress& progress) override;
  Status Leave(int learner_id) override;
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& header,
                                    std::span<const std::byte> payload) override;
  StatusOr<syncer::PullPayload> Pull(int learner_id, int fragment, int64_t have_version,
                                     double wait_seconds, int64_t want_version) override;
  StatusOr<std::string> StatusJson();
  StatusOr<std::string> Finish(bool evaluate);

  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }

  // Test hooks: send a push whose stream is cut after `chunks` data chunks, or whose chunk
  // `corrupt_chunk` carries a wrong checksum.
  struct PushFault {
    int truncate_after_chunks = -1;
    int corrupt_chunk = -1;
    size_t chunk_bytes = kMaxChunkBytes;
  };
  StatusOr<syncer::PushResult> PushWithFault(const syncer::PushHeaderData& header,
                                             std::span<const std::byte> payload,
                                             const PushFault& fault);

 private:
  struct Impl;
  explicit GrpcSyncerClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> bytes_sent_{0}, bytes_received_{0};
};

}  // namespace atl::transport
