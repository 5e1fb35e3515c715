#include "atoll/sim/goodput.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace atl::sim {
namespace {

// A mid-size fleet: many failures per simulated day, still milliseconds per run.
GoodputParams Mid() {
  GoodputParams p;
  p.chips = 200'000;
  p.days = 3;
  p.seeds = 3;
  return p;
}

// Four slices of 256 chips: small enough to reason about by hand.
GoodputParams FourSlices() {
  GoodputParams p;
  p.chips = 1024;
  p.slice_chips = 256;
  return p;
}

const ModeSummary& Find(const std::vector<ModeSummary>& s, FleetMode m) {
  for (const auto& x : s) {
    if (x.mode == m) return x;
  }
  ADD_FAILURE() << "mode missing";
  return s.front();
}

TEST(SimGoodput, SameSeedSameResultDifferentSeedDifferent) {
  GoodputParams p = Mid();
  auto a = RunGoodput(p), b = RunGoodput(p);
  p.seed = 99;
  auto c = RunGoodput(p);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    for (size_t k = 0; k < (*a)[i].runs.size(); ++k) {
      EXPECT_EQ((*a)[i].runs[k].goodput, (*b)[i].runs[k].goodput);
      EXPECT_EQ((*a)[i].runs[k].uptime, (*b)[i].runs[k].uptime);
    }
    EXPECT_NE((*a)[i].goodput, (*c)[i].goodput);
  }
}

TEST(SimGoodput, ModesShareOneTracePerSeed) {
  auto s = RunGoodput(Mid());
  ASSERT_TRUE(s.ok());
  for (const auto& m : *s) {
    for (size_t k = 0; k < m.runs.size(); ++k) EXPECT_EQ(m.runs[k].failures, s->front().runs[k].failures);
  }
}

TEST(SimGoodput, NonElasticAgreesWithClosedFormOverALongRun) {
  GoodputParams p = Mid();
  p.days = 40;
  auto s = RunGoodput(p, {FleetMode::kDataParallel});
  ASSERT_TRUE(s.ok());
  const auto& m = s->front();
  ASSERT_TRUE(m.oracle.available);
  EXPECT_NEAR(m.goodput, m.oracle.goodput, 0.01);
  EXPECT_NEAR(m.uptime, m.oracle.uptime, 0.01);
}

TEST(SimGoodput, NonElasticLostWorkAgreesWithClosedForm) {
  GoodputParams p = Mid();
  p.days = 40;
  p.checkpoint_s = 120;  // lose up to two minutes of progress per failure
  auto s = RunGoodput(p, {FleetMode::kDataParallel});
  ASSERT_TRUE(s.ok());
  const auto& m = s->front();
  EXPECT_NEAR(m.goodput, m.oracle.goodput, 0.01);
  GoodputParams q = p;
  q.checkpoint_s = 0;
  EXPECT_LT(m.oracle.goodput, ClosedForm(FleetMode::kDataParallel, q).goodput - 0.05);
}

TEST(SimGoodput, ElasticAgreesWithClosedFormOverALongRun) {
  GoodputParams p = Mid();
  p.days = 40;
  auto s = RunGoodput(p, {FleetMode::kElasticDataParallel, FleetMode::kDecoupledDiloco});
  ASSERT_TRUE(s.ok());
  for (const auto& m : *s) {
    ASSERT_TRUE(m.oracle.available);
    EXPECT_NEAR(m.goodput, m.oracle.goodput, 0.01) << FleetModeName(m.mode);
    EXPECT_NEAR(m.uptime, m.oracle.uptime, 0.01) << FleetModeName(m.mode);
  }
}

TEST(SimGoodput, ClosedFormsByHand) {
  // No repair time: nothing is ever down and no spares are needed.
  GoodputParams p = FourSlices();
  p.repair_hours = 0;
  p.mtbi_years = 1;
  p.restart_s = 100;
  p.shrink_s = 10;
  p.grow_s = 3;
  const double lambda = 1024 / kSecondsPerYear;  // fleet failures per second
  EXPECT_EQ(SpareSlices(p), 0);
  // Detection longer than every pause: each failure starts its pause again (union of intervals).
  p.detect_s = 1e9;
  EXPECT_NEAR(ClosedForm(FleetMode::kDataParallel, p).goodput, std::exp(-lambda * 100), 1e-12);
  EXPECT_NEAR(ClosedForm(FleetMode::kElasticDataParallel, p).goodput, std::exp(-lambda * 13), 1e-12);
  // No detection cost: a failure during a pause is free, running and pausing alternate.
  p.detect_s = 0;
  EXPECT_NEAR(ClosedForm(FleetMode::kDataParallel, p).goodput, 1 / (1 + lambda * 100), 1e-12);
  EXPECT_NEAR(ClosedForm(FleetMode::kElasticDataParallel, p).goodput, 1 / (1 + lambda * 13), 1e-12);
  p.learners = 2;
  p.quorum = 2;
  const double q = 1 / (1 + lambda / 2 * 13);
  EXPECT_NEAR(ClosedForm(FleetMode::kDecoupledDiloco, p).uptime, q * q, 1e-12);
  EXPECT_FALSE(ClosedForm(FleetMode::kSyncDiloco, p).available);
}

TEST(SimGoodput, MeanPauseEpisodeByHand) {
  // δ = min(detect, pause); mean = pause − δ + (e^{rδ} − 1)/r.
  EXPECT_DOUBLE_EQ(MeanPauseEpisode(70, 0, 0.1), 70);
  EXPECT_DOUBLE_EQ(MeanPauseEpisode(70, 5, 0), 70);
  EXPECT_NEAR(MeanPauseEpisode(70, 5, 0.1), 65 + (std::exp(0.5) - 1) / 0.1, 1e-12);
  EXPECT_NEAR(MeanPauseEpisode(70, 1e9, 0.01), (std::exp(0.7) - 1) / 0.01, 1e-9);
  EXPECT_GT(MeanPauseEpisode(70, 5, 0.1), 70);  // failures in the last δ extend the pause
}

// A hand-made trace of equal slices that fail at the given times and never return.
FailureTrace HandTrace(int slices, std::vector<std::pair<double, int>> failures) {
  FailureTrace tr;
  tr.slice_chips.assign(static_cast<size_t>(slices), 256);
  tr.down_at_start.assign(static_cast<size_t>(slices), 0);
  tr.duration_s = 1000;
  for (auto [t, s] : failures) tr.events.push_back({t, s, false});
  tr.failures = static_cast<int64_t>(failures.size());
  return tr;
}

TEST(SimGoodput, AFailureDuringARestartCostsItsDetectionNotANewRestart) {
  GoodputParams p = FourSlices();
  p.spare_slices = 2;  // the job holds slices 0 and 1; 2 and 3 are spares
  p.restart_s = 70;
  p.detect_s = 5;
  // Slice 0 fails at 100: restart until 170. Slice 1 fails at 168 (during it): the restart
  // takes its spare in and ends at 173, not at 238.
  const FailureTrace tr = HandTrace(4, {{100, 0}, {168, 1}});
  RunResult r = SimulateMode(FleetMode::kDataParallel, p, tr);
  EXPECT_NEAR(r.uptime, (100 + (1000 - 173)) / 1000.0, 1e-12);
  EXPECT_NEAR(r.goodput, r.uptime * 512 / 1024, 1e-12);
  p.detect_s = 1e9;  // the older model: the second failure starts the restart again
  r = SimulateMode(FleetMode::kDataParallel, p, tr);
  EXPECT_NEAR(r.uptime, (100 + (1000 - 238)) / 1000.0, 1e-12);
}

TEST(SimGoodput, AFailureDuringAnElasticPauseCostsItsDetection) {
  GoodputParams p = FourSlices();
  p.learners = 1;
  p.shrink_s = 12;
  p.detect_s = 5;
  // Slice 0 fails at 100 (pause until 112), slice 1 at 110: the pause ends at 115, then the job
  // trains on the two slices left.
  const FailureTrace tr = HandTrace(4, {{100, 0}, {110, 1}});
  RunResult r = SimulateMode(FleetMode::kElasticDataParallel, p, tr);
  EXPECT_NEAR(r.uptime, (1000 - 15) / 1000.0, 1e-12);
  EXPECT_NEAR(r.goodput, (100 * 1024 + (1000 - 115) * 512) / (1024 * 1000.0), 1e-12);
  p.detect_s = 1e9;  // the older model: the pause starts again at 110 and ends at 122
  r = SimulateMode(FleetMode::kElasticDataParallel, p, tr);
  EXPECT_NEAR(r.uptime, (1000 - 22) / 1000.0, 1e-12);
}

TEST(SimGoodput, MoreChipsLowerGoodput) {
  GoodputParams p = Mid();
  std::vector<std::vector<ModeSummary>> rows;
  for (int64_t chips : {50'000, 200'000, 800'000}) {
    p.chips = chips;
    auto s = RunGoodput(p);
    ASSERT_TRUE(s.ok());
    rows.push_back(*s);
  }
  for (size_t m = 0; m < rows[0].size(); ++m) {
    EXPECT_GT(rows[0][m].goodput, rows[1][m].goodput) << FleetModeName(rows[0][m].mode);
    EXPECT_GT(rows[1][m].goodput, rows[2][m].goodput) << FleetModeName(rows[0][m].mode);
  }
}

TEST(SimGoodput, MoreLearnersHigherGoodputAndFullUptimeFromFour) {
  GoodputParams p = Mid();
  p.chips = 1'200'000;
  p.days = 1;
  double last = 0;
  for (int m : {1, 2, 4, 8, 16}) {
    p.learners = m;
    p.quorum = 1;
    auto s = RunGoodput(p, {FleetMode::kDecoupledDiloco, FleetMode::kSyncDiloco});
    ASSERT_TRUE(s.ok());
    const auto& d = Find(*s, FleetMode::kDecoupledDiloco);
    EXPECT_GT(d.goodput, last) << "M=" << m;
    last = d.goodput;
    if (m >= 4) {
      EXPECT_GT(d.uptime, 0.999) << "M=" << m;
    }
    // Sync DiLoCo never beats Decoupled on the same trace: it only adds waiting.
    EXPECT_LE(Find(*s, FleetMode::kSyncDiloco).goodput, d.goodput + 1e-9) << "M=" << m;
  }
}

TEST(SimGoodput, OrderingAtTheCalibrationScale) {
  GoodputParams p;
  p.days = 1;
  p.seeds = 2;
  auto s = RunGoodput(p);
  ASSERT_TRUE(s.ok());
  const double dp = Find(*s, FleetMode::kDataParallel).goodput;
  const double el = Find(*s, FleetMode::kElasticDataParallel).goodput;
  const double sy = Find(*s, FleetMode::kSyncDiloco).goodput;
  const double de = Find(*s, FleetMode::kDecoupledDiloco).goodput;
  EXPECT_LT(dp, el);
  EXPECT_LT(el, sy);
  EXPECT_LT(sy, de);
  EXPECT_NEAR(Find(*s, FleetMode::kSyncDiloco).failures, Find(*s, FleetMode::kDecoupledDiloco).failures, 0);
}

TEST(SimGoodput, SyncDilocoBarrierCostsTimeAndNeverDeadlocks) {
  GoodputParams p = Mid();
  p.chips = 20'000;  // few slices per learner: learners can lose every slice
  p.slice_chips = 1024;
  p.days = 5;
  auto base = RunGoodput(p, {FleetMode::kSyncDiloco});
  p.barrier_s = 6;  // 6 s of outer all-reduce per 24 s round
  auto slow = RunGoodput(p, {FleetMode::kSyncDiloco});
  ASSERT_TRUE(base.ok() && slow.ok());
  EXPECT_GT(base->front().goodput, 0.5);
  EXPECT_NEAR(slow->front().goodput, base->front().goodput * 24 / 30, 0.03);
}

TEST(SimGoodput, QuorumAllLowersUptimeNotGoodput) {
  GoodputParams p = Mid();
  p.chips = 1'200'000;
  p.days = 1;
  auto k1 = RunGoodput(p, {FleetMode::kDecoupledDiloco});
  p.quorum = p.learners;
  auto km = RunGoodput(p, {FleetMode::kDecoupledDiloco});
  ASSERT_TRUE(k1.ok() && km.ok());
  EXPECT_EQ(k1->front().goodput, km->front().goodput);
  EXPECT_LT(km->front().uptime, k1->front().uptime - 0.1);
}

TEST(SimGoodput, SparesRunningDryStallsTheNonElasticJob) {
  GoodputParams p = Mid();
  p.days = 10;
  auto dflt = RunGoodput(p, {FleetMode::kDataParallel});
  p.spare_slices = 0;  // every failure waits for a repair (2 h)
  auto none = RunGoodput(p, {FleetMode::kDataParallel});
  ASSERT_TRUE(dflt.ok() && none.ok());
  EXPECT_LT(none->front().goodput, 0.05);
  EXPECT_GT(dflt->front().goodput, 0.5);
}

TEST(SimGoodput, BadParametersAreInvalidArgument) {
  GoodputParams p;
  p.chips = -5;
  EXPECT_EQ(ValidateGoodput(p).code(), StatusCode::kInvalidArgument);
  p = GoodputParams();
  p.quorum = 9;
  Status s = ValidateGoodput(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("quorum"), std::string::npos) << s;
  p = GoodputParams();
  p.mtbi_years = 0;
  EXPECT_EQ(ValidateGoodput(p).code(), StatusCode::kInvalidArgument);
  p = GoodputParams();
  p.chips = 1024;  // 4 slices, 8 learners
  EXPECT_EQ(ValidateGoodput(p).code(), StatusCode::kInvalidArgument);
  p = GoodputParams();
  p.days = 1e6;
  EXPECT_EQ(ValidateGoodput(p).code(), StatusCode::kResourceExhausted);
  EXPECT_FALSE(RunGoodput(p).ok());
}

TEST(SimGoodput, MeanCi95) {
  const MeanCi c = MeanCi95({1.0, 2.0, 3.0});
  EXPECT_DOUBLE_EQ(c.mean, 2.0);
  EXPECT_NEAR(c.half_width, 4.303 * 1.0 / std::sqrt(3.0), 1e-9);
  EXPECT_EQ(MeanCi95({5.0}).half_width, 0.0);
}

TEST(SimGoodput, JsonHasOneObjectPerModeWithTheDocumentedKeys) {
  GoodputParams p = Mid();
  p.days = 0.5;
  auto s = RunGoodput(p);
  ASSERT_TRUE(s.ok());
  const auto j = nlohmann::json::parse(GoodputJson(p, *s));
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 4u);
  for (const auto& o : j) {
    for (const char* k : {"mode", "learners", "chips", "goodput", "goodput_ci95", "uptime", "failures"})
      EXPECT_TRUE(o.contains(k)) << k;
  }
  EXPECT_EQ(j[3]["mode"], "decoupled-diloco");
  EXPECT_EQ(j[3]["learners"], 8);
  EXPECT_EQ(j[0]["learners"], 1);
  const std::string table = FormatGoodputTable(p, *s);
  EXPECT_NE(table.find("decoupled-diloco"), std::string::npos);
  EXPECT_NE(table.find("200,000 chips"), std::string::npos);
}

}  // namespace
}  // namespace atl::sim
