// ToyServer: the real gRPC server of the atl.v1 protocol on 127.0.0.1 (port 0) around a
// SyncerLoop over ToyPlan(P), on the real clock, for the transport tests: clients with the shared
// token "secret" or per-learner tokens (a run secret, an allow-list), limits, the rounds closed so
// far, and a checksum of fragment 0's committed state.
#pragma once

#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/syncer_loop.h"
#include "atoll/transport/grpc_server.h"
#include "atoll/transport/grpc_client.h"
#include "testing/plans.h"
#include "testing/small_core.h"

namespace atl::testing {

struct ToyServerOptions {
  int P = 1, H = 2;
  int tau = syncer::RoundOptions{}.tau;
  diloco::Encoding encoding = diloco::Encoding::kInt4;  // both links, block 64
  transport::ServerLimits limits;
  std::string secret;                          // per-learner credentials when set (besides the shared token "secret")
  std::string allowed;                         // the allow-list of learner ids ("" = any)
  syncer::SyncerLoop::RoundCallback on_round;  // called after the server's own count
  transport::ServerOptions::PullFault pull_fault;     // pull streams cut on purpose
  transport::ServerOptions::Fence fence;              // leadership (epoch, leading)
  transport::ServerOptions::Replication replication;  // a leader's commit log and state folder

  ToyServerOptions Shape(int p, int h, int t) && {
    P = p, H = h, tau = t;
    return std::move(*this);
  }
  ToyServerOptions Encoded(diloco::Encoding e) && {
    encoding = e;
    return std::move(*this);
  }
  ToyServerOptions Limits(transport::ServerLimits l) && {
    limits = l;
    return std::move(*this);
  }
  ToyServerOptions Secret(std::string s) && {
    secret = std::move(s);
    return std::move(*this);
  }
  ToyServerOptions Allowed(std::string a) && {
    allowed = std::move(a);
    return std::move(*this);
  }
  ToyServerOptions CutPulls(transport::ServerOptions::PullFault f) && {
    pull_fault = f;
    return std::move(*this);
  }
  ToyServerOptions Fenced(transport::ServerOptions::Fence f) && {
    fence = std::move(f);
    return std::move(*this);
  }
  ToyServerOptions Replicated(transport::ServerOptions::Replication r) && {
    replication = std::move(r);
    return std::move(*this);
  }
  ToyServerOptions OnRound(syncer::SyncerLoop::RoundCallback f) && {
    on_round = std::move(f);
    return std::move(*this);
  }
};

struct ToyServer {
  RealClock clock;
  diloco::FragmentPlan plan;
  std::unique_ptr<syncer::SyncerLoop> loop;
  std::unique_ptr<transport::GrpcSyncerServer> server;
  std::string target;
  std::mutex rounds_mu;
  std::condition_variable rounds_cv;
  int rounds_closed = 0;  // guarded by rounds_mu

  explicit ToyServer(ToyServerOptions o = {}) : plan(ToyPlan(o.P)) {
    std::vector<std::vector<float>> init;
    for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.25f);
    syncer::SyncerOptions so;
    so.run_id = "grpc";
    so.H = o.H;
    so.round.tau = o.tau;
    so.uplink = {o.encoding, 64};
    so.downlink = {o.encoding, 64};
    auto core = syncer::SyncerCore::Create(so, plan, init);
    ATOLL_CHECK(core.ok());
    loop = std::make_unique<syncer::SyncerLoop>(
        std::move(*core), clock,
        [this, on_round = std::move(o.on_round)](const syncer::SyncerCore& c, const syncer::RoundReport& r) {
          {
            std::lock_guard<std::mutex> g(rounds_mu);
            ++rounds_closed;
          }
          rounds_cv.notify_all();
          if (on_round) on_round(c, r);
        });
    transport::ServerOptions options;
    options.token = "secret";
    options.secret = o.secret;
    options.allowed_learners = o.allowed;
    options.limits = o.limits;
    options.pull_fault = o.pull_fault;
    options.fence = o.fence;
    options.replication = o.replication;
    auto s = transport::GrpcSyncerServer::Start(options, *loop, [](bool) { return std::string("{}"); });
    ATOLL_CHECK(s.ok());
    server = std::move(*s);
    target = "127.0.0.1:" + std::to_string(server->port());
  }
  ~ToyServer() {
    server->Shutdown();
    loop->Stop();
  }

  // Waits (on the round callback, bounded) until `n` rounds have closed.
  bool WaitForRounds(int n, double seconds) {
    std::unique_lock<std::mutex> lock(rounds_mu);
    return clock.WaitFor(rounds_cv, lock, FromSeconds(seconds), [&] { return rounds_closed >= n; });
  }
  nlohmann::json Status() {
    return loop->Call([](syncer::SyncerCore& c, TimePoint now) { return c.StatusJson(now); });
  }
  uint64_t Committed() {
    return loop->Call(
        [](syncer::SyncerCore& c, TimePoint) { return exchange::ValuesChecksum(c.theta(0)) ^ c.version(0); });
  }
  std::unique_ptr<transport::GrpcSyncerClient> Client(std::string token = "secret") const {
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
  // A push header of learner `id` for `fragment`, from version 0, in the server's encoding, stamped
  // with the push session of the learner's latest join and the next sequence number (as its agent
  // would: call it after the join, once per push).
  syncer::PushHeaderData Header(int id, int fragment = 0, diloco::Encoding encoding = diloco::Encoding::kInt4) const {
    return loop->Call(
        [h = Unstamped(id, fragment, encoding)](syncer::SyncerCore& c, TimePoint) { return Stamped(c, h); });
  }
  syncer::PushHeaderData Unstamped(int id, int fragment = 0,
                                   diloco::Encoding encoding = diloco::Encoding::kInt4) const {
    syncer::PushHeaderData h;
    h.learner_id = id;
    h.fragment = fragment;
    h.base_version = 0;
    h.c_tokens = 10;
    h.c_steps = 1;
    h.encoding = encoding;
    h.block_size = 64;
    h.num_values = plan.fragments[static_cast<size_t>(fragment)].numel;
    return h;
  }
  // A small honest update of fragment 0 (every value 0.01), encoded as the run's int4 pushes are.
  std::vector<std::byte> SmallUpdate() const {
    std::vector<float> delta(static_cast<size_t>(plan.fragments[0].numel), 0.01f);
    std::vector<std::byte> payload;
    ATOLL_CHECK(diloco::Encode({diloco::Encoding::kInt4, 64}, delta, payload).ok());
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
