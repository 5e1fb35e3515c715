// One compromised learner among honest ones, with only its own credential: its pushes are judged
// against the other learners' latest pushes (upper medians), its claimed counters are bounded by
// theirs, and the references survive a restart (docs/security.md).
#include <gtest/gtest.h>

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

class RobustMerge : public ::testing::Test {
 protected:
  RobustMerge() : core_(SmallCore(RobustOptions())) {
    for (int id = 0; id < 4; ++id) EXPECT_TRUE(core_.Join(SmallJoin(id), clock_.Now()).ok());
  }
  // Learner `id` pushes fragment 0 with every value `v` and the given counters; the round closes.
  StatusOr<PushResult> Push(int id, float v, int64_t c_tokens = 100, int64_t c_steps = 1) {
    PushHeaderData h = SmallHeader(id, 0, core_.version(0));
    h.c_tokens = c_tokens;
    h.c_steps = c_steps;
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
    return core.Push(SmallHeader(id, 0, core.version(0)), Fp32Values(v), clock.Now());
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
  SyncerOptions o = RobustOptions();
  o.H = 8;
  SyncerCore core = SmallCore(o);
  ManualClock clock;
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(core.Join(SmallJoin(id), clock.Now()).ok());
  auto push = [&](int id, float v, int64_t c_steps, bool final_sync) {
    PushHeaderData h = SmallHeader(id, 0, core.version(0));
    h.c_steps = c_steps;
    h.c_tokens = 100 * c_steps;
    h.final_sync = final_sync;
    auto r = core.Push(h, Fp32Values(v), clock.Now());
    core.Poll(clock.Now(), clock);
    return r;
  };
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(push(id, kHonest, 8, false).ok());
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
    PushHeaderData h = SmallHeader(id, 0, core.version(0));
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
  PushHeaderData h = SmallHeader(kAttacker, 0, restarted.version(0));
  auto r = restarted.Push(h, Fp32Values(kHonest * 100), clock_.Now());
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("quarantined"), std::string::npos) << r.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl::syncer
