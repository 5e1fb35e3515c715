// The learner <-> syncer seam, tested once per SyncerApi implementation: the in-process
// SyncerLoop, the same loop behind a WAN-shaped link (ShapedSyncerApi: bandwidth, latency,
// jitter), and a real gRPC server with one client per learner on 127.0.0.1 (port 0). The same
// behaviour must hold over each: learners train together and the global model learns, a late
// learner catches up with deltas, the synchronous barrier brings back every fragment, a learner
// of another model is refused with the reason, and a learner's leave reports all it trained.
// The in-process links run on simulated time (SimClock); gRPC on the real clock, every wait
// bounded.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/sim_clock.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/learner/wan_shaper.h"
#include "atoll/syncer/syncer_loop.h"
#include "testing/toy_learner.h"
#ifdef ATOLL_TEST_GRPC
#include "atoll/transport/grpc_server.h"
#include "atoll/transport/grpc_client.h"
#endif

namespace atl {
namespace {

using testing::ToyLearner;

enum class Link { kInProcess, kWanShaped, kGrpc };

const char* NameOf(Link link) {
  switch (link) {
    case Link::kInProcess: return "InProcess";
    case Link::kWanShaped: return "WanShaped";
    case Link::kGrpc: return "Grpc";
  }
  return "Unknown";
}
std::string LinkName(const ::testing::TestParamInfo<Link>& info) { return NameOf(info.param); }
void PrintTo(Link link, std::ostream* os) { *os << NameOf(link); }

syncer::SyncerOptions Options(int H) {
  syncer::SyncerOptions o;
  o.run_id = "seam";
  o.H = H;
  o.round.quorum = 1;
  o.round.tau = 1;
  o.outer = {1.0, 0.0, true};  // plain averaging: Θ converges to the mean of the learners
  o.history_versions = 1000;   // a late learner is never further behind than the history
  o.history_bytes_per_value = 0;
  return o;
}

// A syncer core over ToyPlan(P) behind one SyncerApi implementation, one API object per learner,
// and the clock they all run on.
class Seam {
 public:
  Seam(Link link, syncer::SyncerOptions options, const diloco::FragmentPlan& plan, int learners) {
    if (link == Link::kGrpc) {
      clock_ = std::make_unique<RealClock>();
    } else {
      clock_ = std::make_unique<SimClock>();
    }
    std::vector<std::vector<float>> init;
    for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.0f);
    auto core = syncer::SyncerCore::Create(std::move(options), plan, init);
    ATOLL_CHECK(core.ok());
    loop_ = std::make_unique<syncer::SyncerLoop>(std::move(*core), *clock_, nullptr);
    for (int m = 0; m < learners; ++m) apis_.push_back(MakeApi(link, m));
  }
  ~Seam() {
#ifdef ATOLL_TEST_GRPC
    clients_.clear();
    if (server_) server_->Shutdown();
#endif
    loop_->Stop();
  }

  Clock& clock() { return *clock_; }
  syncer::SyncerLoop& loop() { return *loop_; }
  syncer::SyncerApi& api(int learner) { return *apis_[static_cast<size_t>(learner)]; }
  // Seconds a bounded wait of the test may take: simulated ones cost nothing.
  double bound_s() const { return dynamic_cast<SimClock*>(clock_.get()) != nullptr ? 5.0 : 30.0; }

 private:
  syncer::SyncerApi* MakeApi(Link link, int learner) {
    switch (link) {
      case Link::kInProcess: return loop_.get();
      case Link::kWanShaped: {
        learner::ShaperOptions so;
        so.bandwidth_bps = 20e6;
        so.latency_s = 0.004;
        so.jitter_s = 0.001;
        so.seed = 17 + static_cast<uint64_t>(learner);
        shaped_.push_back(std::make_unique<learner::ShapedSyncerApi>(*loop_, so, *clock_));
        return shaped_.back().get();
      }
      case Link::kGrpc: return GrpcClient();
    }
    return nullptr;
  }

  syncer::SyncerApi* GrpcClient() {
#ifdef ATOLL_TEST_GRPC
    if (!server_) {
      transport::ServerOptions so;
      so.token = "secret";
      auto s = transport::GrpcSyncerServer::Start(so, *loop_, [](bool) { return std::string("{}"); });
      ATOLL_CHECK(s.ok());
      server_ = std::move(*s);
    }
    transport::ClientOptions co;
    co.target = "127.0.0.1:" + std::to_string(server_->port());
    co.token = "secret";
    auto c = transport::GrpcSyncerClient::Connect(co);
    ATOLL_CHECK(c.ok());
    clients_.push_back(std::move(*c));
    return clients_.back().get();
#else
    ATOLL_CHECK_MSG(false, "built without the gRPC transport");
    return nullptr;
#endif
  }

  std::unique_ptr<Clock> clock_;
  std::unique_ptr<syncer::SyncerLoop> loop_;
  std::vector<syncer::SyncerApi*> apis_;
  std::vector<std::unique_ptr<learner::ShapedSyncerApi>> shaped_;
#ifdef ATOLL_TEST_GRPC
  std::unique_ptr<transport::GrpcSyncerServer> server_;
  std::vector<std::unique_ptr<transport::GrpcSyncerClient>> clients_;
#endif
};

learner::AgentOptions AgentOpts(int id, int H, int P) {
  learner::AgentOptions a;
  a.run_id = "seam";
  a.learner_id = id;
  a.schedule = {H, P, 1};
  a.heartbeat_s = 0.05;
  a.backoff_initial_s = 0.02;
  a.backoff_max_s = 0.2;
  a.initial_join_timeout_s = 10;
  return a;
}

std::vector<float> ThetaOf(syncer::SyncerLoop& loop, int p) {
  return loop.Call([p](syncer::SyncerCore& c, TimePoint) {
    auto s = c.theta(p);
    return std::vector<float>(s.begin(), s.end());
  });
}

class SyncerApiSeam : public ::testing::TestWithParam<Link> {};

TEST_P(SyncerApiSeam, LearnersTrainTogetherAndTheGlobalModelMovesTowardTheirMean) {
  const int H = 4, P = 4, M = 3;
  const auto plan = testing::ToyPlan(P);
  Seam seam(GetParam(), Options(H), plan, M);
  std::vector<std::unique_ptr<ToyLearner>> toys;
  std::vector<ToyLearner*> raw;
  for (int i = 0; i < M; ++i) {
    toys.push_back(std::make_unique<ToyLearner>(100 + i));
    raw.push_back(toys.back().get());
  }
  std::vector<double> start;
  for (int p = 0; p < P; ++p) start.push_back(testing::DistanceToMeanTarget(ThetaOf(seam.loop(), p), raw, plan, p));
  std::vector<learner::AgentCounters> counters(M);
  std::vector<std::thread> threads;
  {
    ClockThread setup(seam.clock());  // simulated time starts once every learner is counted
    for (int i = 0; i < M; ++i) {
      threads.push_back(StartThread(seam.clock(), [&, i] {
        learner::LearnerAgent agent(AgentOpts(i, H, P), plan, toys[i]->Views(), seam.api(i), seam.clock());
        ASSERT_TRUE(agent.Start().ok());
        testing::TrainToy(*toys[i], agent, 120, 3, seam.clock());
        agent.WaitForAllFragments(120, seam.bound_s());
        counters[i] = agent.counters();
        agent.Stop();
      }));
    }
  }
  for (auto& t : threads) t.join();
  const nlohmann::json status =
      seam.loop().Call([](syncer::SyncerCore& c, TimePoint now) { return c.StatusJson(now); });
  EXPECT_GT(status["rounds"].get<int64_t>(), 20);
  for (int i = 0; i < M; ++i) {
    EXPECT_TRUE(counters[i].joined);
    EXPECT_GT(counters[i].pushes, 10) << "learner " << i;
    EXPECT_EQ(counters[i].catchup_fragments, 0) << "learner " << i << ": it starts from Θ⁰ bit for bit";
    EXPECT_GE(counters[i].fragments_applied, 3) << "learner " << i;
    EXPECT_EQ(counters[i].rejected, 0) << "learner " << i;  // includes checksum disagreements
    EXPECT_GT(status["learners"][static_cast<size_t>(i)]["rounds_joined"].get<int64_t>(), 0) << "learner " << i;
    // The syncer counts every push it received; the learner the ones it accepted.
    EXPECT_GE(status["learners"][static_cast<size_t>(i)]["pushes"].get<int64_t>(), counters[i].pushes)
        << "learner " << i;
  }
  for (int p = 0; p < P; ++p) {
    EXPECT_LT(testing::DistanceToMeanTarget(ThetaOf(seam.loop(), p), raw, plan, p), 0.5 * start[static_cast<size_t>(p)])
        << "fragment " << p;
  }
}

// A learner that joins late — or restarts — from the run's initial values catches up with one
// delta per fragment from those values (the syncer keeps them in its history), not a full fetch.
TEST_P(SyncerApiSeam, ALateLearnerCatchesUpWithDeltasFromTheInitialValues) {
  const int H = 4, P = 4;
  const auto plan = testing::ToyPlan(P);
  Seam seam(GetParam(), Options(H), plan, 2);
  ToyLearner early(200), late(201);
  std::atomic<bool> early_done{false};
  learner::AgentCounters late_counters;
  std::vector<std::thread> threads;
  {
    ClockThread setup(seam.clock());
    threads.push_back(StartThread(seam.clock(), [&] {
      learner::LearnerAgent agent(AgentOpts(0, H, P), plan, early.Views(), seam.api(0), seam.clock());
      ASSERT_TRUE(agent.Start().ok());
      testing::TrainToy(early, agent, 80, 3, seam.clock());
      agent.WaitForAllFragments(80, seam.bound_s());
      early_done = true;
      agent.Stop();
    }));
  }
  // The late learner starts once every fragment has moved past its initial value.
  for (auto& t : threads) t.join();
  ASSERT_TRUE(early_done.load());
  {
    ClockThread participant(seam.clock());
    learner::LearnerAgent agent(AgentOpts(1, H, P), plan, late.Views(), seam.api(1), seam.clock());
    ASSERT_TRUE(agent.Start().ok());
    testing::TrainToy(late, agent, 20, 3, seam.clock());
    agent.WaitForAllFragments(20, seam.bound_s());
    late_counters = agent.counters();
    agent.Stop();
  }
  EXPECT_EQ(late_counters.pulls_full, 0);
  EXPECT_GE(late_counters.catchup_fragments, P);  // every fragment had moved since the start
  EXPECT_GE(late_counters.pulls_delta, P);
  EXPECT_EQ(late_counters.checksum_mismatches, 0);
  EXPECT_GT(late_counters.pushes, 3);
}

// diloco mode: every learner sends every fragment at the end of each H-step period and waits at
// the barrier until all of them came back merged; K = M = 2.
TEST_P(SyncerApiSeam, TheSynchronousBarrierBringsBackEveryFragmentOfThePeriod) {
  const int H = 4, P = 2, M = 2, periods = 3;
  const auto plan = testing::ToyPlan(P);
  syncer::SyncerOptions o = Options(H);
  o.mode = diloco::Mode::kDiloco;
  o.round.quorum = M;
  o.round.grace = false;
  o.outer_step = syncer::OuterStepRule::kRound;
  Seam seam(GetParam(), o, plan, M);
  std::vector<std::vector<learner::StepResult>> results(M);
  std::vector<std::thread> threads;
  {
    ClockThread setup(seam.clock());
    for (int id = 0; id < M; ++id) {
      threads.push_back(StartThread(seam.clock(), [&, id] {
        learner::AgentOptions ao = AgentOpts(id, H, P);
        ao.schedule = diloco::Schedule::Of(diloco::Mode::kDiloco, H, P, 1);
        ao.barrier_timeout_s = seam.bound_s();
        ToyLearner toy(300 + id);
        learner::LearnerAgent agent(ao, plan, toy.Views(), seam.api(id), seam.clock());
        ASSERT_TRUE(agent.Start().ok());
        for (int s = 0; s < periods * H; ++s) {
          toy.Step(0.05f);
          seam.clock().SleepFor(std::chrono::milliseconds(3));
          results[static_cast<size_t>(id)].push_back(agent.AfterStep(s, 100));
        }
        agent.Stop();
      }));
    }
  }
  for (auto& t : threads) t.join();
  for (int id = 0; id < M; ++id) {
    const auto& r = results[static_cast<size_t>(id)];
    ASSERT_EQ(static_cast<int>(r.size()), periods * H);
    for (int s = 0; s < periods * H; ++s) {
      const bool barrier = (s + 1) % H == 0;
      EXPECT_EQ(r[static_cast<size_t>(s)].applied, barrier ? P : 0) << "learner " << id << ", step " << s;
    }
  }
  const auto versions = seam.loop().Call([](syncer::SyncerCore& c, TimePoint) { return c.versions(); });
  for (int64_t v : versions) EXPECT_EQ(v, periods) << "one round per fragment and period";
}

TEST_P(SyncerApiSeam, ALearnerOfAnotherModelIsRefusedWithTheReason) {
  const auto plan = testing::ToyPlan(2);
  Seam seam(GetParam(), Options(2), plan, 1);
  auto tensors = testing::ToyTensors();
  tensors[1].name = "layers.0.other";  // a differently named tensor
  diloco::PlanOptions po;
  po.num_fragments = 2;
  auto other = diloco::MakeFragmentPlan(tensors, po);
  ASSERT_TRUE(other.ok());
  ToyLearner toy(1);
  ClockThread participant(seam.clock());
  learner::LearnerAgent agent(AgentOpts(0, 2, 2), *other, toy.Views(), seam.api(0), seam.clock());
  const Status st = agent.Start();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("model signature"), std::string::npos) << st;
}

// FlushAll sends the last steps' progress (accepted before it returns) and Leave reports everything
// the learner trained, even before its first periodic heartbeat: the syncer's table counts every
// token and marks it done.
TEST_P(SyncerApiSeam, TheFinalSyncAndTheLeaveReportEverythingTheLearnerTrained) {
  const int H = 2, P = 2, steps = 7;
  const auto plan = testing::ToyPlan(P);
  Seam seam(GetParam(), Options(H), plan, 1);
  ToyLearner toy(5);
  ClockThread participant(seam.clock());
  auto opts = AgentOpts(0, H, P);
  opts.heartbeat_s = 3600;  // the run ends long before the first periodic heartbeat
  learner::LearnerAgent agent(opts, plan, toy.Views(), seam.api(0), seam.clock());
  ASSERT_TRUE(agent.Start().ok());
  testing::TrainToy(toy, agent, steps, 5, seam.clock());
  EXPECT_GT(agent.FlushAll(steps, seam.bound_s()), 0) << "the last step's fragment had not been sent";
  learner::Progress done;
  done.step = steps;
  done.tokens = steps * 100;  // TrainToy's 100 tokens per step
  done.state = syncer::LearnerState::kDone;
  agent.SetProgress(done);
  ASSERT_TRUE(agent.Leave().ok());
  const auto rec = seam.loop().Call([](syncer::SyncerCore& sc, TimePoint) { return sc.learners().at(0); });
  EXPECT_EQ(rec.step, steps);
  EXPECT_EQ(rec.tokens, steps * 100) << "the syncer's status counts every token the learner trained";
  EXPECT_EQ(rec.state, syncer::LearnerState::kDone);
}

#ifdef ATOLL_TEST_GRPC
INSTANTIATE_TEST_SUITE_P(Links, SyncerApiSeam, ::testing::Values(Link::kInProcess, Link::kWanShaped, Link::kGrpc),
                         LinkName);
#else
INSTANTIATE_TEST_SUITE_P(Links, SyncerApiSeam, ::testing::Values(Link::kInProcess, Link::kWanShaped), LinkName);
#endif

}  // namespace
}  // namespace atl
