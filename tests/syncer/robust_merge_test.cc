// One compromised learner among honest ones, with only its own credential: its pushes are judged
// against the other learners' latest pushes (upper medians), its claimed counters are bounded by
// theirs, and the references survive a restart (docs/security.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <unistd.h>

#include "atoll/core/clock.h"
#include "atoll/syncer/durable_state.h"
#include "testing/small_core.h"
#include "testing/scratch.h"

namespace atl::syncer {
namespace {

using testing::Fp32Values;
using testing::SmallCore;
using testing::SmallHeader;
using testing::SmallJoin;
using testing::SmallOptions;

constexpr int kAttacker = 3;

// Judged from the first push on (the run's default waits for the fragment's 8th version).
SyncerOptions RobustOptions() {
  SyncerOptions o = SmallOptions();
  o.quarantine_min_history = 0;
  return o;
}
constexpr float kHonest = 0.01f;  // every value of an honest push: size 0.02 at c_steps 1

// RobustOptions with period H and `learners` joined at `clock`'s instant.
SyncerCore JoinedCore(int H, int learners, const ManualClock& clock) {
  SyncerOptions o = RobustOptions();
  o.H = H;
  SyncerCore core = SmallCore(o);
  for (int id = 0; id < learners; ++id) EXPECT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
  return core;
}

class RobustMerge : public ::testing::Test {
 protected:
  RobustMerge() : core_(SmallCore(RobustOptions())) {
    for (int id = 0; id < 4; ++id) EXPECT_TRUE(core_.Join(SmallJoin(id), clock_.Now()).ok());
  }
  // Learner `id` pushes fragment 0 with every value `v` and the given counters; the round closes.
  StatusOr<PushResult> Push(int id, float v, int64_t c_tokens = 100, int64_t c_steps = 1, bool final_sync = false) {
    clock_.AdvanceSeconds(1e-6);  // each push at its own instant: one judges those before it
    PushHeaderData h = SmallHeader(core_, id, 0, core_.version(0));
    h.c_tokens = c_tokens;
    h.c_steps = c_steps;
    h.final_sync = final_sync;
    auto r = core_.Push(h, Fp32Values(v), clock_.Now());
    last_rounds_ = core_.Poll(clock_.Now(), clock_);
    return r;
  }
  void HonestRound() {
    for (int id = 0; id < 3; ++id) {
      auto r = Push(id, kHonest);
      ASSERT_TRUE(r.ok()) << "learner " << id << r.status();
    }
  }
  static bool Quarantined(const StatusOr<PushResult>& r) {
    return !r.ok() && r.status().message().find("quarantined") != std::string::npos;
  }

  ManualClock clock_;
  SyncerCore core_;
  std::vector<RoundReport> last_rounds_;
};

TEST_F(RobustMerge, ZeroPushesNeverFreezeTheHonestLearners) {
  HonestRound();
  // 40 rounds of zero outer gradients (more than the 32-version window): what remains of each is
  // the public copy's rounding, orders of magnitude below an honest push.
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Push(kAttacker, 0.0f).ok());
  for (int i = 0; i < 3; ++i) HonestRound();
  EXPECT_EQ(core_.learners().at(0).quarantined, 0);
  EXPECT_EQ(core_.learners().at(1).quarantined, 0);
  EXPECT_EQ(core_.learners().at(2).quarantined, 0);
}

TEST_F(RobustMerge, AClaimedStepCountDoesNotHideALargePush) {
  HonestRound();
  // 100x an honest push, its size divided by √(2⁴⁰) if c_steps were believed: bounded to 16x the
  // others' steps, it is 25x their size.
  auto r = Push(kAttacker, 1.0f, 100, int64_t{1} << 40);
  EXPECT_TRUE(Quarantined(r)) << r.status();
  EXPECT_NE(r.status().message().find("other learners"), std::string::npos) << r.status();
  EXPECT_EQ(core_.learners().at(kAttacker).samples.at(0).steps, 16.0);  // counted as 16 steps
}

TEST_F(RobustMerge, TheReferenceDoesNotFollowTheAttacker) {
  HonestRound();
  // Just inside the limit (19x the honest size) is merged, as often as it is sent; 19x that is
  // judged against the honest learners again, not against the attacker's own history.
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Push(kAttacker, kHonest * 19).ok());
  EXPECT_TRUE(Quarantined(Push(kAttacker, kHonest * 19 * 19)));
  EXPECT_EQ(core_.learners().at(kAttacker).quarantined, 1);
}

TEST(RobustMergeWarmUp, AFragmentsFirstVersionsAreNotJudged) {
  SyncerCore core = SmallCore(SmallOptions());  // quarantine_min_history 8
  ManualClock clock;
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
  auto push = [&](int id, float v) {
    return core.Push(SmallHeader(core, id, 0, core.version(0)), Fp32Values(v), clock.Now());
  };
  for (int id = 0; id < 3; ++id) {
    ASSERT_TRUE(push(id, kHonest).ok());
    core.Poll(clock.Now(), clock);
  }
  EXPECT_TRUE(push(0, kHonest * 50).ok());  // version 3: a warm-up's growth passes
  for (int i = 0; core.version(0) < 8; ++i) {
    core.Poll(clock.Now(), clock);
    ASSERT_TRUE(push(1 + i % 2, kHonest).ok());
  }
  core.Poll(clock.Now(), clock);
  auto late = push(0, kHonest * 1000);
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("quarantined"), std::string::npos) << late.status();
}

TEST_F(RobustMerge, HonestLearnersAfterARealChangeLiftEachOthersReference) {
  HonestRound();
  // Every honest outer gradient grows 50x at once (a change of Θ, a learning-rate jump): the
  // first is judged against its peers' old sizes; its size is recorded all the same, so the
  // others pass, and so does the first at its next push. Nothing stays frozen.
  EXPECT_TRUE(Quarantined(Push(0, kHonest * 50)));
  EXPECT_TRUE(Push(1, kHonest * 50).ok());
  EXPECT_TRUE(Push(2, kHonest * 50).ok());
  EXPECT_TRUE(Push(0, kHonest * 50).ok());
}

// The pushes that end a learner's schedule (a final sync's remainder over a step or two, at the
// bottom of its learning-rate decay) are judged, but set no reference: two learners that finished
// must not make a third learner's period-long push, still mid-run, look like an outlier. On a
// real run (the syncer-kill chaos run) such a push was quarantined at 23-35x and its 41 steps
// were lost.
TEST(RobustMergeReferences, AFinalSyncOrAFewStepsSetNoReference) {
  ManualClock clock;
  SyncerCore core = JoinedCore(8, 3, clock);
  auto push = [&](int id, float v, int64_t c_steps, bool final_sync) {
    clock.AdvanceSeconds(1e-6);  // each push at its own instant
    PushHeaderData h = SmallHeader(core, id, 0, core.version(0));
    h.c_steps = c_steps;
    h.c_tokens = 100 * c_steps;
    h.final_sync = final_sync;
    auto r = core.Push(h, Fp32Values(v), clock.Now());
    core.Poll(clock.Now(), clock);
    return r;
  };
  for (int id = 0; id < 3; ++id) {
    auto r = push(id, kHonest, 8, false);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  const PushSample before = core.learners().at(0).samples.at(0);
  // Learner 0's final sync and learner 1's push over 2 steps: each 1/80 of a period's progress,
  // so their sizes are ~28x below a period-long push.
  ASSERT_TRUE(push(0, kHonest / 80, 1, true).ok());
  ASSERT_TRUE(push(1, kHonest / 80, 2, false).ok());
  EXPECT_EQ(core.learners().at(0).samples.at(0).version, before.version);
  EXPECT_DOUBLE_EQ(core.learners().at(0).samples.at(0).size, before.size);
  // Learner 2's next period-long push is judged against their period-long pushes, and passes.
  auto r = push(2, kHonest, 8, false);
  EXPECT_TRUE(r.ok()) << r.status();
  // A push over half a period or more is a reference again.
  ASSERT_TRUE(push(0, kHonest / 2, 4, false).ok());
  EXPECT_GT(core.learners().at(0).samples.at(0).version, before.version);
}

TEST(RobustMergeWeights, ClaimedTokensCannotOutvoteTheOthers) {
  SyncerOptions o = RobustOptions();
  o.round.quorum = 4;  // one round holds all four pushes
  SyncerCore core = SmallCore(o);
  ManualClock clock;
  for (int id = 0; id < 4; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
  auto push = [&](int id, int64_t c_tokens) {
    clock.AdvanceSeconds(1e-6);  // each push at its own instant: one judges those before it
    PushHeaderData h = SmallHeader(core, id, 0, core.version(0));
    h.c_tokens = c_tokens;
    return core.Push(h, Fp32Values(kHonest), clock.Now());
  };
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(push(id, 100).ok());
  ASSERT_EQ(core.Poll(clock.Now(), clock).size(), 0u);
  auto r = push(kAttacker, int64_t{1} << 40);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->note.find("c_tokens 1099511627776 bounded to 400"), std::string::npos) << r->note;  // 4x their rate
  EXPECT_NE(r->note.find("merge weight bounded"), std::string::npos) << r->note;
  auto rounds = core.Poll(clock.Now(), clock);
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_EQ(rounds[0].weights.size(), 4u);
  EXPECT_DOUBLE_EQ(rounds[0].weights[3], 4 * rounds[0].weights[0]);  // the weight bound: 4x the others'
  EXPECT_DOUBLE_EQ(core.tokens_merged(), (3 * 100 + 400) / 2.0);     // the claimed 2⁴⁰ tokens are not counted
}

TEST_F(RobustMerge, TheReferencesSurviveARestart) {
  HonestRound();
  const std::string dir = testing::ScratchDir("robust");
  DurableState state(dir);
  ASSERT_TRUE(state.SaveAll(core_).ok());
  SyncerCore restarted = SmallCore(RobustOptions());
  ASSERT_TRUE(state.Restore(restarted, clock_.Now()).ok());
  const PushSample& s = restarted.learners().at(1).samples.at(0);
  EXPECT_EQ(s.version, core_.learners().at(1).samples.at(0).version);
  EXPECT_DOUBLE_EQ(s.size, core_.learners().at(1).samples.at(0).size);
  // The first push after the restart is judged at once, not after a new history has built up.
  JoinRequestData again = SmallJoin(kAttacker);
  again.rejoin = true;
  ASSERT_TRUE(restarted.Join(again, clock_.Now()).ok());
  PushHeaderData h = SmallHeader(restarted, kAttacker, 0, restarted.version(0));
  auto r = restarted.Push(h, Fp32Values(kHonest * 100), clock_.Now());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quarantined"), std::string::npos) << r.status();
  std::filesystem::remove_all(dir);
}

// Influence (docs/decisions/020): a push counts in its round's share and votes in its merge only as
// far as its size and direction agree with the other learners' latest pushes.

TEST_F(RobustMerge, APushFarLargerThanTheOthersMovesThetaNoFartherThanTheirs) {
  HonestRound();
  ASSERT_TRUE(Push(0, kHonest).ok());
  ASSERT_EQ(last_rounds_.size(), 1u);
  const double honest_step = last_rounds_[0].step_norm;
  // 19x the others' size: inside the quarantine's 20x, so merged — about as far as a push of twice
  // their size (the bound, influence_size_factor; its outer gradient is taken against the current Θ,
  // a little off its own Δ), not 19x.
  auto r = Push(kAttacker, kHonest * 19);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->note.find("influence 0.105"), std::string::npos) << r->note;
  ASSERT_EQ(last_rounds_.size(), 1u);
  EXPECT_LT(last_rounds_[0].step_norm, 2.5 * honest_step);
}

TEST_F(RobustMerge, APushAgainstTheOthersDirectionMovesNothing) {
  HonestRound();
  ASSERT_TRUE(Push(0, kHonest).ok());
  const double honest_step = last_rounds_.at(0).step_norm;
  auto r = Push(kAttacker, -kHonest);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->note.find("agrees with the others' by -1.000"), std::string::npos) << r->note;
  ASSERT_EQ(last_rounds_.size(), 1u);
  EXPECT_EQ(last_rounds_[0].weights, std::vector<double>{0.0});
  EXPECT_LT(last_rounds_[0].step_norm, 1e-5 * honest_step);
  EXPECT_EQ(core_.learners().at(kAttacker).samples.at(0).influence, 0.0);
}

// Pushes that arrive at the same instant (as on simulated time) are judged by the others' pushes
// as they stood before it: the order the threads delivered them in changes nothing.
TEST(RobustMergeSameInstant, PushesArrivingTogetherAreJudgedTheSameInEitherOrder) {
  std::vector<double> influence[2], weights[2];
  for (int order = 0; order < 2; ++order) {
    ManualClock clock;
    SyncerCore core = SmallCore(RobustOptions());
    for (int id = 0; id < 4; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
    const auto push = [&](int id, float v) {
      PushHeaderData h = SmallHeader(core, id, 0, core.version(0));
      h.c_tokens = 100;
      h.c_steps = 1;
      auto r = core.Push(h, Fp32Values(v), clock.Now());
      ASSERT_TRUE(r.ok()) << r.status();
    };
    for (int id = 0; id < 4; ++id) {
      clock.AdvanceSeconds(1);
      push(id, kHonest);
      core.Poll(clock.Now(), clock);
    }
    clock.AdvanceSeconds(1);
    // At one instant learners 1 and 2 turn against the others and learner 0 pushes as before.
    if (order == 0) {
      push(1, -kHonest);
      push(2, -kHonest);
      push(0, kHonest);
    } else {
      push(0, kHonest);
      push(1, -kHonest);
      push(2, -kHonest);
    }
    for (int id : {0, 1, 2}) influence[order].push_back(core.learners().at(id).samples.at(0).influence);
    for (const RoundReport& r : core.CloseAllPending(clock.Now(), clock)) {
      weights[order].insert(weights[order].end(), r.weights.begin(), r.weights.end());
    }
    std::sort(weights[order].begin(), weights[order].end());  // in the order the pushes arrived
  }
  EXPECT_EQ(influence[0], influence[1]);
  EXPECT_EQ(influence[0], (std::vector<double>{1.0, 0.0, 0.0})) << "judged by the pushes from before the instant";
  EXPECT_EQ(weights[0], weights[1]);
}

TEST(RobustMergeSynchronous, ARoundsPushesAreJudgedTogetherWhicheverArrivesFirst) {
  // Synchronous DiLoCo, three learners, every round waits for all three. Their first pushes differ
  // in size (1x, 4x and 16x): judged as each arrived, the first was judged against the fragment's
  // scale alone and the later ones against those before them, so the order they arrived in (a
  // race between processes) decided the merged model. Judged together at the close, each against
  // the other two, the order decides nothing.
  std::vector<float> theta[2];
  std::vector<double> weights[2];
  for (int order = 0; order < 2; ++order) {
    SyncerOptions o = RobustOptions();
    o.mode = diloco::Mode::kDiloco;
    o.round.quorum = 3;
    o.outer_step = OuterStepRule::kRound;
    SyncerCore core = SmallCore(o);
    ManualClock clock;
    for (int id = 0; id < 3; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
    std::vector<int> arrival = {0, 1, 2};
    if (order == 1) arrival = {2, 1, 0};
    std::vector<RoundReport> rounds;
    for (int id : arrival) {
      clock.AdvanceSeconds(1);  // each at its own instant: one arrives before the other
      auto r =
          core.Push(SmallHeader(core, id, 0, 0), Fp32Values(kHonest * static_cast<float>(1 << (2 * id))), clock.Now());
      ASSERT_TRUE(r.ok()) << r.status();
      rounds = core.Poll(clock.Now(), clock);
    }
    ASSERT_EQ(rounds.size(), 1u) << "the round closes with its third push";
    weights[order] = rounds[0].weights;  // in learner order
    const auto t = core.theta(0);
    theta[order].assign(t.begin(), t.end());
  }
  EXPECT_EQ(weights[0], weights[1]);
  EXPECT_EQ(theta[0], theta[1]) << "bit for bit";
  // Each against the other two: the largest is 4x their upper median and the smallest a quarter of
  // their lower median, twice the bound (2x) either way, so both have u = 1/2 (their weights
  // bounded by u² = 1/4); the middle one u = 1.
  EXPECT_DOUBLE_EQ(weights[0][0], weights[0][1] / 4);
  EXPECT_DOUBLE_EQ(weights[0][2], weights[0][1] / 4);
}

TEST_F(RobustMerge, PushesOfNothingDoNotHoldUpTheOthersShare) {
  HonestRound();
  ASSERT_TRUE(Push(kAttacker, 0.0f).ok());
  // A full round is the three others' H steps: one step of one of them is a sixth of it (an
  // eighth if the learner whose pushes add nothing counted as a member).
  ASSERT_TRUE(Push(0, kHonest).ok());
  ASSERT_EQ(last_rounds_.size(), 1u);
  EXPECT_DOUBLE_EQ(last_rounds_[0].token_share, 1.0 / 6);
}

TEST_F(RobustMerge, TheLastLearnerOfARunMovesThetaAsFarAsItsInfluenceAllows) {
  HonestRound();
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(core_.Leave(id, clock_.Now()).ok());
  // Alone in the run, its step is half of a full round (H = 2): the departed are no members.
  ASSERT_TRUE(Push(kAttacker, kHonest).ok());
  ASSERT_EQ(last_rounds_.size(), 1u);
  EXPECT_DOUBLE_EQ(last_rounds_[0].token_share, 0.5);
  const double honest_step = last_rounds_[0].step_norm;
  // 19x the departed learners' latest size: u = 2/19 of that share (were its own u to count in
  // the full round, the only member's, it would cancel), so it moves Θ as far as a push of twice
  // their size.
  auto r = Push(kAttacker, kHonest * 19);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->note.find("influence 0.105"), std::string::npos) << r->note;
  ASSERT_EQ(last_rounds_.size(), 1u);
  EXPECT_NEAR(last_rounds_[0].token_share, 0.5 * 2 / 19, 1e-8);
  EXPECT_LT(last_rounds_[0].step_norm, 2.5 * honest_step);
}

TEST(RobustMergeFirstPush, TheFirstPushOfAFragmentMovesItByLittleWhateverItsSize) {
  SyncerCore core = SmallCore(RobustOptions());
  ManualClock clock;
  for (int id = 0; id < 4; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
  const double theta_norm = 2.0;  // four values of 1
  // Nothing to judge it by but the fragment's own scale: 1000x its norm is merged as a push of
  // 0.05 x (norm + 1) per √H steps would be.
  auto r = core.Push(SmallHeader(core, kAttacker, 0, 0), Fp32Values(1000.0f), clock.Now());
  ASSERT_TRUE(r.ok()) << r.status();
  auto rounds = core.Poll(clock.Now(), clock);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_LE(rounds[0].step_norm, 0.05 * (theta_norm + 1));
}

// A fragment's first pushes are no references (a few steps at the start of a run: half a period
// or less), so a push found nothing but the fragment's scale to judge it by, which honest pushes
// exceed many times. Judged again when their round closes, by each other, they count in full; one
// against them, or far larger, among them still does not.
TEST(RobustMergeFirstPush, TheFirstPushesOfARoundAreJudgedByEachOtherWhenItCloses) {
  ManualClock clock;
  SyncerCore core = JoinedCore(8, 4, clock);
  // Norm 2 at 1 step, 0.05 x 3 / √8 = 0.053 by the fragment's scale: 38x beyond it.
  const float values[4] = {1.0f, 1.0f, 1.0f, -1.0f};  // the last against the others
  for (int id = 0; id < 4; ++id) {
    clock.AdvanceSeconds(1e-6);
    auto r = core.Push(SmallHeader(core, id, 0, 0), Fp32Values(values[id]), clock.Now());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->note.find("its reference 0.053"), std::string::npos) << "judged by the scale on arrival: " << r->note;
  }
  auto rounds = core.CloseAllPending(clock.Now(), clock);
  ASSERT_EQ(rounds.size(), 1u);
  const std::vector<double>& w = rounds[0].weights;
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[0], w[1]);
  EXPECT_EQ(w[0], w[2]);
  EXPECT_GT(w[0], 0);
  EXPECT_EQ(w[3], 0.0) << "its direction agrees with none of the others'";
  // Three honest steps of the three learners' 8 (the fourth's push counts for nothing): 1/8 of a
  // full round (not 1/400 each, as the fragment's scale judged them).
  EXPECT_DOUBLE_EQ(rounds[0].token_share, 1.0 / 8);
  EXPECT_NE(rounds[0].reason.find("learner 3's push; its direction agrees with the others' by -1.000"),
            std::string::npos)
      << rounds[0].reason;

  // With one other push in the round there is nothing robust to judge by: the bound on arrival stays.
  clock.AdvanceSeconds(1);
  for (int id : {0, 3}) {
    auto r = core.Push(SmallHeader(core, id, 1, 0), Fp32Values(values[id]), clock.Now());
    ASSERT_TRUE(r.ok()) << r.status();
  }
  rounds = core.CloseAllPending(clock.Now(), clock);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_LT(rounds[0].token_share, 0.1 * 2 / 32) << "not 2 steps of the 32, each u = 0.027 as it arrived";
}

// A final sync is the last steps of a schedule whose learning rate decays: far below the others'
// pushes from the run's middle, it still counts in full; far above them it is bounded as any push.
TEST_F(RobustMerge, AFinalSyncFarBelowTheOthersCountsInFull) {
  HonestRound();
  const auto final_sync = [&](int id, float v) { return Push(id, v, 100, 1, /*final_sync=*/true); };
  auto r = final_sync(0, kHonest / 80);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->note.find("influence"), std::string::npos) << r->note;
  ASSERT_EQ(last_rounds_.size(), 1u);
  // One step that stands for H = 2 of the four learners' 8.
  EXPECT_DOUBLE_EQ(last_rounds_[0].token_share, 0.25);
  r = final_sync(1, kHonest * 19);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->note.find("influence 0.105"), std::string::npos) << r->note;
}

}  // namespace
}  // namespace atl::syncer
