// The gRPC server of the atl.v1 protocol (src/transport/atoll.proto, docs/wire-protocol.md),
// around a SyncerLoop. Every call must carry the shared token (metadata "x-atoll-token") or, with
// a run secret, its per-learner one; a push names its learner in metadata ("x-atoll-learner"), so
// its credential and limits are checked before its first message is read; pushes arrive as a
// header then checksummed chunks of ≤ 1 MiB; every field is validated (src/transport/wire.h)
// before the loop sees it. Errors map 1:1 to gRPC codes with a readable message. Optionally TLS
// and mutual TLS.
// Thread-safety: gRPC's handler threads call into it (docs/architecture.md, Threading); Start,
// Shutdown and Wait from the owner's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "atoll/syncer/replication.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc_client.h"

namespace atl::transport {

// Limits against hostile or broken clients (docs/security.md). Each refusal is
// RESOURCE_EXHAUSTED with a message; connection limits are gRPC's own channel arguments.
// Descriptors the gRPC port's connection cap leaves for the rest of the process.
inline constexpr int kFdHeadroom = 256;

struct ServerLimits {
  int64_t max_inflight_push_bytes = int64_t{2} << 30;  // payload bytes of all pushes being received
  // Open connections on the port; one beyond is closed at accept. Never more than the process's
  // descriptor limit (RLIMIT_NOFILE) minus kFdHeadroom, so connections cannot starve a commit.
  int max_connections = 4096;
  int max_concurrent_streams = 64;                // per connection (GRPC_ARG_MAX_CONCURRENT_STREAMS)
  int max_threads = 256;                          // handler threads (ResourceQuota::SetMaxThreads)
  int64_t memory_quota_bytes = int64_t{4} << 30;  // gRPC's buffers (ResourceQuota::Resize)
  int handshake_timeout_ms = 10'000;              // a connection must finish its handshake within this
  int max_connection_idle_ms = 120'000;           // a connection without calls for this long is closed
  int keepalive_time_ms = 30'000;                 // the server pings an idle transport this often,
  int keepalive_timeout_ms = 10'000;              // and closes it when the ping is not answered
  // Calls that hold a handler thread, admitted before anything is read (src/transport/admission.h):
  // per learner id at once, and all learners together max_threads − 64 (threads left for joins,
  // heartbeats and status).
  int max_pushes_per_learner = 4;
  int max_polls_per_learner = 4;     // pulls, long polls included
  double max_heartbeats_per_s = 20;  // per learner (a learner sends 2)
  // A push stream still open after push_timeout_ms plus the time its announced payload takes at
  // min_link_mbps (≤ 0: no allowance) is cancelled.
  int push_timeout_ms = 120'000;
  double min_link_mbps = 10.0;
};

class GrpcListener;

// A standby's port (docs/decisions/022): bound from the start, so its address is known before it
// leads, but not listened on: a connection is refused as by a stopped process — a learner's call
// fails UNAVAILABLE at once and it asks the next candidate — until a server started with it
// listens. (Connections accepted and closed at once instead left TLS clients that had tried the
// held port unable to complete a handshake with the server later: the connection's refusal is
// what a client already recovers from.)
class HeldPort {
 public:
  // InvalidArgument for a malformed address, Unavailable when it cannot be bound.
  // `limits`: the server's to be (its connection cap).
  static StatusOr<std::shared_ptr<HeldPort>> Bind(const std::string& address, const ServerLimits& limits);
  ~HeldPort();
  int port() const { return port_; }
  // The listener, once (GrpcSyncerServer::Start); null after.
  std::unique_ptr<GrpcListener> Take();

 private:
  HeldPort() = default;
  std::unique_ptr<GrpcListener> listener_;
  int port_ = 0;
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
  // Test hooks: pull replies in chunks of this many bytes, and the first `cut_pulls` replies that
  // carry payload bytes end with UNAVAILABLE after `cut_after_chunks` data chunks (a broken stream).
  struct PullFault {
    size_t chunk_bytes = kMaxChunkBytes;
    int cut_pulls = 0;
    int cut_after_chunks = 1;
  };
  PullFault pull_fault;
  // Leadership (docs/decisions/022): every reply carries `epoch`; while `leading` (when set)
  // returns false, every call is refused UNAVAILABLE, checked when it arrives and again before its
  // reply is sent, so a syncer whose lease may have run out answers nothing.
  struct Fence {
    uint64_t epoch = 0;
    std::function<bool()> leading;
  };
  Fence fence;
  // Serve on this held port instead of binding `address` (it must not have been taken before).
  std::shared_ptr<HeldPort> held_port;
  // Replication to the shard's standbys (docs/decisions/023): the leader's commit log and the
  // state folder its files are read from. Without a log, Replicate is refused FAILED_PRECONDITION.
  struct Replication {
    std::shared_ptr<syncer::ReplicationLog> log;
    std::string state_dir;
  };
  Replication replication;
};

class GrpcSyncerServer {
 public:
  // Starts listening. `loop` must outlive the server. `on_finish` is called (on a gRPC thread)
  // when a Finish RPC arrives and must return the summary JSON text.
  static StatusOr<std::unique_ptr<GrpcSyncerServer>> Start(const ServerOptions& options, syncer::SyncerLoop& loop,
                                                           std::function<std::string(bool evaluate)> on_finish);
  virtual ~GrpcSyncerServer() = default;
  virtual int port() const = 0;
  // Connections closed at accept because ServerLimits::max_connections were open.
  virtual int64_t connections_refused() const = 0;
  virtual void Shutdown() = 0;
  // Blocks until Shutdown().
  virtual void Wait() = 0;
};

}  // namespace atl::transport
