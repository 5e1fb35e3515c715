// Staged tensors (AgentOptions::staged): a learner whose live parameters are elsewhere (here a
// separate copy, as a GPU's would be) sends parked fragments with Send and applies the receipts
// itself; its model must be the model of a learner whose parameters the agent shares. Two
// identical learners train against one syncer (quorum 2: every round merges both identical pushes,
// so both receive the same Θ), on simulated time, so no outcome depends on the machine's load.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <thread>

#include "atoll/core/sim_clock.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/syncer/syncer_loop.h"
#include "testing/toy_learner.h"

namespace atl {
namespace {

using testing::ToyLearner;

std::unique_ptr<syncer::SyncerLoop> MakeLoop(const diloco::FragmentPlan& plan, int H, Clock& clock) {
  std::vector<std::vector<float>> values;
  for (const auto& f : plan.fragments) values.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  syncer::SyncerOptions o;
  o.run_id = "toy";
  o.H = H;
  o.round.quorum = 2;
  o.round.tau = 1;
  o.outer = {1.0, 0.0, true};
  auto core = syncer::SyncerCore::Create(o, plan, values);
  ATOLL_CHECK(core.ok());
  return std::make_unique<syncer::SyncerLoop>(std::move(*core), clock, nullptr);
}

learner::AgentOptions Opts(int id, int H, int P, double alpha, bool keep_progress) {
  learner::AgentOptions a;
  a.run_id = "toy";
  a.learner_id = id;
  a.schedule = {H, P, 1};
  a.heartbeat_s = 0.05;
  a.alpha = alpha;
  a.keep_progress = keep_progress;
  a.initial_join_timeout_s = 5;
  return a;
}

// The staged learner's side of a step: the parked sends get their values from `live`, and the
// receipts the agent wrote into `host` are applied to `live`, as the Python package does (the
// shared tensors are `live` itself).
struct StagedSide {
  const diloco::FragmentPlan& plan;
  std::vector<bool> staged;
  std::vector<std::vector<float>>& live;
  std::vector<std::vector<float>>& host;
  double alpha;
  int64_t sends = 0, receipts = 0, additive = 0;

  std::vector<float> StagedValues(int p) const {
    std::vector<float> values;
    for (const auto& s : plan.fragments[static_cast<size_t>(p)].slices) {
      if (!staged[static_cast<size_t>(s.tensor)]) continue;
      const auto& t = live[static_cast<size_t>(s.tensor)];
      values.insert(values.end(), t.begin() + s.offset, t.begin() + s.offset + s.count);
    }
    return values;
  }
  // Before OnStep(step): the due fragments' values at once.
  void Provide(learner::LearnerAgent& agent, int64_t step) {
    for (int p : agent.DueAt(step)) {
      if (agent.staged_numel(p) == 0) continue;
      ASSERT_TRUE(agent.Send(p, StagedValues(p), step).ok());
      ++sends;
    }
  }
  // After OnStep: the parked ones.
  void SendPending(learner::LearnerAgent& agent, int64_t next_step) {
    for (int p : agent.PendingSends()) {
      ASSERT_TRUE(agent.Send(p, StagedValues(p), next_step).ok());
      ++sends;
    }
  }
  void ApplyReceipts(const learner::LearnerAgent& agent) {
    for (const auto& r : agent.receipts()) {
      ++receipts;
      additive += r.additive ? 1 : 0;
      for (const auto& s : plan.fragments[static_cast<size_t>(r.fragment)].slices) {
        const size_t t = static_cast<size_t>(s.tensor);
        if (!staged[t]) continue;  // shared: the agent wrote the final values in place
        for (int64_t i = s.offset; i < s.offset + s.count; ++i) {
          float& v = live[t][static_cast<size_t>(i)];
          const float x = host[t][static_cast<size_t>(i)];
          v = r.additive ? v + x : static_cast<float>(alpha * v + (1 - alpha) * x);
        }
      }
    }
  }
};

struct Outcome {
  double max_diff = 0;
  int64_t sends = 0, receipts = 0, additive = 0, applied_shared = 0;
};

Outcome TrainSharedAndStaged(double alpha, bool keep_progress, bool provide_before) {
  const int H = 4, P = 4, kSteps = 48;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  auto loop = MakeLoop(plan, H, clock);
  ToyLearner shared(7), staged(7);                       // the same targets: the same training
  std::vector<std::vector<float>> host = staged.params;  // what the staged agent sees
  StagedSide side{plan, {true, false, true}, staged.params, host, alpha};
  Outcome out;
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);
    threads.push_back(StartThread(clock, [&] {
      learner::LearnerAgent agent(Opts(0, H, P, alpha, keep_progress), plan, shared.Views(), *loop, clock);
      ASSERT_TRUE(agent.Start().ok());
      testing::TrainToy(shared, agent, kSteps, 3, clock);
      out.applied_shared = agent.counters().fragments_applied;
      agent.Stop();
    }));
    threads.push_back(StartThread(clock, [&] {
      auto o = Opts(1, H, P, alpha, keep_progress);
      o.staged = side.staged;
      std::vector<std::span<float>> views;  // staged tensors through their host copies, the rest shared
      for (size_t t = 0; t < host.size(); ++t) views.emplace_back(side.staged[t] ? host[t] : staged.params[t]);
      learner::LearnerAgent agent(o, plan, views, *loop, clock);
      ASSERT_TRUE(agent.Start().ok());
      side.ApplyReceipts(agent);
      for (int s = 0; s < kSteps; ++s) {
        staged.Step(0.05f);
        clock.SleepFor(std::chrono::milliseconds(3));
        if (provide_before) side.Provide(agent, s);
        agent.OnStep(s, 100);
        if (provide_before) {
          EXPECT_TRUE(agent.PendingSends().empty());
        }
        side.SendPending(agent, s + 1);
        agent.ApplyReady(s + 1);
        side.ApplyReceipts(agent);
      }
      agent.Stop();
    }));
  }
  for (auto& t : threads) t.join();
  for (size_t t = 0; t < shared.params.size(); ++t) {
    for (size_t i = 0; i < shared.params[t].size(); ++i) {
      out.max_diff = std::max(out.max_diff, std::fabs(double(shared.params[t][i]) - staged.params[t][i]));
    }
  }
  out.sends = side.sends;
  out.receipts = side.receipts;
  out.additive = side.additive;
  return out;
}

TEST(StagedAgent, ReceiptsOnStagedTensorsGiveTheSharedLearnersModel) {
  for (double alpha : {0.0, 0.5}) {
    for (bool keep : {true, false}) {
      for (bool before : {false, true}) {
        SCOPED_TRACE("alpha " + std::to_string(alpha) + ", keep_progress " + std::to_string(keep) +
                     (before ? ", values provided before the step" : ", parked sends"));
        const Outcome o = TrainSharedAndStaged(alpha, keep, before);
        EXPECT_GT(o.sends, 8);
        EXPECT_GT(o.receipts, 8);
        EXPECT_EQ(o.receipts, o.applied_shared) << "both learners took in the same merges";
        EXPECT_EQ(o.additive > 0, keep) << "own merges with kept progress are additive receipts, and only those";
        // The same model up to the rounding of θ + (Θ − θ_sent) against Θ + (θ − θ_sent).
        EXPECT_LT(o.max_diff, 1e-5);
      }
    }
  }
}

TEST(StagedAgent, SendTakesOnlyDueOrParkedFragmentsWithTheirCount) {
  const int H = 4, P = 4;
  auto plan = testing::ToyPlan(P);
  SimClock clock;
  auto loop = MakeLoop(plan, H, clock);
  ToyLearner toy(3);
  ClockThread scope(clock);
  auto o = Opts(0, H, P, 0.0, true);
  o.staged.assign(3, true);
  learner::LearnerAgent agent(o, plan, toy.Views(), *loop, clock);
  ASSERT_TRUE(agent.Start().ok());
  int64_t staged_total = 0;
  for (int p = 0; p < P; ++p) staged_total += agent.staged_numel(p);
  EXPECT_EQ(staged_total, plan.total_numel);
  auto values = [&](int p, int extra = 0) {
    return std::vector<float>(static_cast<size_t>(agent.staged_numel(p) + extra), 0.5f);
  };
  ASSERT_EQ(agent.DueAt(0), std::vector<int>{0});
  EXPECT_EQ(agent.Send(0, values(0, 1), 0).code(), StatusCode::kInvalidArgument) << "the wrong count";
  EXPECT_EQ(agent.Send(1, values(1), 0).code(), StatusCode::kInvalidArgument) << "not due at step 0";
  EXPECT_EQ(agent.Send(7, {}, 0).code(), StatusCode::kInvalidArgument) << "no such fragment";
  agent.OnStep(0, 10);  // nothing provided: fragment 0 is parked
  ASSERT_EQ(agent.sent_at_last_step(), std::vector<int>{0});
  ASSERT_EQ(agent.PendingSends(), std::vector<int>{0});
  EXPECT_EQ(agent.Send(0, values(0, 1), 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agent.PendingSends(), std::vector<int>{0}) << "a refused send changes nothing";
  EXPECT_TRUE(agent.Send(0, values(0), 1).ok());
  EXPECT_TRUE(agent.PendingSends().empty());
  ASSERT_EQ(agent.DueAt(1), std::vector<int>{1});
  EXPECT_TRUE(agent.Send(1, values(1), 1).ok());  // provided before its step: sent at once
  agent.OnStep(1, 10);
  EXPECT_EQ(agent.sent_at_last_step(), std::vector<int>{1});
  EXPECT_TRUE(agent.PendingSends().empty());
  agent.Stop();
}

}  // namespace
}  // namespace atl
