#include "atoll/coord/etcd_client.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "atoll/core/text.h"
#include "etcd_v3.grpc.pb.h"
#include "keepalive_stream.h"

namespace atl::coord {

namespace pb = etcdserverpb;
using SysClock = std::chrono::system_clock;

namespace {

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// `host:port` with a port in 1..65535 (the host may be an IPv6 literal in brackets).
bool ValidHostPort(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const int p = std::stoi(port);
  const std::string host = s.substr(0, colon);
  return p >= 1 && p <= 65535 && host.find_first_of("/ ") == std::string::npos;
}

StatusOr<std::string> ParseEndpoint(const std::string& raw) {
  std::string e = Trim(raw);
  auto bad = [&](const std::string& why) { return InvalidArgumentError("etcd endpoint '" + e + "': " + why); };
  if (e.empty()) return InvalidArgumentError("etcd endpoint list has an empty entry");
  if (e.rfind("https://", 0) == 0) return bad("TLS to etcd is not supported (use http://host:port or unix:/path)");
  if (e.rfind("unix://", 0) == 0) e = "unix:" + e.substr(7);
  if (e.rfind("unix:", 0) == 0) {
    if (e.size() < 7 || e[5] != '/') return bad("a unix socket needs an absolute path (unix:/path)");
    return e;
  }
  std::string hp = e.rfind("http://", 0) == 0 ? e.substr(7) : e;
  while (!hp.empty() && hp.back() == '/') hp.pop_back();
  if (hp.find("://") != std::string::npos)
    return bad("unknown scheme (want host:port, http://host:port or unix:/path)");
  if (!ValidHostPort(hp)) return bad("want host:port with a port in 1..65535, http://host:port or unix:/path");
  return hp;
}

SysClock::time_point DeadlineIn(double seconds) {
  return SysClock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

KeyValue FromPb(const pb::KeyValue& kv) {
  return KeyValue{kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.lease()};
}

}  // namespace

StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& endpoints) {
  if (Trim(endpoints).empty()) return InvalidArgumentError("no etcd endpoints given (want host:port[,host:port…])");
  std::vector<std::string> out;
  for (const std::string& e : SplitText(endpoints, ',')) {
    ATOLL_ASSIGN_OR_RETURN(auto target, ParseEndpoint(e));
    out.push_back(std::move(target));
  }
  return out;
}

struct Endpoint {
  std::string target;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
};

struct EtcdClient::Impl {
  std::vector<Endpoint> eps;
  std::atomic<size_t> current{0};  // the endpoint that answered last
  double call_timeout_s = 5;
  std::mutex ka_mu;  // guards the keep-alive stream
  std::unique_ptr<KeepAliveStream> ka;
  size_t ka_endpoint = 0;

  static Status Map(const Endpoint& ep, const char* what, const grpc::Status& st) {
    return Status(static_cast<StatusCode>(static_cast<int>(st.error_code())),
                  "etcd at " + ep.target + ": " + what + ": " + st.error_message());
  }

  // Runs `rpc(endpoint, context)` on the endpoint that answered last, and on the others in turn
  // while they are unreachable, all within one call timeout.
  template <typename Rpc>
  Status Call(const char* what, Rpc&& rpc, double timeout_s = 0) {
    const auto deadline = DeadlineIn(timeout_s > 0 ? timeout_s : call_timeout_s);
    const size_t first = current.load();
    Status last;
    for (size_t i = 0; i < eps.size(); ++i) {
      const size_t k = (first + i) % eps.size();
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      const grpc::Status st = rpc(eps[k], ctx);
      if (st.ok()) {
        current = k;
        return Status::Ok();
      }
      last = Map(eps[k], what, st);
      if (st.error_code() != grpc::StatusCode::UNAVAILABLE || SysClock::now() >= deadline) break;
    }
    return last;
  }

  Status Txn(const pb::TxnRequest& req, pb::TxnResponse* resp) {
    return Call("Txn", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Txn(&ctx, req, resp); });
  }

  // One linearizable read, to learn whether the cluster answers.
  Status Probe(double seconds) {
    pb::RangeRequest req;
    req.set_key("/atoll/probe");
    req.set_count_only(true);
    pb::RangeResponse resp;
    return Call(
        "Range", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Range(&ctx, req, &resp); }, seconds);
  }
};

EtcdClient::EtcdClient(std::unique_ptr<Impl> impl, std::string endpoints)
    : impl_(std::move(impl)), endpoints_(std::move(endpoints)) {}

EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(const std::string& endpoints, double dial_timeout_s,
                                                          double call_timeout_s) {
  if (!(dial_timeout_s > 0) || !std::isfinite(dial_timeout_s)) {
    return InvalidArgumentError("etcd dial timeout must be a positive number of seconds");
  }
  ATOLL_ASSIGN_OR_RETURN(auto targets, ParseEtcdEndpoints(endpoints));
  auto impl = std::make_unique<Impl>();
  impl->call_timeout_s = call_timeout_s > 0 ? call_timeout_s : dial_timeout_s;
  grpc::ChannelArguments args;
  // Reconnect soon after etcd comes back (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const auto& t : targets) {
    Endpoint ep;
    ep.target = t;
    ep.channel = grpc::CreateCustomChannel(t, grpc::InsecureChannelCredentials(), args);
    ep.kv = pb::KV::NewStub(ep.channel);
    ep.lease = pb::Lease::NewStub(ep.channel);
    impl->eps.push_back(std::move(ep));
  }
  // Probe until one endpoint answers: a call fails at once while a channel is not connected, so
  // the probe is repeated (with the channels reconnecting) until the dial timeout.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(int64_t(dial_timeout_s * 1e6));
  Status last;
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) break;
    last = impl->Probe(left);
    if (last.ok()) return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(impl), endpoints));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return UnavailableError(fmt::format("etcd at {} did not answer within {:g} s: {}", endpoints, dial_timeout_s,
                                      last.ok() ? "no attempt finished" : last.message()));
}

StatusOr<int64_t> EtcdClient::Grant(int64_t ttl_s, int64_t* granted_ttl_s) {
  if (ttl_s <= 0) return InvalidArgumentError("etcd lease TTL must be at least 1 s");
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  ATOLL_RETURN_IF_ERROR(impl_->Call(
      "LeaseGrant", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.lease->LeaseGrant(&ctx, req, &resp); }));
  if (!resp.error().empty()) return UnavailableError("etcd at " + endpoints_ + ": LeaseGrant: " + resp.error());
  if (granted_ttl_s) *granted_ttl_s = resp.ttl();
  return resp.id();
}

StatusOr<int64_t> EtcdClient::KeepAliveOnce(int64_t lease, double timeout_s) {
  std::lock_guard<std::mutex> lock(impl_->ka_mu);
  Impl& im = *impl_;
  if (im.ka && im.ka->broken()) im.ka.reset();
  if (!im.ka) {
    im.ka_endpoint = im.current.load();
    im.ka = std::make_unique<KeepAliveStream>(im.eps[im.ka_endpoint].lease.get());
  }
  pb::LeaseKeepAliveResponse resp;
  const grpc::Status st = im.ka->RoundTrip(lease, DeadlineIn(timeout_s > 0 ? timeout_s : im.call_timeout_s), &resp);
  if (!st.ok()) {
    const Endpoint& ep = im.eps[im.ka_endpoint];
    // The next stream goes to the next endpoint when this one is unreachable.
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) im.current = (im.ka_endpoint + 1) % im.eps.size();
    return Impl::Map(ep, "LeaseKeepAlive", st);
  }
  if (resp.ttl() <= 0) {
    return NotFoundError("etcd at " + endpoints_ + ": lease " + std::to_string(lease) +
                         " not found (expired or revoked)");
  }
  return resp.ttl();
}

Status EtcdClient::Revoke(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  Status st = impl_->Call(
      "LeaseRevoke", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.lease->LeaseRevoke(&ctx, req, &resp); });
  if (st.code() == StatusCode::kNotFound) return Status::Ok();  // already expired or revoked
  return st;
}

StatusOr<std::optional<KeyValue>> EtcdClient::Get(const std::string& key) {
  pb::RangeRequest req;
  req.set_key(key);
  pb::RangeResponse resp;
  ATOLL_RETURN_IF_ERROR(
      impl_->Call("Range", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Range(&ctx, req, &resp); }));
  if (resp.kvs_size() == 0) return std::optional<KeyValue>();
  return std::optional<KeyValue>(FromPb(resp.kvs(0)));
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  return impl_->Call("Put", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->Put(&ctx, req, &resp); });
}

StatusOr<PutIfAbsentResult> EtcdClient::PutIfAbsent(const std::string& key, const std::string& value, int64_t lease) {
  pb::TxnRequest req;
  pb::Compare* c = req.add_compare();
  c->set_key(key);
  c->set_target(pb::Compare::CREATE);
  c->set_result(pb::Compare::EQUAL);
  c->set_create_revision(0);  // the key does not exist
  pb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  req.add_failure()->mutable_request_range()->set_key(key);
  pb::TxnResponse resp;
  ATOLL_RETURN_IF_ERROR(impl_->Txn(req, &resp));
  PutIfAbsentResult r;
  r.created = resp.succeeded();
  r.revision = resp.header().revision();
  if (!r.created) {
    if (resp.responses_size() != 1 || resp.responses(0).response_range().kvs_size() != 1) {
      // Deleted between the compare and the read cannot happen in one transaction.
      return InternalError("etcd at " + endpoints_ + ": Txn on '" + key + "' failed its compare but returned no key");
    }
    r.existing = FromPb(resp.responses(0).response_range().kvs(0));
  }
  return r;
}

StatusOr<bool> EtcdClient::Delete(const std::string& key) {
  pb::DeleteRangeRequest req;
  req.set_key(key);
  pb::DeleteRangeResponse resp;
  ATOLL_RETURN_IF_ERROR(impl_->Call(
      "DeleteRange", [&](Endpoint& ep, grpc::ClientContext& ctx) { return ep.kv->DeleteRange(&ctx, req, &resp); }));
  return resp.deleted() > 0;
}

StatusOr<bool> EtcdClient::PutIfBound(const std::string& key, const std::string& value, const std::string& guard,
                                      int64_t lease) {
  pb::TxnRequest req;
  pb::Compare* c = req.add_compare();
  c->set_key(guard);
  c->set_target(pb::Compare::LEASE);
  c->set_result(pb::Compare::EQUAL);
  c->set_lease(lease);
  pb::PutRequest* put = req.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  pb::TxnResponse resp;
  ATOLL_RETURN_IF_ERROR(impl_->Txn(req, &resp));
  return resp.succeeded();
}

StatusOr<bool> EtcdClient::DeleteIf(const std::string& key, int64_t lease) {
  pb::TxnRequest req;
  pb::Compare* c = req.add_compare();
  c->set_key(key);
  c->set_target(pb::Compare::LEASE);
  c->set_result(pb::Compare::EQUAL);
  c->set_lease(lease);
  req.add_success()->mutable_request_delete_range()->set_key(key);
  pb::TxnResponse resp;
  ATOLL_RETURN_IF_ERROR(impl_->Txn(req, &resp));
  return resp.succeeded() && resp.responses_size() == 1 && resp.responses(0).response_delete_range().deleted() > 0;
}

}  // namespace atl::coord
