// The real gRPC server of the atoll.v1 protocol on 127.0.0.1 (port 0) around a one-fragment
// syncer, for the hostile-client tests (hostile_transport_test.cc, hostile_limits_test.cc):
// clients with the shared token "secret" or per-learner tokens, an honest learner's exchange,
// and a checksum of the committed state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atoll/core/checksum.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/transport/grpc.h"
#include "small_core.h"
#include "toy_cluster.h"

#include <gtest/gtest.h>

namespace atl::testing {

using diloco::Encoding;

struct HostileServer {
  RealClock clock;
  diloco::FragmentPlan plan = testing::ToyPlan(1);
  std::unique_ptr<syncer::SyncerLoop> loop;
  std::unique_ptr<transport::GrpcSyncerServer> server;
  std::string target;

  explicit HostileServer(transport::ServerLimits limits = {}, std::string secret = "", std::string allowed = "",
                         syncer::SyncerLoop::RoundCallback on_round = nullptr) {
    std::vector<std::vector<float>> init(1, std::vector<float>(static_cast<size_t>(plan.fragments[0].numel), 0.25f));
    syncer::SyncerOptions o;
    o.run_id = "grpc";
    o.H = 2;
    o.uplink = {Encoding::kInt4, 64};
    o.downlink = {Encoding::kInt4, 64};
    auto core = syncer::SyncerCore::Create(o, plan, init);
    ATOLL_CHECK(core.ok());
    loop = std::make_unique<syncer::SyncerLoop>(std::move(*core), clock, std::move(on_round));
    transport::ServerOptions so;
    so.token = "secret";
    so.secret = secret;
    so.allowed_learners = allowed;
    so.limits = limits;
    auto s = transport::GrpcSyncerServer::Start(so, *loop, [](bool) { return std::string("{}"); });
    ATOLL_CHECK(s.ok());
    server = std::move(*s);
    target = "127.0.0.1:" + std::to_string(server->port());
  }
  ~HostileServer() {
    server->Shutdown();
    loop->Stop();
  }
  uint64_t Committed() {
    return loop->Call([](syncer::SyncerCore& c, TimePoint) { return exchange::ValuesChecksum(c.theta(0)) ^ c.version(0); });
  }
  std::unique_ptr<transport::GrpcSyncerClient> Client(std::string token = "secret") {
    transport::ClientOptions co;
    co.target = target;
    co.token = std::move(token);
    co.call_timeout_s = 10;
    co.push_timeout_s = 10;
    auto c = transport::GrpcSyncerClient::Connect(co);
    ATOLL_CHECK(c.ok());
    return std::move(*c);
  }
  syncer::JoinRequestData Join(int id, std::string host = "test") const {
    syncer::JoinRequestData r;
    r.protocol_version = syncer::kProtocolVersion;
    r.run_id = "grpc";
    r.model_signature = diloco::ModelSignature(plan.tensors);
    r.learner_id = id;
    r.host = std::move(host);
    return r;
  }
  // A push header of learner `id`, stamped with the push session of its latest join and the next
  // sequence number (as its agent would: call it after the join, once per push).
  syncer::PushHeaderData Header(int id) const {
    return loop->Call([h = Unstamped(id)](syncer::SyncerCore& c, TimePoint) { return testing::Stamped(c, h); });
  }
  syncer::PushHeaderData Unstamped(int id) const {
    syncer::PushHeaderData h;
    h.learner_id = id;
    h.fragment = 0;
    h.base_version = 0;
    h.c_tokens = 10;
    h.c_steps = 1;
    h.encoding = Encoding::kInt4;
    h.block_size = 64;
    h.num_values = plan.fragments[0].numel;
    return h;
  }
  // A small honest update of fragment 0 (every value 0.01), encoded as the run's pushes are.
  std::vector<std::byte> SmallUpdate() const {
    std::vector<float> delta(static_cast<size_t>(plan.fragments[0].numel), 0.01f);
    std::vector<std::byte> payload;
    ATOLL_CHECK(diloco::Encode({Encoding::kInt4, 64}, delta, payload).ok());
    return payload;
  }
  // An honest learner joins, fetches, pushes a small update and pulls again.
  void ExpectServesAnHonestLearner(int id) {
    auto c = Client();
    ASSERT_TRUE(c->Join(Join(id)).ok());
    ASSERT_TRUE(c->Pull(id, 0, -1, 0, -1).ok());
    auto pushed = c->Push(Header(id), SmallUpdate());
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_TRUE(c->StatusJson().ok());
  }
};

}  // namespace atl::testing
