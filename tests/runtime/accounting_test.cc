// Goodput and uptime on hand-made event records, with hand-checked values.
#include "atoll/runtime/accounting.h"

#include <gtest/gtest.h>

namespace atl::runtime {
namespace {

// `n` steps of `dt` seconds and `tokens` each, the first starting at `start`.
std::vector<StepRecord> Steps(double start, int n, double dt, double tokens) {
  std::vector<StepRecord> s;
  for (int k = 1; k <= n; ++k) s.push_back({start + k * dt, dt, tokens});
  return s;
}

TEST(Accounting, EverythingMergedAndEveryoneFinishedIsFullGoodput) {
  // Two learners, 10 steps of 1 s from t = 100; all tokens merged.
  std::vector<LearnerRecordOfRun> l = {{Steps(100, 10, 1, 50), 500, true}, {Steps(100, 10, 1, 50), 500, true}};
  const RunAccounting r = AccountGoodput(l);
  EXPECT_DOUBLE_EQ(r.window_start, 100);
  EXPECT_DOUBLE_EQ(r.window_end, 110);
  EXPECT_DOUBLE_EQ(r.tokens_computed, 1000);
  EXPECT_DOUBLE_EQ(r.allocated_seconds, 20);
  EXPECT_DOUBLE_EQ(r.useful_seconds, 20);
  EXPECT_DOUBLE_EQ(r.goodput, 1.0);
  EXPECT_DOUBLE_EQ(r.median_step_seconds, 1.0);
}

TEST(Accounting, LostTokensAndADeadLearnerCostGoodput) {
  // Learner 0 merged 400 of its 500 tokens: 10 s of training, 8 useful. Learner 1 trained 5 s,
  // died and never finished: allocated to the end of the window (10 s), 5 useful.
  std::vector<LearnerRecordOfRun> l = {{Steps(100, 10, 1, 50), 400, true}, {Steps(100, 5, 1, 50), 250, false}};
  const RunAccounting r = AccountGoodput(l);
  EXPECT_DOUBLE_EQ(r.learners[0].useful_seconds, 8);
  EXPECT_DOUBLE_EQ(r.learners[0].tokens_lost, 100);
  EXPECT_DOUBLE_EQ(r.learners[1].seconds_allocated, 10);
  EXPECT_DOUBLE_EQ(r.goodput, 13.0 / 20.0);
}

TEST(Accounting, AFinishedLearnerReleasesItsChips) {
  // Learner 1 finished its 5 steps at t = 105 while learner 0 trained on to 110.
  std::vector<LearnerRecordOfRun> l = {{Steps(100, 10, 1, 50), 500, true}, {Steps(100, 5, 1, 50), 250, true}};
  const RunAccounting r = AccountGoodput(l);
  EXPECT_DOUBLE_EQ(r.learners[1].seconds_allocated, 5);
  EXPECT_DOUBLE_EQ(r.goodput, 1.0);
}

TEST(Accounting, NoStepsIsAnEmptyWindow) {
  const RunAccounting r = AccountGoodput({{{}, 0, false}});
  EXPECT_DOUBLE_EQ(r.window_seconds(), 0);
  EXPECT_DOUBLE_EQ(r.goodput, 0);
  EXPECT_DOUBLE_EQ(Uptime({}, 2, 4, r), 1.0);
}

TEST(Accounting, UptimeCountsGapsBeyondTheCadenceAllowance) {
  // Window 100..200 s, median step 1 s, H = 4: allowance 2·4·1 + 1 = 9 s.
  std::vector<LearnerRecordOfRun> l = {{Steps(100, 100, 1, 10), 1000, true}};
  const RunAccounting r = AccountGoodput(l);
  std::map<int, std::vector<double>> closes;
  for (double t = 105; t <= 200; t += 5) closes[0].push_back(t);  // every 5 s: never down
  EXPECT_DOUBLE_EQ(Uptime(closes, 1, 4, r), 1.0);
  // Fragment 1 closes at 105 and 165 (gap 60 s → 51 s down) and not after (200 − 165 = 35 → 26 s).
  closes[1] = {165, 105};
  EXPECT_DOUBLE_EQ(Uptime(closes, 2, 4, r), 1.0 - (51.0 + 26.0) / 2 / 100);
  // A fragment that never closed a round is down for the whole window.
  EXPECT_DOUBLE_EQ(Uptime({{0, closes[0]}}, 2, 4, r), 0.5);
}

}  // namespace
}  // namespace atl::runtime
