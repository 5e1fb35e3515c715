// gRPC server of the atoll.v1 protocol around a SyncerLoop. Handler threads validate and
// reassemble messages, then hand them to the loop; they never touch syncer state themselves.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll.grpc.pb.h"
#include "atoll/core/checksum.h"
#include "atoll/core/text.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc.h"
#include "wire.h"

namespace atl::transport {
namespace {

using atl::v1::Syncer;

class Service final : public Syncer::Service {
 public:
  Service(syncer::SyncerLoop& loop, std::string token, ServerLimits limits,
          std::function<std::string(bool)> on_finish)
      : loop_(loop), token_(std::move(token)), limits_(limits), on_finish_(std::move(on_finish)) {}
  void UseCredentials(std::string secret, std::string run_id) {
    operator_token_ = OperatorToken(secret, run_id);
    secret_ = std::move(secret);
    run_id_ = std::move(run_id);
  }

  grpc::Status Join(grpc::ServerContext* ctx, const atl::v1::JoinRequest* req,
                    atl::v1::JoinReply* reply) override {
    if (auto st = CheckToken(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    syncer::JoinRequestData r;
    r.protocol_version = req->protocol_version();
    r.run_id = req->run_id();
    r.model_signature = req->model_signature();
    r.learner_id = req->learner_id();
    r.host = TruncateUtf8(req->host(), 256);  // never cut inside a UTF-8 character
    r.rejoin = req->rejoin();
    r.fragment_checksums.assign(req->fragment_checksums().begin(), req->fragment_checksums().end());
    // 0: a learner that does not say (unsharded); any other value is checked by the core.
    if (req->shard_count() != 0) r.shard = {req->shard_index(), req->shard_count()};
    auto out = loop_.Join(r);
    if (!out.ok()) return ToGrpc(out.status());
    FillJoinReply(*out, reply);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const atl::v1::HeartbeatRequest* req,
                         atl::v1::HeartbeatReply* reply) override {
    if (auto st = CheckToken(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    syncer::LearnerProgress p;
    p.step = req->step();
    p.tokens = req->tokens();
    p.loss = req->loss();
    p.step_seconds = req->step_seconds();
    p.tokens_per_second = req->tokens_per_second();
    auto state = syncer::ParseLearnerState(req->state());
    if (!state) return ToGrpc(InvalidArgumentError("heartbeat: unknown learner state (expected joining, training or done)"));
    p.state = *state;
    p.version_held = req->version_held();
    if (!std::isfinite(p.step_seconds) || p.step_seconds < 0 || p.step < 0 || p.tokens < 0 ||
        !std::isfinite(p.loss) || !std::isfinite(p.tokens_per_second)) {
      return ToGrpc(InvalidArgumentError("heartbeat: negative or non-finite progress values"));
    }
    auto out = loop_.Heartbeat(req->learner_id(), p);
    if (!out.ok()) return ToGrpc(out.status());
    for (int64_t v : out->versions) reply->add_fragment_versions(v);
    reply->set_finish(out->finish);
    reply->set_incarnation(out->incarnation);
    return grpc::Status::OK;
  }

  grpc::Status Push(grpc::ServerContext* ctx, grpc::ServerReader<atl::v1::PushChunk>* reader,
                    atl::v1::PushReply* reply) override {
    if (auto st = CheckToken(ctx, kAnyCaller); !st.ok()) return ToGrpc(st);
    atl::v1::PushChunk chunk;
    if (!reader->Read(&chunk) || chunk.kind_case() != atl::v1::PushChunk::kHeader) {
      return ToGrpc(InvalidArgumentError("push: the first message must be a header"));
    }
    auto header = ParsePushHeader(chunk.header());
    const int64_t header_bytes = static_cast<int64_t>(chunk.ByteSizeLong());
    if (!header.ok()) return ToGrpc(header.status());
    if (auto st = CheckToken(ctx, header->first.learner_id); !st.ok()) return ToGrpc(st);
    const int64_t total = chunk.header().payload_bytes();
    // Before any memory is reserved: a joined learner, the exact size, room in the budget.
    if (atl::Status st = CheckAnnounced(header->first, total); !st.ok()) return ToGrpc(st);
    InflightBudget budget(inflight_push_bytes_, total, limits_.max_inflight_push_bytes);
    if (!budget.ok()) {
      return Refuse(ResourceExhaustedError(fmt::format(
          "push: {} payload bytes would exceed the syncer's in-flight push budget of {} bytes; retry later",
          total, limits_.max_inflight_push_bytes)));
    }
    std::vector<std::byte> payload;
    if (atl::Status st = ReceivePayload(reader, total, payload); !st.ok()) return ToGrpc(st);
    if (Checksum64(payload) != header->second) {
      return ToGrpc(DataLossError("push: payload checksum mismatch"));
    }
    auto out = loop_.Push(header->first, payload);
    const int id = header->first.learner_id;
    const int64_t up = total + header_bytes;
    loop_.Call([id, up](syncer::SyncerCore& core, TimePoint) {
      core.CountBytes(id, up, 0);
      return 0;
    });
    if (!out.ok()) {
      if (out.status().code() != StatusCode::kAborted) {
        std::fprintf(stderr, "syncer: rejected %s\n", out.status().ToString().c_str());
      }
      return ToGrpc(out.status());
    }
    reply->set_round(out->round);
    reply->set_merged_version(out->merged_version);
    reply->set_note(out->note);
    reply->set_incarnation(out->incarnation);
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext* ctx, const atl::v1::PullRequest* req,
                    grpc::ServerWriter<atl::v1::PullChunk>* writer) override {
    if (auto st = CheckToken(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    if (!std::isfinite(req->wait_seconds()) || req->wait_seconds() < 0) {
      return ToGrpc(InvalidArgumentError("pull: wait_seconds must be a finite value ≥ 0"));
    }
    auto out = loop_.Pull(req->learner_id(), req->fragment(), req->have_version(), req->wait_seconds(),
                          req->want_version());
    if (!out.ok()) return ToGrpc(out.status());
    const int64_t sent = WritePull(*out, writer);
    const int id = req->learner_id();
    loop_.Call([id, sent](syncer::SyncerCore& core, TimePoint) {
      core.CountBytes(id, 0, sent);
      return 0;
    });
    return grpc::Status::OK;
  }

  grpc::Status Status(grpc::ServerContext* ctx, const atl::v1::StatusRequest*,
                      atl::v1::StatusReply* reply) override {
    if (auto st = CheckToken(ctx, kOperator); !st.ok()) return ToGrpc(st);
    try {
      reply->set_json(loop_.Call([](syncer::SyncerCore& core, TimePoint now) { return DumpJson(core.StatusJson(now)); }));
    } catch (const std::exception& e) {
      return ToGrpc(InternalError(std::string("status: ") + e.what()));
    }
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const atl::v1::LeaveRequest* req, atl::v1::LeaveReply*) override {
    if (auto st = CheckToken(ctx, req->learner_id()); !st.ok()) return ToGrpc(st);
    return ToGrpc(loop_.Leave(req->learner_id()));
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const atl::v1::FinishRequest* req,
                      atl::v1::FinishReply* reply) override {
    if (auto st = CheckToken(ctx, kOperator); !st.ok()) return ToGrpc(st);
    reply->set_summary_json(on_finish_ ? on_finish_(req->evaluate()) : "{}");
    return grpc::Status::OK;
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

  // The announced payload must be exactly what this learner's push of that fragment encodes to.
  atl::Status CheckAnnounced(const syncer::PushHeaderData& h, int64_t total) {
    StatusOr<size_t> expected = UnavailableError("syncer is shutting down");
    try {
      expected = loop_.Call([&h](syncer::SyncerCore& core, TimePoint now) { return core.ExpectedPushBytes(h, now); });
    } catch (const std::exception&) {  // the loop stopped under us (a broken promise)
    }
    if (!expected.ok()) return expected.status().WithContext("push");
    const bool exact = h.compression == diloco::Compression::kNone;
    if (exact ? total != static_cast<int64_t>(*expected) : total < 1 || total > static_cast<int64_t>(*expected)) {
      return InvalidArgumentError(fmt::format("push: header announces {} payload bytes, a push of fragment {} is {}{} bytes",
                                              total, h.fragment, exact ? "" : "1 to ", *expected));
    }
    return atl::Status::Ok();
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

  // Who may make a call: learner `id` (with its own token or the operator's), the operator only
  // (kOperator), or, before the learner id is known, anyone with a token (kAnyCaller). With a
  // shared token (no secret) every caller holds the same one. Constant-time comparisons.
  // (Sentinels outside the int32 range of ids on the wire.)
  static constexpr int64_t kOperator = int64_t{1} << 40, kAnyCaller = kOperator + 1;
  atl::Status CheckToken(grpc::ServerContext* ctx, int64_t id) const {
    if (token_.empty() && secret_.empty()) return atl::Status::Ok();
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenKey);
    if (it == md.end()) return UnauthenticatedError("missing auth token (metadata x-atoll-token)");
    const std::string_view got(it->second.data(), it->second.size());
    if (secret_.empty()) return TokensEqual(got, token_) ? atl::Status::Ok() : UnauthenticatedError("wrong auth token");
    if (TokensEqual(got, operator_token_) || id == kAnyCaller) return atl::Status::Ok();
    if (id == kOperator) return UnauthenticatedError("this call needs the operator's token");
    if (id < 0) return UnauthenticatedError("with per-learner credentials a learner joins with its own id, not -1");
    if (TokensEqual(got, LearnerToken(secret_, run_id_, static_cast<int>(id)))) return atl::Status::Ok();
    return UnauthenticatedError("wrong auth token for learner " + std::to_string(id));
  }

  syncer::SyncerLoop& loop_;
  std::string token_;
  std::string secret_, run_id_, operator_token_;  // per-learner credentials (secret_ non-empty)
  transport::ServerLimits limits_;
  std::atomic<int64_t> inflight_push_bytes_{0};
  std::function<std::string(bool)> on_finish_;
};

class ServerImpl final : public GrpcSyncerServer {
 public:
  int port() const override { return port_; }
  void Shutdown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  void Wait() override {
    if (server_) server_->Wait();
  }
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

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

}  // namespace

StatusOr<std::unique_ptr<GrpcSyncerServer>> GrpcSyncerServer::Start(
    const ServerOptions& options, syncer::SyncerLoop& loop,
    std::function<std::string(bool)> on_finish) {
  auto impl = std::make_unique<ServerImpl>();
  impl->service_ = std::make_unique<Service>(loop, options.token, options.limits, std::move(on_finish));
  if (!options.secret.empty()) {
    impl->service_->UseCredentials(options.secret,
                                   loop.Call([](syncer::SyncerCore& c, TimePoint) { return c.options().run_id; }));
  }
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (options.tls.enabled) {
    auto key = ReadPem(options.tls.key_file, "TLS key");
    if (!key.ok()) return key.status();
    auto cert = ReadPem(options.tls.cert_file, "TLS certificate");
    if (!cert.ok()) return cert.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls.client_ca_file.empty()) {  // mutual TLS: no certificate from this CA, no call
      auto client_ca = ReadPem(options.tls.client_ca_file, "TLS client CA");
      if (!client_ca.ok()) return client_ca.status();
      ssl.pem_root_certs = *client_ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, creds, &impl->port_);
  builder.RegisterService(impl->service_.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  ApplyLimits(options.limits, builder);
  impl->server_ = builder.BuildAndStart();
  if (!impl->server_ || impl->port_ == 0) {
    return UnavailableError("cannot listen on " + options.address + " (address in use or invalid?)");
  }
  return std::unique_ptr<GrpcSyncerServer>(std::move(impl));
}

}  // namespace atl::transport
