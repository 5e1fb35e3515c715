// gRPC server of the atoll.v1 protocol around a SyncerLoop. Handler threads validate and
// reassemble messages, then hand them to the loop; they never touch syncer state themselves.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll.grpc.pb.h"
#include "atoll/core/checksum.h"
#include "atoll/core/text.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc_server.h"
#include "admission.h"
#include "listener.h"
#include "wire.h"

namespace atl::transport {
namespace {

using atl::v1::Syncer;

class Service final : public Syncer::Service {
 public:
  Service(syncer::SyncerLoop& loop, std::string token, ServerLimits limits, std::function<std::string(bool)> on_finish)
      : loop_(loop),
        token_(std::move(token)),
        limits_(limits),
        on_finish_(std::move(on_finish)),
        admission_({limits.max_pushes_per_learner, limits.max_polls_per_learner, std::max(16, limits.max_threads - 64),
                    limits.max_heartbeats_per_s}) {}
  void UseCredentials(std::string secret, std::string run_id, LearnerIdSet allowed) {
    operator_token_ = OperatorToken(secret, run_id);
    secret_ = std::move(secret);
    run_id_ = std::move(run_id);
    allowed_ = std::move(allowed);
  }
  void UsePullFault(const ServerOptions::PullFault& f) { pull_fault_ = f; }
  void UseFence(ServerOptions::Fence f) { fence_ = std::move(f); }
  void UseReplication(ServerOptions::Replication r) { replication_ = std::move(r); }

  grpc::Status Join(grpc::ServerContext* ctx, const atl::v1::JoinRequest* req, atl::v1::JoinReply* reply) override {
    if (auto st = Enter(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    auto out = loop_.Join(ParseJoinRequest(*req));
    if (!out.ok()) return ToGrpc(out.status());
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    out->epoch = fence_.epoch;
    FillJoinReply(*out, reply);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const atl::v1::HeartbeatRequest* req,
                         atl::v1::HeartbeatReply* reply) override {
    if (auto st = Enter(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    if (auto st = admission_.Heartbeat(req->learner_id()); !st.ok()) return ToGrpc(st);
    auto p = ParseHeartbeat(*req);
    if (!p.ok()) return ToGrpc(p.status());
    auto out = loop_.Heartbeat(req->learner_id(), *p);
    if (!out.ok()) return ToGrpc(out.status());
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    out->epoch = fence_.epoch;
    FillHeartbeatReply(*out, reply);
    return grpc::Status::OK;
  }

  // A push is authenticated and admitted from its metadata before its first message is read
  // (a stream that never sends holds a thread); then its header, the announced size, the
  // payload. Invalid input from a joined learner counts toward its disconnect.
  grpc::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<atl::v1::PushChunk>* reader,
                    atl::v1::PushReply* reply) override {
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    auto who = PushCaller(ctx);
    if (!who.ok()) return ToGrpc(who.status());
    Admission::Slot slot = admission_.Enter(Admission::Kind::kPush, *who);
    if (!slot.status().ok()) return Refuse(slot.status());
    const auto opened = std::chrono::steady_clock::now();
    auto watch = deadlines_.Add(ctx, opened + std::chrono::milliseconds(limits_.push_timeout_ms));
    atl::v1::PushChunk chunk;
    if (!reader->Read(&chunk) || chunk.kind_case() != atl::v1::PushChunk::kHeader) {
      return ToGrpc(ctx->IsCancelled() ? DeadlineExceededError("push: no header before the push deadline")
                                       : InvalidArgumentError("push: the first message must be a header"));
    }
    if (chunk.header().learner_id() != *who) {
      return ToGrpc(UnauthenticatedError(
          fmt::format("push: the header names learner {}, the call learner {}", chunk.header().learner_id(), *who)));
    }
    auto header = ParsePushHeader(chunk.header());
    const int64_t header_bytes = static_cast<int64_t>(chunk.ByteSizeLong());
    if (!header.ok()) return Rejected(RawHeader(chunk.header()), header.status());
    const int64_t total = chunk.header().payload_bytes();
    // Before any memory is reserved: a joined learner, the exact size, room in the budget.
    if (atl::Status st = CheckAnnounced(header->first, total); !st.ok()) return Rejected(header->first, st);
    InflightBudget budget(inflight_push_bytes_, total, limits_.max_inflight_push_bytes);
    if (!budget.ok()) {
      return Refuse(ResourceExhaustedError(
          fmt::format("push: {} payload bytes would exceed the syncer's in-flight push budget of {} bytes; retry later",
                      total, limits_.max_inflight_push_bytes)));
    }
    // The announced size earns its time at the slowest link the run allows.
    watch.Move(opened +
               std::chrono::milliseconds(static_cast<int64_t>(
                   1000 * PayloadDeadlineSeconds(limits_.push_timeout_ms / 1000.0, total, limits_.min_link_mbps))));
    std::vector<std::byte> payload;
    if (atl::Status st = ReceivePayload(reader, total, payload); !st.ok()) return Rejected(header->first, st);
    if (Checksum64(payload) != header->second) {
      return Rejected(header->first, DataLossError("push: payload checksum mismatch"));
    }
    return Admit(header->first, payload, total + header_bytes, reply);
  }

  grpc::Status Pull(grpc::ServerContext* ctx, const atl::v1::PullRequest* req,
                    grpc::ServerWriter<atl::v1::PullChunk>* writer) override {
    if (auto st = Enter(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    Admission::Slot slot = admission_.Enter(Admission::Kind::kPull, req->learner_id());  // a long poll holds a thread
    if (!slot.status().ok()) return Refuse(slot.status());
    if (!std::isfinite(req->wait_seconds()) || req->wait_seconds() < 0) {
      return ToGrpc(InvalidArgumentError("pull: wait_seconds must be a finite value ≥ 0"));
    }
    auto shared = loop_.PullShared(req->learner_id(), req->fragment(), req->have_version(), req->wait_seconds(),
                                   req->want_version());
    if (!shared.ok()) return ToGrpc(shared.status());
    const syncer::PullPayload& out = **shared;  // shared with the syncer's cache and other learners' pulls
    const uint64_t checksum = Checksum64(out.bytes);
    auto from = ResumeOffset(*req, out, checksum);
    if (!from.ok()) return ToGrpc(from.status());
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    PullWrite w{*from, pull_fault_.chunk_bytes, -1, fence_.epoch};
    const bool cut = !out.bytes.empty() && pull_fault_.cut_pulls > 0 && pulls_cut_.fetch_add(1) < pull_fault_.cut_pulls;
    if (cut) w.max_chunks = pull_fault_.cut_after_chunks;
    const int64_t sent = WritePull(out, checksum, w, writer);
    const int id = req->learner_id();
    loop_.Call([id, sent](syncer::SyncerCore& core, TimePoint) {
      core.CountBytes(id, 0, sent);
      return 0;
    });
    if (cut) return ToGrpc(UnavailableError("pull: the stream was cut (test hook)"));
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext* ctx, const atl::v1::StatusRequest*, atl::v1::StatusReply* reply) override {
    if (auto st = CheckToken(ctx, kOperator); !st.ok()) return ToGrpc(st);
    try {
      reply->set_json(
          loop_.Call([](syncer::SyncerCore& core, TimePoint now) { return DumpJson(core.StatusJson(now)); }));
    } catch (const std::exception& e) {
      return ToGrpc(InternalError(std::string("status: ") + e.what()));
    }
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const atl::v1::LeaveRequest* req, atl::v1::LeaveReply*) override {
    if (auto st = Enter(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    return ToGrpc(loop_.Leave(req->learner_id()));
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const atl::v1::FinishRequest* req,
                      atl::v1::FinishReply* reply) override {
    if (auto st = Enter(ctx, kOperator); !st.ok()) return ToGrpc(st);
    reply->set_summary_json(on_finish_ ? on_finish_(req->evaluate()) : "{}");
    return grpc::Status::OK;
  }

  // A standby follows the commits (docs/decisions/023): operator credentials; its ask waits (≤ 10 s)
  // for a commit it lacks, holding one thread per standby.
  grpc::Status Replicate(grpc::ServerContext* ctx, const atl::v1::ReplicateRequest* req,
                         grpc::ServerWriter<atl::v1::ReplicateChunk>* writer) override {
    if (auto st = Enter(ctx, kOperator); !st.ok()) return ToGrpc(st);
    if (replication_.log == nullptr) {
      return ToGrpc(FailedPreconditionError(
          "replicate: this syncer keeps no replication log (it leads without --etcd, or with --replicas 0)"));
    }
    auto batch =
        replication_.log->Follow({req->candidate_id(), req->leader_epoch(), req->applied_seq(), req->wait_seconds()});
    if (!batch.ok()) return ToGrpc(batch.status());
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    auto sent = WriteReplicate(*batch, replication_.state_dir, writer);
    return sent.ok() ? grpc::Status::OK : ToGrpc(sent.status());
  }

 private:
  // Reserves `n` bytes of a shared budget for as long as it lives, or nothing (ok() false).
  class InflightBudget {
   public:
    InflightBudget(std::atomic<int64_t>& used, int64_t n, int64_t limit) : used_(used) {
      int64_t cur = used_.load();
      do {
        if (cur + n > limit) return;
      } while (!used_.compare_exchange_weak(cur, cur + n));
      n_ = n;
      ok_ = true;
    }
    ~InflightBudget() {
      if (ok_) used_ -= n_;
    }
    InflightBudget(const InflightBudget&) = delete;
    InflightBudget& operator=(const InflightBudget&) = delete;
    bool ok() const { return ok_; }

   private:
    std::atomic<int64_t>& used_;
    int64_t n_ = 0;
    bool ok_ = false;
  };

  static grpc::Status Refuse(const atl::Status& st) {
    std::fprintf(stderr, "syncer: refused %s\n", st.ToString().c_str());
    return ToGrpc(st);
  }

  // The learner a push names in its metadata, authenticated: its token must be that learner's
  // (or the operator's) before anything of the stream is read.
  StatusOr<int64_t> PushCaller(grpc::ServerContext* ctx) const {
    const auto& md = ctx->client_metadata();
    auto it = md.find(kLearnerKey);
    const std::string text = it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError(std::string("push: the call must name its learner id in metadata ") + kLearnerKey);
    }
    const int64_t id = std::stoll(text);
    ATOLL_RETURN_IF_ERROR(CheckToken(ctx, id));
    return id;
  }

  // What is known of a header that did not parse, for the disconnect count.
  static syncer::PushHeaderData RawHeader(const atl::v1::PushHeader& h) {
    syncer::PushHeaderData d;
    d.learner_id = h.learner_id();
    d.fragment = h.fragment();
    d.push_session = h.push_session();
    d.push_seq = h.push_seq();
    return d;
  }

  // A push refused before it reached the core: the reason, counted toward the learner's
  // disconnect when it is the learner's fault (malformed, wrong size, corrupted) — not when the
  // learner is unknown, banned, routed to the wrong shard or its stream was cut. A replay is
  // counted as one (never toward the disconnect: SyncerCore::RecordRejectedPush).
  grpc::Status Rejected(const syncer::PushHeaderData& h, const atl::Status& st) {
    const bool counts = st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kAlreadyExists ||
                        (st.code() == StatusCode::kDataLoss && st.message().find("checksum") != std::string::npos);
    if (!counts) return ToGrpc(st);
    atl::Status counted = st;
    try {
      counted =
          loop_.Call([&](syncer::SyncerCore& core, TimePoint now) { return core.RecordRejectedPush(h, st, now); });
      if (counted.code() == StatusCode::kNotFound) counted = st;  // a stranger: nothing to count
    } catch (const std::exception&) {                             // the loop stopped under us (a broken promise)
    }
    std::fprintf(stderr, "syncer: rejected %s\n", counted.ToString().c_str());
    return ToGrpc(counted);
  }

  // Hands a received push to the loop and answers with the round it joined.
  grpc::Status Admit(syncer::PushHeaderData h, const std::vector<std::byte>& payload, int64_t up,
                     atl::v1::PushReply* reply) {
    h.wire_bytes = up;  // counted by the call that admits it
    auto out = loop_.Push(h, payload);
    if (!out.ok()) {
      if (out.status().code() != StatusCode::kAborted) {
        std::fprintf(stderr, "syncer: rejected %s\n", out.status().ToString().c_str());
      }
      return ToGrpc(out.status());
    }
    if (auto st = Fenced(); !st.ok()) return ToGrpc(st);
    out->epoch = fence_.epoch;
    FillPushReply(*out, reply);
    return grpc::Status::OK;
  }

  // The announced payload must be exactly what this learner's push of that fragment encodes to:
  // the core's one admission check, before any memory is reserved for it.
  atl::Status CheckAnnounced(const syncer::PushHeaderData& h, int64_t total) {
    if (total < 0) return InvalidArgumentError("push: a negative payload size");
    atl::Status st = UnavailableError("syncer is shutting down");
    try {
      st = loop_.Call([&h, total](syncer::SyncerCore& core, TimePoint now) {
        return core.CheckPush(h, static_cast<size_t>(total), now);
      });
    } catch (const std::exception&) {  // the loop stopped under us (a broken promise)
    }
    return st.WithContext("push");
  }

  static atl::Status ReceivePayload(grpc::ServerReader<atl::v1::PushChunk>* reader, int64_t total,
                                    std::vector<std::byte>& payload) {
    payload.reserve(static_cast<size_t>(total));
    atl::v1::PushChunk chunk;
    while (reader->Read(&chunk)) {
      if (chunk.kind_case() != atl::v1::PushChunk::kData) {
        return InvalidArgumentError("push: a second header inside one push");
      }
      ATOLL_RETURN_IF_ERROR(AppendChunk(chunk.data(), total, payload).WithContext("push"));
    }
    if (static_cast<int64_t>(payload.size()) != total) {
      return DataLossError("push: stream ended after " + std::to_string(payload.size()) + " of " +
                           std::to_string(total) + " payload bytes (truncated)");
    }
    return atl::Status::Ok();
  }

  // Who may make a call: learner `id` (with its own token, if it is an allowed id, or the
  // operator's), or the operator only (kOperator, a sentinel outside the int32 range of ids on
  // the wire). With a shared token (no secret) every caller holds the same one. Constant-time
  // comparisons.
  static constexpr int64_t kOperator = int64_t{1} << 40;

  // UNAVAILABLE while this syncer does not surely hold its shard's leadership (ServerOptions::Fence):
  // the learner asks the next candidate.
  atl::Status Fenced() const {
    if (!fence_.leading || fence_.leading()) return atl::Status::Ok();
    return UnavailableError(fmt::format(
        "this syncer does not lead its shard (its leadership of epoch {} lapsed or has not begun): ask another "
        "candidate",
        fence_.epoch));
  }
  // A call's first check: leadership, then the caller's credentials.
  atl::Status Enter(grpc::ServerContext* ctx, int64_t id) const {
    ATOLL_RETURN_IF_ERROR(Fenced());
    return CheckToken(ctx, id);
  }

  atl::Status CheckToken(grpc::ServerContext* ctx, int64_t id) const {
    if (token_.empty() && secret_.empty()) return atl::Status::Ok();
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenKey);
    if (it == md.end()) return UnauthenticatedError("missing auth token (metadata x-atoll-token)");
    const std::string_view got(it->second.data(), it->second.size());
    if (secret_.empty()) return TokensEqual(got, token_) ? atl::Status::Ok() : UnauthenticatedError("wrong auth token");
    if (TokensEqual(got, operator_token_)) return atl::Status::Ok();
    if (id == kOperator) return UnauthenticatedError("this call needs the operator's token");
    if (id < 0) return UnauthenticatedError("with per-learner credentials a learner joins with its own id, not -1");
    if (!TokensEqual(got, LearnerToken(secret_, run_id_, static_cast<int>(id)))) {
      return UnauthenticatedError("wrong auth token for learner " + std::to_string(id));
    }
    if (!allowed_.Contains(id)) {
      return PermissionDeniedError("learner " + std::to_string(id) + " is not among this run's allowed learners (" +
                                   allowed_.ToString() + ")");
    }
    return atl::Status::Ok();
  }

  syncer::SyncerLoop& loop_;
  std::string token_;
  std::string secret_, run_id_, operator_token_;  // per-learner credentials (secret_ non-empty)
  LearnerIdSet allowed_;                          // with a secret: whose tokens are accepted
  transport::ServerLimits limits_;
  std::atomic<int64_t> inflight_push_bytes_{0};
  std::function<std::string(bool)> on_finish_;
  Admission admission_;
  PushDeadlines deadlines_;
  ServerOptions::PullFault pull_fault_;
  ServerOptions::Fence fence_;
  ServerOptions::Replication replication_;
  std::atomic<int> pulls_cut_{0};
};

class ServerImpl final : public GrpcSyncerServer {
 public:
  int port() const override { return port_; }
  void Shutdown() override {
    if (listener_) listener_->Stop();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  void Wait() override {
    if (server_) server_->Wait();
  }
  int64_t connections_refused() const override { return listener_ ? listener_->refused() : 0; }
  std::unique_ptr<Service> service_;
  std::unique_ptr<GrpcListener> listener_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// The connection cap: `limits.max_connections`, and never more than the process's descriptor
// limit leaves once kFdHeadroom descriptors are kept for everything else (state files, the HTTP
// endpoint, gRPC's own).
int EffectiveMaxConnections(const ServerLimits& l) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return l.max_connections;
  const int64_t room = static_cast<int64_t>(r.rlim_cur) - kFdHeadroom;
  return static_cast<int>(std::clamp<int64_t>(room, 16, l.max_connections));
}

// gRPC's own protections: idle, half-open and slow-handshake connections are closed, streams
// per connection and handler threads are bounded, and its buffers live within a memory quota.
void ApplyLimits(const ServerLimits& l, grpc::ServerBuilder& builder) {
  grpc::ResourceQuota quota("atoll-syncer");
  quota.Resize(static_cast<size_t>(l.memory_quota_bytes));
  quota.SetMaxThreads(l.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, l.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, l.handshake_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, l.max_connection_idle_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, l.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, l.keepalive_timeout_ms);
}

// The port's credentials: TLS (and mutual TLS) from the PEM files, else insecure.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> CredentialsOf(const TlsOptions& tls) {
  if (!tls.enabled) return grpc::InsecureServerCredentials();
  auto key = ReadPem(tls.key_file, "TLS key");
  if (!key.ok()) return key.status();
  auto cert = ReadPem(tls.cert_file, "TLS certificate");
  if (!cert.ok()) return cert.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {  // mutual TLS: no certificate from this CA, no call
    auto client_ca = ReadPem(tls.client_ca_file, "TLS client CA");
    if (!client_ca.ok()) return client_ca.status();
    ssl.pem_root_certs = *client_ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

StatusOr<std::unique_ptr<GrpcSyncerServer>> GrpcSyncerServer::Start(const ServerOptions& options,
                                                                    syncer::SyncerLoop& loop,
                                                                    std::function<std::string(bool)> on_finish) {
  auto impl = std::make_unique<ServerImpl>();
  impl->service_ = std::make_unique<Service>(loop, options.token, options.limits, std::move(on_finish));
  if (options.pull_fault.chunk_bytes == 0 || options.pull_fault.chunk_bytes > kMaxChunkBytes) {
    return InvalidArgumentError("pull_fault.chunk_bytes must be in [1, 1 MiB]");
  }
  impl->service_->UsePullFault(options.pull_fault);
  impl->service_->UseFence(options.fence);
  impl->service_->UseReplication(options.replication);
  ATOLL_ASSIGN_OR_RETURN(LearnerIdSet allowed, LearnerIdSet::Parse(options.allowed_learners));
  if (!allowed.any() && options.secret.empty()) {
    return InvalidArgumentError(
        "allowed_learners needs per-learner credentials (a secret): a shared token is every learner's");
  }
  if (!options.secret.empty()) {
    impl->service_->UseCredentials(options.secret,
                                   loop.Call([](syncer::SyncerCore& c, TimePoint) { return c.options().run_id; }),
                                   std::move(allowed));
  }
  ATOLL_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, CredentialsOf(options.tls));
  // The port is atoll's own (listener.h): gRPC gets each accepted connection through an external
  // acceptor with the same credentials, and the number of connections stays bounded.
  if (options.limits.max_connections < 1) return InvalidArgumentError("max_connections must be ≥ 1");
  const bool held = options.held_port != nullptr;
  if (held) {
    impl->listener_ = options.held_port->Take();
    if (impl->listener_ == nullptr) return FailedPreconditionError("the held port was already taken by a server");
  } else {
    ATOLL_ASSIGN_OR_RETURN(impl->listener_,
                           GrpcListener::Bind(options.address, EffectiveMaxConnections(options.limits)));
  }
  impl->port_ = impl->listener_->port();
  grpc::ServerBuilder builder;
  auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
  builder.RegisterService(impl->service_.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  ApplyLimits(options.limits, builder);
  impl->server_ = builder.BuildAndStart();
  if (!impl->server_) return UnavailableError("cannot start the gRPC server for " + options.address);
  if (Status st = impl->listener_->Listen(); !st.ok()) return st;  // a held port listens from now
  impl->listener_->Start(std::move(acceptor));
  return std::unique_ptr<GrpcSyncerServer>(std::move(impl));
}

StatusOr<std::shared_ptr<HeldPort>> HeldPort::Bind(const std::string& address, const ServerLimits& limits) {
  std::shared_ptr<HeldPort> held(new HeldPort());
  ATOLL_ASSIGN_OR_RETURN(held->listener_,
                         GrpcListener::Bind(address, EffectiveMaxConnections(limits), /*listen=*/false));
  held->port_ = held->listener_->port();
  return held;
}

HeldPort::~HeldPort() = default;

std::unique_ptr<GrpcListener> HeldPort::Take() { return std::move(listener_); }

}  // namespace atl::transport
