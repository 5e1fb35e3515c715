// gRPC server of the atoll.v1 protocol around a SyncerLoop. Handler threads validate and
// reassemble messages, then hand them to the loop; they never touch syncer state themselves.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "atoll.grpc.pb.h"
#include "atoll/core/checksum.h"
#include "atoll/core/text.h"
#include "atoll/transport/grpc.h"
#include "wire.h"

namespace atl::transport {
namespace {

using atl::v1::Syncer;

class Service final : public Syncer::Service {
 public:
  Service(syncer::SyncerLoop& loop, std::string token, std::function<std::string(bool)> on_finish)
      : loop_(loop), token_(std::move(token)), on_finish_(std::move(on_finish)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const atl::v1::JoinRequest* req,
                    atl::v1::JoinReply* reply) override {
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    syncer::JoinRequestData r;
    r.protocol_version = req->protocol_version();
    r.run_id = req->run_id();
    r.model_signature = req->model_signature();
    r.learner_id = req->learner_id();
    r.host = TruncateUtf8(req->host(), 256);  // never cut inside a UTF-8 character
    r.rejoin = req->rejoin();
    auto out = loop_.Join(r);
    if (!out.ok()) return ToGrpc(out.status());
    FillJoinReply(*out, reply);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* ctx, const atl::v1::HeartbeatRequest* req,
                         atl::v1::HeartbeatReply* reply) override {
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
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
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    atl::v1::PushChunk chunk;
    if (!reader->Read(&chunk) || chunk.kind_case() != atl::v1::PushChunk::kHeader) {
      return ToGrpc(InvalidArgumentError("push: the first message must be a header"));
    }
    auto header = ParsePushHeader(chunk.header());
    const int64_t header_bytes = static_cast<int64_t>(chunk.ByteSizeLong());
    if (!header.ok()) return ToGrpc(header.status());
    const int64_t total = chunk.header().payload_bytes();
    std::vector<std::byte> payload;
    payload.reserve(static_cast<size_t>(total));
    while (reader->Read(&chunk)) {
      if (chunk.kind_case() != atl::v1::PushChunk::kData) {
        return ToGrpc(InvalidArgumentError("push: a second header inside one push"));
      }
      atl::Status st = AppendChunk(chunk.data(), total, payload);
      if (!st.ok()) return ToGrpc(st.WithContext("push"));
    }
    if (static_cast<int64_t>(payload.size()) != total) {
      return ToGrpc(DataLossError("push: stream ended after " + std::to_string(payload.size()) +
                                  " of " + std::to_string(total) + " payload bytes (truncated)"));
    }
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
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext* ctx, const atl::v1::PullRequest* req,
                    grpc::ServerWriter<atl::v1::PullChunk>* writer) override {
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    if (!std::isfinite(req->wait_seconds()) || req->wait_seconds() < 0) {
      return ToGrpc(InvalidArgumentError("pull: wait_seconds must be a finite value ≥ 0"));
    }
    auto out = loop_.Pull(req->learner_id(), req->fragment(), req->have_version(), req->wait_seconds());
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
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    try {
      reply->set_json(loop_.Call([](syncer::SyncerCore& core, TimePoint now) { return DumpJson(core.StatusJson(now)); }));
    } catch (const std::exception& e) {
      return ToGrpc(InternalError(std::string("status: ") + e.what()));
    }
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext* ctx, const atl::v1::LeaveRequest* req, atl::v1::LeaveReply*) override {
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    return ToGrpc(loop_.Leave(req->learner_id()));
  }

  grpc::Status Finish(grpc::ServerContext* ctx, const atl::v1::FinishRequest* req,
                      atl::v1::FinishReply* reply) override {
    if (auto st = CheckToken(ctx); !st.ok()) return ToGrpc(st);
    reply->set_summary_json(on_finish_ ? on_finish_(req->evaluate()) : "{}");
    return grpc::Status::OK;
  }

 private:
  atl::Status CheckToken(grpc::ServerContext* ctx) const {
    if (token_.empty()) return atl::Status::Ok();
    const auto& md = ctx->client_metadata();
    auto it = md.find(kTokenKey);
    if (it == md.end()) return UnauthenticatedError("missing auth token (metadata x-atoll-token)");
    if (std::string(it->second.data(), it->second.size()) != token_) {
      return UnauthenticatedError("wrong auth token");
    }
    return atl::Status::Ok();
  }

  syncer::SyncerLoop& loop_;
  std::string token_;
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

}  // namespace

StatusOr<std::unique_ptr<GrpcSyncerServer>> GrpcSyncerServer::Start(
    const ServerOptions& options, syncer::SyncerLoop& loop,
    std::function<std::string(bool)> on_finish) {
  auto impl = std::make_unique<ServerImpl>();
  impl->service_ = std::make_unique<Service>(loop, options.token, std::move(on_finish));
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (options.tls.enabled) {
    auto key = ReadPem(options.tls.key_file, "TLS key");
    if (!key.ok()) return key.status();
    auto cert = ReadPem(options.tls.cert_file, "TLS certificate");
    if (!cert.ok()) return cert.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.address, creds, &impl->port_);
  builder.RegisterService(impl->service_.get());
  builder.SetMaxReceiveMessageSize(4 << 20);
  impl->server_ = builder.BuildAndStart();
  if (!impl->server_ || impl->port_ == 0) {
    return UnavailableError("cannot listen on " + options.address + " (address in use or invalid?)");
  }
  return std::unique_ptr<GrpcSyncerServer>(std::move(impl));
}

}  // namespace atl::transport
