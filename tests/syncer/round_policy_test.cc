#include "atoll/syncer/round_policy.h"

#include <gtest/gtest.h>

namespace atl::syncer {
namespace {

TimePoint S(double s) { return FromSeconds(s); }

TEST(GraceSeconds, FormulaAndClamping) {
  RoundOptions o;
  o.gamma = 0.5;
  o.tau = 2;
  o.grace_cap_s = 5;
  RoundEstimates e{/*step*/ 1.0, /*sync*/ 0.2};
  // γ·(τ·t_step − t_quorum − t_sync) = 0.5·(2 − 0.3 − 0.2) = 0.75
  EXPECT_DOUBLE_EQ(GraceSeconds(o, e, 0.3), 0.75);
  // Negative slack clamps to 0.
  EXPECT_DOUBLE_EQ(GraceSeconds(o, e, 3.0), 0.0);
  // Large slack clamps to the cap.
  RoundEstimates slow{100.0, 0.0};
  EXPECT_DOUBLE_EQ(GraceSeconds(o, slow, 0.0), 5.0);
  o.grace = false;
  EXPECT_DOUBLE_EQ(GraceSeconds(o, e, 0.3), 0.0);
}

TEST(DecideRound, WaitsForQuorum) {
  RoundOptions o;
  o.quorum = 2;
  RoundView v;
  v.opened_at = S(1);
  v.contributors = {0};
  v.live = {0, 1, 2};
  auto d = DecideRound(S(10), v, {1.0, 0.1}, o);
  EXPECT_EQ(d.action, RoundAction::kWait);
  EXPECT_FALSE(d.wake_at.has_value());
  EXPECT_NE(d.reason.find("waiting for quorum: 1/2"), std::string::npos);
}

TEST(DecideRound, GraceWindowThenCloseWithLateLearners) {
  RoundOptions o;  // K = 1, γ = 0.5, τ = 2
  RoundEstimates e{1.0, 0.2};
  RoundView v;
  v.opened_at = S(10.0);
  v.quorum_at = S(10.0);
  v.contributors = {2};
  v.live = {0, 1, 2};
  // grace = 0.5·(2 − 0 − 0.2) = 0.9 s after quorum
  auto d = DecideRound(S(10.5), v, e, o);
  EXPECT_EQ(d.action, RoundAction::kWait);
  ASSERT_TRUE(d.wake_at.has_value());
  EXPECT_NEAR(ToSeconds(*d.wake_at), 10.9, 1e-9);
  EXPECT_EQ(d.missing, (std::vector<int>{0, 1}));
  auto closed = DecideRound(S(10.9), v, e, o);
  EXPECT_EQ(closed.action, RoundAction::kClose);
  EXPECT_NEAR(closed.grace_seconds, 0.9, 1e-12);
  EXPECT_NE(closed.reason.find("late [0,1]"), std::string::npos) << closed.reason;
}

TEST(DecideRound, ClosesEarlyWhenAllLiveReported) {
  RoundOptions o;
  RoundView v;
  v.opened_at = S(0);
  v.quorum_at = S(0);
  v.contributors = {0, 1};
  v.live = {0, 1};  // learner 2 is dead: nobody waits for it
  auto d = DecideRound(S(0.01), v, {1.0, 0.0}, o);
  EXPECT_EQ(d.action, RoundAction::kClose);
  EXPECT_TRUE(d.missing.empty());
}

TEST(DecideRound, NoGraceClosesAtQuorum) {
  RoundOptions o;
  o.grace = false;
  RoundView v;
  v.opened_at = S(0);
  v.quorum_at = S(0);
  v.contributors = {1};
  v.live = {0, 1, 2, 3};
  auto d = DecideRound(S(0), v, {10.0, 0.0}, o);
  EXPECT_EQ(d.action, RoundAction::kClose);
  EXPECT_NE(d.reason.find("grace 0.000s off"), std::string::npos) << d.reason;
}

TEST(DecideRound, TimeToQuorumEatsIntoGrace) {
  RoundOptions o;
  o.quorum = 2;
  RoundView v;
  v.opened_at = S(0);
  v.quorum_at = S(1.5);  // t_quorum = 1.5 s of the τ·t_step = 2 s budget
  v.contributors = {0, 1};
  v.live = {0, 1, 2};
  auto d = DecideRound(S(1.5), v, {1.0, 0.0}, o);
  EXPECT_EQ(d.action, RoundAction::kWait);
  EXPECT_NEAR(d.grace_seconds, 0.25, 1e-12);  // 0.5·(2 − 1.5 − 0)
}

}  // namespace
}  // namespace atl::syncer
