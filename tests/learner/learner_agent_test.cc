// The learner agent against an in-process SyncerLoop (no sockets), with toy models, on simulated
// time (SimClock): every heartbeat, backoff, grace window and step duration is simulated, so no
// outcome depends on how busy the machine is. Sharded syncers, unreachable and restarted ones,
// partitions, the barrier's bound, long polls and the state folder. What must hold over every
// SyncerApi implementation is in syncer_api_test.cc.
#include "atoll/learner/learner_agent.h"
#include "atoll/learner/agent_group.h"

#include <gtest/gtest.h>

#include <fstream>

#include "atoll/core/sim_clock.h"
#include "atoll/syncer/syncer_loop.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unistd.h>

#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/learner/wan_shaper.h"
#include "testing/toy_learner.h"
#include "testing/scratch.h"
#include "testing/small_core.h"

namespace atl {
namespace {

using testing::ToyLearner;

syncer::SyncerOptions Options(int H) {
  syncer::SyncerOptions o;
  o.run_id = "toy";
  o.H = H;
  o.round.quorum = 1;
  o.round.tau = 1;
  o.outer = {1.0, 0.0, true};  // plain averaging: Θ converges to the mean of the learners
  return o;
}

// A syncer core for the toy plan with every value of Θ⁰ = `init`.
syncer::SyncerCore ToyCore(const diloco::FragmentPlan& plan, int H, float init, int history_versions = 8) {
  std::vector<std::vector<float>> values;
  for (const auto& f : plan.fragments) values.emplace_back(static_cast<size_t>(f.numel), init);
  syncer::SyncerOptions o = Options(H);
  o.history_versions = history_versions;
  o.history_bytes_per_value = 0;
  auto core = syncer::SyncerCore::Create(o, plan, values);
  ATOLL_CHECK(core.ok());
  return std::move(*core);
}

learner::AgentOptions AgentOpts(int id, int H, int P) {
  learner::AgentOptions a;
  a.run_id = "toy";
  a.learner_id = id;
  a.schedule = {H, P, 1};
  a.heartbeat_s = 0.05;
  a.backoff_initial_s = 0.02;
  a.backoff_max_s = 0.2;
  a.initial_join_timeout_s = 5;
  return a;
}

// A syncer sharded two ways (docs/decisions/011): two SyncerLoops, shard 0/2 and 1/2, and two
// learners, each an AgentGroup with one agent per shard. Every fragment advances at its owner
// only, every learner contributes to both shards, and the global model learns.
TEST(AgentGroup, TwoShardsEachMergeOnlyTheirFragmentsAndTheModelLearns) {
  const int H = 4, P = 4;
  auto plan = testing::ToyPlan(P);
  std::vector<std::vector<float>> init;
  for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  SimClock clock;
  std::vector<std::unique_ptr<syncer::SyncerLoop>> shards;
  for (int k = 0; k < 2; ++k) {
    syncer::SyncerOptions o = Options(H);
    o.shard = {k, 2};
    auto core = syncer::SyncerCore::Create(o, plan, init);
    ASSERT_TRUE(core.ok()) << core.status();
    shards.push_back(std::make_unique<syncer::SyncerLoop>(
        std::move(*core), clock, [](const syncer::SyncerCore&, const syncer::RoundReport&) {}));
  }
  std::vector<std::unique_ptr<ToyLearner>> toys;
  std::vector<ToyLearner*> raw;
  for (int i = 0; i < 2; ++i) {
    toys.push_back(std::make_unique<ToyLearner>(200 + i));
    raw.push_back(toys.back().get());
  }
  std::vector<learner::AgentCounters> counters(2);
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);
    for (int i = 0; i < 2; ++i) {
      threads.push_back(StartThread(clock, [&, i] {
        learner::AgentGroup group(AgentOpts(i, H, P), plan, toys[i]->Views(), {shards[0].get(), shards[1].get()},
                                  clock);
        ASSERT_EQ(group.shards(), 2);
        ASSERT_TRUE(group.Start().ok());
        for (int s = 0; s < 120; ++s) {
          toys[i]->Step(0.05f);
          clock.SleepFor(std::chrono::milliseconds(3));
          learner::Progress pr;
          pr.step = s + 1;
          pr.step_seconds = 0.003;
          group.SetProgress(pr);
          group.OnStep(s, 100);
          group.ApplyReady(s + 1);
        }
        group.WaitForAllFragments(120, 2.0);
        counters[i] = group.counters();
        for (int k = 0; k < 2; ++k) EXPECT_GT(group.agent(k).counters().pushes, 5) << "learner " << i << " shard " << k;
        EXPECT_TRUE(group.Leave().ok());
      }));
    }
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < 2; ++k) {
    auto versions = shards[static_cast<size_t>(k)]->Call([](syncer::SyncerCore& c, TimePoint) { return c.versions(); });
    for (int p = 0; p < P; ++p) {
      if (p % 2 == k) {
        EXPECT_GT(versions[static_cast<size_t>(p)], 3) << "shard " << k << " fragment " << p;
      } else {
        EXPECT_EQ(versions[static_cast<size_t>(p)], 0)
            << "shard " << k << " moved fragment " << p << " it does not own";
      }
    }
    auto table = shards[static_cast<size_t>(k)]->Call([](syncer::SyncerCore& c, TimePoint) { return c.learners(); });
    ASSERT_EQ(table.size(), 2u);
    for (const auto& [id, l] : table) {
      EXPECT_GT(l.rounds_joined, 0) << "learner " << id << " at shard " << k;
      EXPECT_EQ(l.state, syncer::LearnerState::kDone) << "learner " << id << " left shard " << k;
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(counters[i].joined);
    EXPECT_EQ(counters[i].rejected, 0);
    EXPECT_EQ(counters[i].learner_id, i);
  }
  for (int p = 0; p < P; ++p) {
    auto theta = shards[static_cast<size_t>(p % 2)]->Call([p](syncer::SyncerCore& c, TimePoint) {
      auto v = c.theta(p);
      return std::vector<float>(v.begin(), v.end());
    });
    EXPECT_LT(testing::DistanceToMeanTarget(theta, raw, plan, p),
              0.5 * testing::DistanceToMeanTarget(init[p], raw, plan, p))
        << p;
  }
}

TEST(AgentGroup, AShardedLearnerNeedsItsOwnIdAndTheShardsInOrder) {
  const int H = 4, P = 4;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  std::vector<std::unique_ptr<syncer::SyncerLoop>> shards;
  for (int k = 0; k < 2; ++k) {
    syncer::SyncerOptions o = Options(H);
    o.shard = {k, 2};
    std::vector<std::vector<float>> init;
    for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.0f);
    auto core = syncer::SyncerCore::Create(o, plan, init);
    ASSERT_TRUE(core.ok());
    shards.push_back(std::make_unique<syncer::SyncerLoop>(
        std::move(*core), clock, [](const syncer::SyncerCore&, const syncer::RoundReport&) {}));
  }
  ToyLearner toy(7);
  learner::AgentGroup no_id(AgentOpts(-1, H, P), plan, toy.Views(), {shards[0].get(), shards[1].get()}, clock);
  Status st = no_id.Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("needs its own id"), std::string::npos) << st;
  learner::AgentGroup swapped(AgentOpts(0, H, P), plan, toy.Views(), {shards[1].get(), shards[0].get()}, clock);
  st = swapped.Start();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("shard order mismatch"), std::string::npos) << st;
  swapped.agent(0).Stop();
  swapped.agent(1).Stop();
  learner::AgentGroup one(AgentOpts(0, H, P), plan, toy.Views(), {shards[0].get()}, clock);
  st = one.Start();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("shard count mismatch"), std::string::npos) << st;
  one.agent(0).Stop();
}

TEST(LearnerAgent, KeepsTrainingWhileTheSyncerIsUnreachableThenJoins) {
  const int H = 2, P = 2;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  ClockThread participant(clock);  // this thread trains: time moves only while it waits too
  syncer::SyncerLoop loop(ToyCore(plan, H, 0.5f), clock, nullptr);
  learner::ShapedSyncerApi link(loop, {}, clock);
  link.SetPartitioned(true);
  ToyLearner toy(7);
  auto opts = AgentOpts(0, H, P);
  opts.initial_join_timeout_s = 0.2;
  learner::LearnerAgent agent(opts, plan, toy.Views(), link, clock);
  const TimePoint t0 = clock.Now();
  ASSERT_TRUE(agent.Start().ok());  // returns after the bounded wait, not joined
  EXPECT_EQ(clock.Now() - t0, FromSeconds(0.2));
  EXPECT_FALSE(agent.counters().joined);
  testing::TrainToy(toy, agent, 30, 2, clock);  // trains on: never blocks on the network
  EXPECT_EQ(agent.counters().pushes, 0);
  link.SetPartitioned(false);
  // The join is retried within one maximal backoff (0.2 s) of the link coming back.
  clock.SleepFor(FromSeconds(0.25));
  ASSERT_TRUE(agent.counters().joined);
  testing::TrainToy(toy, agent, 30, 2, clock);
  agent.WaitForAllFragments(60, 1.0);
  EXPECT_GT(agent.counters().pushes, 5);
  EXPECT_GE(agent.counters().catchup_fragments, P);
  agent.Stop();
}

// The after-step rule of a synchronous schedule (diloco mode): between barriers it only applies
// what has arrived; at the end of each H-step period it waits for every fragment pushed there, and
// that wait is bounded by AgentOptions::barrier_timeout_s.
TEST(LearnerAgent, AfterStepWaitsAtTheBarrierOnlyAndOnlyAsLongAsItsBound) {
  const int H = 4, P = 2;
  auto plan = testing::ToyPlan(P);
  std::vector<std::vector<float>> init;
  for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  syncer::SyncerOptions so = Options(H);
  so.mode = diloco::Mode::kDiloco;
  so.round.quorum = 2;  // K = M: every round waits for both learners
  so.round.grace = false;
  so.outer_step = syncer::OuterStepRule::kRound;
  auto core = syncer::SyncerCore::Create(so, plan, init);
  ASSERT_TRUE(core.ok()) << core.status();
  SimClock clock;
  syncer::SyncerLoop loop(std::move(*core), clock, nullptr);
  std::vector<std::vector<learner::StepResult>> results(2);
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);
    for (int id = 0; id < 2; ++id) {
      threads.push_back(StartThread(clock, [&, id] {
        learner::AgentOptions ao = AgentOpts(id, H, P);
        ao.schedule = diloco::Schedule::Of(diloco::Mode::kDiloco, H, P, 1);
        ao.barrier_timeout_s = 1.0;
        ToyLearner toy(300 + id);
        learner::LearnerAgent agent(ao, plan, toy.Views(), loop, clock);
        ASSERT_TRUE(agent.Start().ok());
        EXPECT_FALSE(agent.BarrierBefore(H - 1));
        EXPECT_TRUE(agent.BarrierBefore(H));
        // Both learners train one period; learner 1 then stops pushing (it stays live).
        const int steps = id == 0 ? 2 * H : H;
        for (int s = 0; s < steps; ++s) {
          toy.Step(0.05f);
          clock.SleepFor(std::chrono::milliseconds(10));
          results[static_cast<size_t>(id)].push_back(agent.AfterStep(s, 100));
        }
        if (id == 1) clock.SleepFor(FromSeconds(2.0));  // heartbeats go on through learner 0's second barrier
        agent.Stop();
      }));
    }
  }
  for (auto& t : threads) t.join();
  for (int id = 0; id < 2; ++id) {
    const auto& r = results[static_cast<size_t>(id)];
    for (int s = 0; s < H - 1; ++s) EXPECT_EQ(r[static_cast<size_t>(s)].barrier_wait_s, 0.0) << id << " step " << s;
    EXPECT_EQ(r[H - 1].applied, P) << "learner " << id << ": every fragment came back merged at the barrier";
    EXPECT_LT(r[H - 1].barrier_wait_s, 1.0) << "learner " << id << ": the round closed before the bound";
  }
  // Learner 0's second barrier: learner 1 never pushed, so no round closed; it waited its bound.
  const learner::StepResult second = results[0][2 * H - 1];
  EXPECT_EQ(second.applied, 0);
  EXPECT_GE(second.barrier_wait_s, 1.0);
  EXPECT_LT(second.barrier_wait_s, 2.0);
}

TEST(LearnerAgent, APartitionShorterThanTheLearnerTimeoutCostsNoTokens) {
  const int H = 4, P = 4, kTokens = 100;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  ClockThread participant(clock);
  syncer::SyncerLoop loop(ToyCore(plan, H, 0.5f), clock, nullptr);
  learner::ShapedSyncerApi link(loop, {}, clock);
  ToyLearner toy(3);
  learner::LearnerAgent agent(AgentOpts(0, H, P), plan, toy.Views(), link, clock);
  ASSERT_TRUE(agent.Start().ok());
  ASSERT_TRUE(agent.counters().joined);
  // Steps of 0.2 s (simulated): a merge is back before the fragment's next push, as in real runs.
  testing::TrainToy(toy, agent, 20, 200, clock, 0);
  link.SetPartitioned(true);  // 2 s: well below the 10 s learner timeout
  testing::TrainToy(toy, agent, 10, 200, clock, 20);
  link.SetPartitioned(false);
  testing::TrainToy(toy, agent, 30, 200, clock, 30);
  agent.FlushAll(60, 10.0);
  clock.SleepFor(FromSeconds(10));  // every open round's grace window runs out
  const auto c = agent.counters();
  EXPECT_GE(c.joins, 2) << "the partition should have forced a rejoin";
  // Pushes scheduled during the partition failed, or waited for a merge the partition held up.
  EXPECT_GT(c.pushes_failed + c.pushes_deferred, 0);
  const double merged = loop.Call([](syncer::SyncerCore& sc, TimePoint) { return sc.learners().at(0).tokens_merged; });
  EXPECT_DOUBLE_EQ(merged, 60.0 * kTokens);  // every token trained is merged once
  agent.Stop();
}

// Forwards to whichever syncer is current: a syncer process replaced by a restarted one.
class SwitchableApi : public syncer::SyncerApi {
 public:
  explicit SwitchableApi(syncer::SyncerApi* to) : to_(to) {}
  void Switch(syncer::SyncerApi* to) { to_ = to; }
  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& r) override { return to_.load()->Join(r); }
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int id, const syncer::LearnerProgress& p) override {
    return to_.load()->Heartbeat(id, p);
  }
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& h, std::span<const std::byte> b) override {
    return to_.load()->Push(h, b);
  }
  StatusOr<syncer::PullPayload> Pull(int id, int p, int64_t have, double wait, int64_t want) override {
    return to_.load()->Pull(id, p, have, wait, want);
  }
  Status Leave(int id) override { return to_.load()->Leave(id); }

 private:
  std::atomic<syncer::SyncerApi*> to_;
};

// Θ of every fragment, concatenated in fragment order.
std::vector<float> AllTheta(syncer::SyncerLoop& loop, int P) {
  return loop.Call([P](syncer::SyncerCore& c, TimePoint) {
    std::vector<float> all;
    for (int p = 0; p < P; ++p) all.insert(all.end(), c.theta(p).begin(), c.theta(p).end());
    return all;
  });
}

// A syncer killed mid-round, on simulated time. Syncer A waits for two learners per round and
// only learner 0 ever pushes to it: its rounds stay open, so A dies holding learner 0's pushes
// uncommitted (what a kill mid-round does). B starts from A's committed state (version 0
// everywhere), and learner 1 moves every fragment on before learner 0 reaches B.
class KilledSyncer : public ::testing::Test {
 protected:
  static constexpr int H = 2, P = 2;
  KilledSyncer() : plan_(testing::ToyPlan(P)), dir_(testing::ScratchDir("agent_restart")), durable_(dir_) {}
  ~KilledSyncer() override { std::filesystem::remove_all(dir_); }

  void SetUp() override {
    options_ = Options(H);
    options_.round.quorum = 2;
    options_.incarnation = 1;
    for (const auto& f : plan_.fragments) init_.emplace_back(static_cast<size_t>(f.numel), 0.5f);
    auto a_core = syncer::SyncerCore::Create(options_, plan_, init_);
    ASSERT_TRUE(a_core.ok());
    ASSERT_TRUE(durable_.SaveAll(*a_core).ok());
    a_ = std::make_unique<syncer::SyncerLoop>(std::move(*a_core), clock_, nullptr);
    start_ = AllTheta(*a_, P);
    current_ = std::make_unique<SwitchableApi>(a_.get());
    link_ = std::make_unique<learner::ShapedSyncerApi>(*current_, learner::ShaperOptions{}, clock_);
    agent0_ = std::make_unique<learner::LearnerAgent>(AgentOpts(0, H, P), plan_, toy0_.Views(), *link_, clock_);
    ASSERT_TRUE(agent0_->Start().ok());
  }
  void TearDown() override {
    if (agent0_) agent0_->Stop();
  }
  // A is killed; B restores its committed state; learner 1 trains `steps` at `eta` on B and leaves.
  void KillAAndLetLearner1MoveOn(int steps, float eta) {
    link_->SetPartitioned(true);
    options_.round.quorum = 1;
    options_.incarnation = 2;
    auto b_core = syncer::SyncerCore::Create(options_, plan_, init_);
    ASSERT_TRUE(b_core.ok());
    ASSERT_TRUE(durable_.Restore(*b_core, clock_.Now()).ok());
    b_ = std::make_unique<syncer::SyncerLoop>(std::move(*b_core), clock_, nullptr);
    current_->Switch(b_.get());
    a_.reset();
    ToyLearner toy1(4);
    learner::LearnerAgent agent1(AgentOpts(1, H, P), plan_, toy1.Views(), *b_, clock_);
    ASSERT_TRUE(agent1.Start().ok());
    testing::TrainToy(toy1, agent1, steps, 200, clock_, 0, eta);
    agent1.FlushAll(steps, 10.0);
    agent1.Stop();
  }
  // Learner 0 reaches B and trains on to step 20 at `eta`; every open round's grace runs out.
  void Learner0ReachesB(int first, float eta) {
    link_->SetPartitioned(false);
    testing::TrainToy(toy0_, *agent0_, 20 - first, 200, clock_, first, eta);
    agent0_->FlushAll(20, 10.0);
    clock_.SleepFor(FromSeconds(10));
  }
  double MergedOfLearner0() {
    return b_->Call([](syncer::SyncerCore& sc, TimePoint) { return sc.learners().at(0).tokens_merged; });
  }

  diloco::FragmentPlan plan_;
  std::string dir_;
  syncer::DurableState durable_;
  SimClock clock_;
  ClockThread participant_{clock_};
  syncer::SyncerOptions options_;
  std::vector<std::vector<float>> init_;
  std::vector<float> start_;
  std::unique_ptr<syncer::SyncerLoop> a_, b_;
  std::unique_ptr<SwitchableApi> current_;
  std::unique_ptr<learner::ShapedSyncerApi> link_;
  ToyLearner toy0_{3};
  std::unique_ptr<learner::LearnerAgent> agent0_;
};

TEST_F(KilledSyncer, APushItNeverCommittedIsPushedAgainEvenIfOthersMovedTheVersionOn) {
  testing::TrainToy(toy0_, *agent0_, 6, 200, clock_, 0);
  ASSERT_GE(agent0_->counters().pushes, P);  // every fragment pushed, none merged
  // Learner 1 moves every fragment to version 1 — the version A had promised learner 0.
  KillAAndLetLearner1MoveOn(2, 0.05f);
  const auto versions = b_->Call([](syncer::SyncerCore& c, TimePoint) { return c.versions(); });
  for (int64_t v : versions) ASSERT_GE(v, 1);
  // Learner 0 reaches B: its pushes were never merged, whatever B's versions say.
  Learner0ReachesB(6, 0.05f);
  EXPECT_GE(agent0_->counters().pushes_repeated, 1);
  EXPECT_DOUBLE_EQ(MergedOfLearner0(), 20.0 * 100);  // every token learner 0 trained is merged, once
}

std::vector<float> AllParams(const diloco::FragmentPlan& plan, ToyLearner& toy) {
  std::vector<float> all;
  for (const auto& f : plan.fragments) {
    std::vector<float> v(static_cast<size_t>(f.numel));
    exchange::GatherFragment(f, toy.Views(), v);
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

double Distance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::pow(static_cast<double>(a[i]) - b[i], 2);
  return std::sqrt(d);
}

// A learner back from a syncer restart whose pushes the dead syncer never committed keeps that
// progress while others moved the fragments on: it moves its parameters onto the new public
// copies (a rebase), so its next pushes carry its own progress only. Measured against the
// refreshed copy without the rebase they carried Φ_new − Φ_old as well, which undid every merge
// made while it was away (on a real run large enough to be quarantined as an outlier: the
// never-killed learner of the syncer-kill chaos run lost that push's tokens).
TEST_F(KilledSyncer, TheKeptProgressIsRebasedOntoTheNewCopiesNotPushedAgainstThem) {
  testing::TrainToy(toy0_, *agent0_, 6, 200, clock_, 0);
  // Its progress from here on: none (η = 0), so its parameters only move with what it receives.
  std::vector<float> progress = AllParams(plan_, toy0_);
  for (size_t i = 0; i < progress.size(); ++i) progress[i] -= start_[i];
  KillAAndLetLearner1MoveOn(8, 0.3f);
  const std::vector<float> moved = AllTheta(*b_, P);
  ASSERT_GT(Distance(moved, start_), 1.0);
  // Learner 0 reaches B: it rejoins, refreshes both fragments and pushes its progress again.
  Learner0ReachesB(6, 0.0f);
  const auto c = agent0_->counters();
  EXPECT_GE(c.pushes_repeated, 1);
  EXPECT_GE(c.rebases, 1);
  // Outer lr 1, no momentum, one contributor per round: Θ = where learner 1 left it plus learner
  // 0's progress, scaled by its share of the round (learner 1, gone a moment ago, is still a
  // member: decisions/020) — up to the int4 uplink's rounding. Not learner 0's old parameters.
  const std::vector<float> after = AllTheta(*b_, P);
  double dot = 0, norm2 = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    dot += (static_cast<double>(after[i]) - moved[i]) * progress[i];
    norm2 += static_cast<double>(progress[i]) * progress[i];
  }
  const double share = dot / norm2;
  std::vector<float> expected = moved;
  for (size_t i = 0; i < expected.size(); ++i) expected[i] += static_cast<float>(share * progress[i]);
  EXPECT_GT(share, 0.3);
  EXPECT_LT(share, 1.05);
  EXPECT_LT(Distance(after, expected), 0.05 * Distance(moved, start_))
      << "start→moved " << Distance(moved, start_) << ", expected→after " << Distance(after, expected)
      << ", ‖progress‖ " << std::sqrt(norm2) << ", share " << share;
  // Learner 0's parameters moved with the copies: they are the global model now.
  EXPECT_LT(Distance(AllParams(plan_, toy0_), after), 0.05 * Distance(moved, start_));
  EXPECT_DOUBLE_EQ(MergedOfLearner0(), 20.0 * 100);
}

TEST(SyncerLoop, ALongPollThatWantsALaterVersionSleepsThroughTheRoundsInBetween) {
  auto plan = testing::ToyPlan(2);
  auto options = Options(2);
  options.round.grace = false;
  options.uplink = options.downlink = {diloco::Encoding::kFp32, 64};
  std::vector<std::vector<float>> init;
  for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.5f);
  auto core = syncer::SyncerCore::Create(options, plan, init);
  ASSERT_TRUE(core.ok());
  SimClock clock;
  ClockThread participant(clock);
  syncer::SyncerLoop loop(std::move(*core), clock, nullptr);
  for (int id = 0; id < 2; ++id) {
    syncer::JoinRequestData r{
        syncer::kProtocolVersion, "toy", diloco::ModelSignature(plan.tensors), id, "t", false, {}, {}, {}};
    ASSERT_TRUE(loop.Join(r).ok());
    ASSERT_TRUE(loop.Pull(id, 0, -1, 0.0, -1).ok());
  }
  const int64_t n = plan.fragments[0].numel;
  auto push = [&](int id) {
    std::vector<float> delta(static_cast<size_t>(n), 0.1f);
    std::vector<std::byte> payload(delta.size() * sizeof(float));
    std::memcpy(payload.data(), delta.data(), payload.size());
    syncer::PushHeaderData h{id, 0, 0, 10, 1, diloco::Encoding::kFp32, 64, n, 0};
    h = loop.Call([&](syncer::SyncerCore& c, TimePoint) { return testing::Stamped(c, h); });
    ASSERT_TRUE(loop.Push(h, payload).ok());
  };
  // Learner 0 waits (up to 5 s) for version 2, the merge its push was promised.
  std::atomic<int64_t> got{-1};
  std::thread waiter = StartThread(clock, [&] {
    auto r = loop.Pull(0, 0, 0, 5.0, 2);
    got = r.ok() && !r->not_modified ? r->version : -2;
  });
  push(1);  // version 1: someone else's round
  clock.SleepFor(FromSeconds(1));
  ASSERT_EQ(loop.Call([](syncer::SyncerCore& c, TimePoint) { return c.version(0); }), 1);
  EXPECT_EQ(got.load(), -1);  // still parked: version 1 is not worth a download
  push(0);                    // version 2
  clock.SleepFor(FromSeconds(1));
  EXPECT_EQ(got.load(), 2);
  clock.SleepFor(FromSeconds(5));  // the waiter is done by now, whatever happened
  waiter.join();
}

// A learner process that restarts with its state folder (AgentOptions::state_dir) offers the
// public copies its previous process held: the syncer recognises their versions, the catch-up is
// deltas (no full fetch), and its model starts from those copies, not from the seed.
// Forwards to the syncer and keeps the last push it forwarded (a captured push, to replay).
class CapturingApi : public syncer::SyncerApi {
 public:
  explicit CapturingApi(syncer::SyncerApi& to) : to_(to) {}
  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& r) override { return to_.Join(r); }
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int id, const syncer::LearnerProgress& p) override {
    return to_.Heartbeat(id, p);
  }
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& h, std::span<const std::byte> b) override {
    auto r = to_.Push(h, b);
    std::lock_guard<std::mutex> lock(mu_);
    if (r.ok()) last_ = {h, {b.begin(), b.end()}};
    return r;
  }
  StatusOr<syncer::PullPayload> Pull(int id, int p, int64_t have, double wait, int64_t want) override {
    return to_.Pull(id, p, have, wait, want);
  }
  Status Leave(int id) override { return to_.Leave(id); }
  std::pair<syncer::PushHeaderData, std::vector<std::byte>> last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  syncer::SyncerApi& to_;
  std::mutex mu_;
  std::pair<syncer::PushHeaderData, std::vector<std::byte>> last_;
};

TEST(LearnerAgent, ARestartedLearnerPushesInANewSessionAndItsEarlierPushesStayRefused) {
  const int H = 4, P = 4;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  syncer::SyncerLoop loop(ToyCore(plan, H, 0.0f), clock, nullptr);
  testing::ToyLearner first(310), second(310);
  CapturingApi before(loop), after(loop);
  learner::AgentCounters restarted;
  std::thread t;
  {
    ClockThread setup(clock);
    t = StartThread(clock, [&] {
      {
        learner::LearnerAgent agent(AgentOpts(0, H, P), plan, first.Views(), before, clock);
        ASSERT_TRUE(agent.Start().ok());
        testing::TrainToy(first, agent, 24, 3, clock);
        agent.Stop();  // killed: the new process knows nothing of the old one's numbers
      }
      auto o = AgentOpts(0, H, P);
      o.rejoin = true;
      learner::LearnerAgent agent(o, plan, second.Views(), after, clock);
      ASSERT_TRUE(agent.Start().ok());
      testing::TrainToy(second, agent, 24, 3, clock);
      restarted = agent.counters();
      // What was captured of either process is refused when sent again (while the restarted
      // learner is live: after it stops, the syncer refuses its pushes for its silence anyway).
      auto [old_header, old_payload] = before.last();
      ASSERT_GT(old_header.push_seq, 0u);
      const Status old_session = loop.Push(old_header, old_payload).status();
      EXPECT_EQ(old_session.code(), StatusCode::kNotFound) << old_session;
      EXPECT_NE(old_session.message().find("join again first"), std::string::npos) << old_session;
      auto [new_header, new_payload] = after.last();
      EXPECT_NE(new_header.push_session, old_header.push_session);
      const Status replayed = loop.Push(new_header, new_payload).status();
      EXPECT_EQ(replayed.code(), StatusCode::kAlreadyExists) << replayed;
      agent.Stop();
    });
  }
  t.join();  // outside the setup's scope: a participant blocked in join would stop the clock
  // The restarted process numbers its pushes from 1 again, in the session of its own join: none refused.
  EXPECT_GT(restarted.pushes, 4);
  EXPECT_EQ(restarted.pushes_failed, 0);
  EXPECT_EQ(restarted.rejected, 0);
}

TEST(LearnerAgent, ARestartedLearnerResumesFromItsStateWithDeltas) {
  const int H = 4, P = 4;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  syncer::SyncerLoop loop(ToyCore(plan, H, 0.0f), clock, nullptr);
  const std::string dir = testing::ScratchDir("agent_state");
  std::filesystem::remove_all(dir);  // the agent makes its state folder
  testing::ToyLearner first(300), other(301), second(300);
  learner::AgentCounters before, after;
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);
    threads.push_back(StartThread(clock, [&] {  // keeps the global model moving throughout
      learner::LearnerAgent agent(AgentOpts(1, H, P), plan, other.Views(), loop, clock);
      ASSERT_TRUE(agent.Start().ok());
      testing::TrainToy(other, agent, 60, 3, clock);
      agent.Stop();
    }));
    threads.push_back(StartThread(clock, [&] {
      auto o = AgentOpts(0, H, P);
      o.state_dir = dir;
      {
        learner::LearnerAgent agent(o, plan, first.Views(), loop, clock);
        ASSERT_TRUE(agent.Start().ok());
        testing::TrainToy(first, agent, 20, 3, clock);
        before = agent.counters();
        agent.Stop();  // "killed": no Leave, no final sync
      }
      clock.SleepFor(std::chrono::milliseconds(15));  // a few rounds of the other learner meanwhile
      o.rejoin = true;
      learner::LearnerAgent agent(o, plan, second.Views(), loop, clock);  // a new process: seed values
      ASSERT_TRUE(agent.Start().ok());
      after = agent.counters();
      agent.Stop();
    }));
  }
  for (auto& t : threads) t.join();
  EXPECT_GT(before.pulls_delta, 0);
  EXPECT_EQ(after.state_loaded, P);
  EXPECT_EQ(after.pulls_full, 0);
  EXPECT_EQ(after.checksum_mismatches, 0);
  // The model starts from the global copies, not from the seed's zeros.
  double moved = 0;
  for (const auto& t : second.params) {
    for (float v : t) moved += std::fabs(v);
  }
  EXPECT_GT(moved, 0.0);
  // A damaged state file is ignored: that fragment alone is fetched as usual.
  {
    std::fstream f(dir + "/fragment-000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(48);
    f.put('\x7f');
  }
  testing::ToyLearner third(300);
  SimClock clock2;
  syncer::SyncerLoop loop2(ToyCore(plan, H, 0.0f), clock2, nullptr);
  {
    ClockThread scope(clock2);
    auto o = AgentOpts(0, H, P);
    o.state_dir = dir;
    learner::LearnerAgent agent(o, plan, third.Views(), loop2, clock2);
    ASSERT_TRUE(agent.Start().ok());
    EXPECT_EQ(agent.counters().state_loaded, P - 1);
    agent.Stop();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
