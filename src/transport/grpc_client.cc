// The learner's side of the atoll.v1 protocol over gRPC.
#include <grpcpp/grpcpp.h>

#include <mutex>

#include "atoll.grpc.pb.h"
#include "atoll/core/checksum.h"
#include "atoll/transport/grpc_client.h"
#include "wire.h"

namespace atl::transport {

double PayloadDeadlineSeconds(double base_s, int64_t bytes, double mbps) {
  if (!(mbps > 0) || bytes <= 0) return base_s;
  return base_s + static_cast<double>(bytes) * 8.0 / (mbps * 1e6);
}

struct GrpcSyncerClient::Impl {
  ClientOptions options;
  std::atomic<int64_t> largest_pull_bytes{0};  // from the join: the largest fragment in fp32
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  std::mutex mu;
  std::shared_ptr<atl::v1::Syncer::Stub> stub;  // guarded by mu; replaced by Renew
  // A call failed UNAVAILABLE since the last join: the next join opens a new channel. A TLS
  // channel whose server went away (killed, restarted, or a standby that took over its role, on the
  // same or another address) kept failing its handshakes with the server back up for 20 s to minutes
  // on this machine; a new channel connects at once.
  std::atomic<bool> broken{false};
  std::atomic<int64_t> channels{0};
  std::mutex replicate_mu;
  grpc::ClientContext* replicate_ctx = nullptr;  // guarded by replicate_mu: the call in progress
  bool replicate_cancelled = false;              // guarded by replicate_mu

  std::shared_ptr<atl::v1::Syncer::Stub> Stub() {
    std::lock_guard<std::mutex> lock(mu);
    return stub;
  }
  void Renew() {
    auto fresh = std::shared_ptr<atl::v1::Syncer::Stub>(
        atl::v1::Syncer::NewStub(grpc::CreateCustomChannel(options.target, creds, args)));
    std::lock_guard<std::mutex> lock(mu);
    stub = std::move(fresh);
    ++channels;
  }
  grpc::Status Noted(grpc::Status st) {
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) broken = true;
    return st;
  }

  void Prepare(grpc::ClientContext& ctx, double seconds) const {
    if (!options.token.empty()) ctx.AddMetadata(kTokenKey, options.token);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  }
};

GrpcSyncerClient::GrpcSyncerClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcSyncerClient::~GrpcSyncerClient() = default;

StatusOr<std::unique_ptr<GrpcSyncerClient>> GrpcSyncerClient::Connect(const ClientOptions& options) {
  if (options.target.empty()) return InvalidArgumentError("syncer address is empty (want host:port)");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(4 << 20);
  // Reconnect quickly after a syncer restart (the default backoff grows to 120 s): attempts
  // start 200 ms apart, growing to 2 s. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is not a backoff: gRPC
  // uses it as the minimum time one attempt (TCP connect + TLS handshake) may take. At 200 ms a
  // single lost SYN or handshake packet (retransmitted after 1 s) aborts the attempt, and on a
  // lossy WAN link a learner could fail every attempt for tens of seconds (found with
  // scripts/netbed at 3 % loss). 5 s lets TCP retransmit a lost SYN twice (1 s, 3 s) within one
  // attempt, and is short enough that a learner whose link comes back after a partition is
  // connected again within a few seconds. A refused connection still fails at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  if (options.tls.enabled) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls.ca_file.empty()) {
      auto ca = ReadPem(options.tls.ca_file, "TLS CA");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    if (!options.tls.cert_file.empty() || !options.tls.key_file.empty()) {  // mutual TLS
      auto cert = ReadPem(options.tls.cert_file, "TLS client certificate");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(options.tls.key_file, "TLS client key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    if (!options.tls.server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls.server_name);
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  impl->creds = creds;
  impl->args = args;
  impl->Renew();
  return std::unique_ptr<GrpcSyncerClient>(new GrpcSyncerClient(std::move(impl)));
}

int64_t GrpcSyncerClient::channels_opened() const { return impl_->channels.load(); }

StatusOr<syncer::JoinReplyData> GrpcSyncerClient::Join(const syncer::JoinRequestData& r) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.call_timeout_s);
  atl::v1::JoinRequest req;
  FillJoinRequest(r, &req);
  atl::v1::JoinReply reply;
  if (impl_->broken.exchange(false)) impl_->Renew();
  grpc::Status st = impl_->Noted(impl_->Stub()->Join(&ctx, req, &reply));
  bytes_sent_ += static_cast<int64_t>(req.ByteSizeLong());
  if (!st.ok()) return FromGrpc(st, "join");
  bytes_received_ += static_cast<int64_t>(reply.ByteSizeLong());
  for (int64_t n : reply.fragment_numel()) {
    if (n * 4 > impl_->largest_pull_bytes.load()) impl_->largest_pull_bytes = n * 4;
  }
  return ParseJoinReply(reply);
}

Status GrpcSyncerClient::Leave(int learner_id) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.call_timeout_s);
  atl::v1::LeaveRequest req;
  req.set_learner_id(learner_id);
  atl::v1::LeaveReply reply;
  grpc::Status st = impl_->Noted(impl_->Stub()->Leave(&ctx, req, &reply));
  bytes_sent_ += static_cast<int64_t>(req.ByteSizeLong());
  if (!st.ok()) return FromGrpc(st, "leave");
  return Status::Ok();
}

StatusOr<syncer::HeartbeatReplyData> GrpcSyncerClient::Heartbeat(int learner_id, const syncer::LearnerProgress& p) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.call_timeout_s);
  atl::v1::HeartbeatRequest req;
  FillHeartbeat(learner_id, p, &req);
  atl::v1::HeartbeatReply reply;
  grpc::Status st = impl_->Noted(impl_->Stub()->Heartbeat(&ctx, req, &reply));
  bytes_sent_ += static_cast<int64_t>(req.ByteSizeLong());
  if (!st.ok()) return FromGrpc(st, "heartbeat");
  bytes_received_ += static_cast<int64_t>(reply.ByteSizeLong());
  return ParseHeartbeatReply(reply);
}

StatusOr<syncer::PushResult> GrpcSyncerClient::Push(const syncer::PushHeaderData& header,
                                                    std::span<const std::byte> payload) {
  return PushWithFault(header, payload, PushFault{});
}

StatusOr<syncer::PushResult> GrpcSyncerClient::PushWithFault(const syncer::PushHeaderData& header,
                                                             std::span<const std::byte> payload,
                                                             const PushFault& fault) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, PayloadDeadlineSeconds(impl_->options.push_timeout_s, static_cast<int64_t>(payload.size()),
                                             impl_->options.min_link_mbps));
  ctx.AddMetadata(kLearnerKey, std::to_string(header.learner_id));  // checked before the header is read
  atl::v1::PushReply reply;
  auto stub = impl_->Stub();
  auto writer = stub->Push(&ctx, &reply);
  atl::v1::PushChunk msg;
  FillPushHeader(header, static_cast<int64_t>(payload.size()), Checksum64(payload), msg.mutable_header());
  bool ok = writer->Write(msg);
  int64_t sent = static_cast<int64_t>(msg.ByteSizeLong());
  const size_t chunk = std::clamp<size_t>(fault.chunk_bytes, 1, kMaxChunkBytes * 2);
  int index = 0;
  for (size_t off = 0; ok && off < payload.size(); off += chunk, ++index) {
    if (fault.truncate_after_chunks >= 0 && index >= fault.truncate_after_chunks) break;
    const size_t n = std::min(chunk, payload.size() - off);
    atl::v1::PushChunk c;
    auto* d = c.mutable_data();
    d->set_offset(static_cast<int64_t>(off));
    d->set_data(reinterpret_cast<const char*>(payload.data() + off), n);
    uint64_t sum = Checksum64(payload.data() + off, n);
    if (index == fault.corrupt_chunk) sum ^= 1;
    d->set_checksum(sum);
    ok = writer->Write(c);
    sent += static_cast<int64_t>(n);
  }
  writer->WritesDone();
  grpc::Status st = impl_->Noted(writer->Finish());
  bytes_sent_ += sent;
  if (!st.ok()) return FromGrpc(st, "push");
  bytes_received_ += static_cast<int64_t>(reply.ByteSizeLong());
  return ParsePushReply(reply);
}

namespace {

// A pull stream that ended this way may have broken on the way (a lost connection, a deadline the
// link could not meet, a cancelled or aborted stream): worth resuming where part of it arrived.
bool BrokenStream(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED: return true;
    default: return false;
  }
}

}  // namespace

StatusOr<syncer::PullPayload> GrpcSyncerClient::Pull(int learner_id, int fragment, int64_t have_version,
                                                     double wait_seconds, int64_t want_version) {
  atl::v1::PullRequest req;
  req.set_learner_id(learner_id);
  req.set_fragment(fragment);
  req.set_have_version(have_version);
  req.set_wait_seconds(wait_seconds);
  req.set_want_version(want_version);
  // No payload of this run is larger than a full copy of its largest fragment: about 4 bytes a
  // value, and a little more once compressed (before the join: 1 MiB).
  PullAssembler reply(2 * impl_->largest_pull_bytes.load() + (int64_t{1} << 20));
  const std::string what = "pull of fragment " + std::to_string(fragment);
  for (int attempt = 0;; ++attempt) {
    // The first stream may carry a full copy; a resumed one what is still missing.
    const int64_t payload = attempt == 0 ? impl_->largest_pull_bytes.load() : reply.missing_bytes();
    grpc::ClientContext ctx;
    impl_->Prepare(ctx, wait_seconds + PayloadDeadlineSeconds(impl_->options.push_timeout_s, payload,
                                                              impl_->options.min_link_mbps));
    auto stub = impl_->Stub();
    auto reader = stub->Pull(&ctx, req);
    bytes_sent_ += static_cast<int64_t>(req.ByteSizeLong());
    atl::v1::PullChunk msg;
    while (reader->Read(&msg)) {
      bytes_received_ += static_cast<int64_t>(msg.ByteSizeLong());
      if (Status bad = reply.Add(msg); !bad.ok()) {
        ctx.TryCancel();
        reader->Finish();
        return bad.WithContext(what);
      }
    }
    grpc::Status st = impl_->Noted(reader->Finish());
    if (st.ok()) break;
    if (!BrokenStream(st) || !reply.Resumable() || attempt >= impl_->options.pull_resumes) return FromGrpc(st, what);
    reply.Resume(req);  // the next stream continues after the bytes held
    ++pulls_resumed_;
  }
  auto out = std::move(reply).Finish();
  if (!out.ok()) return out.status().WithContext(what);
  return out;
}

StatusOr<std::string> GrpcSyncerClient::StatusJson() {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, impl_->options.call_timeout_s);
  atl::v1::StatusReply reply;
  grpc::Status st = impl_->Stub()->Status(&ctx, atl::v1::StatusRequest(), &reply);
  if (!st.ok()) return FromGrpc(st, "status");
  return reply.json();
}

StatusOr<std::string> GrpcSyncerClient::Finish(bool evaluate) {
  grpc::ClientContext ctx;
  impl_->Prepare(ctx, 600);
  atl::v1::FinishRequest req;
  req.set_evaluate(evaluate);
  atl::v1::FinishReply reply;
  grpc::Status st = impl_->Stub()->Finish(&ctx, req, &reply);
  if (!st.ok()) return FromGrpc(st, "finish");
  return reply.summary_json();
}

StatusOr<syncer::ReplicateBatch> GrpcSyncerClient::Replicate(const syncer::ReplicateAsk& ask,
                                                             const ReplicaFileSink& on_file) {
  grpc::ClientContext ctx;
  // A snapshot's size is not known before its header: the push deadline ten times over (10 min by
  // default) bounds it.
  impl_->Prepare(ctx, ask.wait_seconds + 10 * impl_->options.push_timeout_s);
  atl::v1::ReplicateRequest req;
  req.set_candidate_id(ask.candidate);
  req.set_leader_epoch(ask.epoch);
  req.set_applied_seq(ask.applied_seq);
  req.set_wait_seconds(ask.wait_seconds);
  if (impl_->broken.exchange(false)) impl_->Renew();
  {
    std::lock_guard<std::mutex> lock(impl_->replicate_mu);
    if (impl_->replicate_cancelled) return CancelledError("replicate: cancelled");
    impl_->replicate_ctx = &ctx;
  }
  struct Clear {
    Impl& impl;
    ~Clear() {
      std::lock_guard<std::mutex> lock(impl.replicate_mu);
      impl.replicate_ctx = nullptr;
    }
  } clear{*impl_};
  auto reader = impl_->Stub()->Replicate(&ctx, req);
  bool ended = false;
  auto out = ReadReplicate(reader.get(), on_file, ended);
  if (!out.ok()) {  // the server's own error (refused, fenced) when it sent one, else what was wrong
    if (!ended) ctx.TryCancel();
    grpc::Status st = impl_->Noted(reader->Finish());
    if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) return FromGrpc(st, "replicate");
    return out.status();
  }
  grpc::Status st = impl_->Noted(reader->Finish());
  if (!st.ok()) return FromGrpc(st, "replicate");
  return out;
}

void GrpcSyncerClient::CancelReplicate() {
  std::lock_guard<std::mutex> lock(impl_->replicate_mu);
  impl_->replicate_cancelled = true;
  if (impl_->replicate_ctx != nullptr) impl_->replicate_ctx->TryCancel();
}

}  // namespace atl::transport
