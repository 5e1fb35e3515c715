// The paper's calibration point with atoll's defaults: 1.2 M chips, one interruption per chip
// per year, 8 learners → data-parallel 27 %, elastic data-parallel 58 %, Decoupled DiLoCo 88 %,
// each within ±3 points (docs/sim.md explains which defaults were chosen to land there).
#include <gtest/gtest.h>

#include "atoll/sim/goodput.h"

namespace atl::sim {
namespace {

TEST(SimCalibration, PaperPointWithDefaults) {
  GoodputParams p;  // defaults: 1.2 M chips, MTBI 1 chip-year, M = 8, 3 days × 5 seeds
  auto s = RunGoodput(p);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& m : *s) {
    const double target = m.mode == Mode::kDataParallel          ? 0.27
                          : m.mode == Mode::kElasticDataParallel ? 0.58
                          : m.mode == Mode::kDecoupledDiloco     ? 0.88
                                                                 : -1;
    if (target < 0) continue;
    EXPECT_NEAR(m.goodput, target, 0.03) << ModeName(m.mode);
  }
  EXPECT_GT(s->back().uptime, 0.999);  // Decoupled DiLoCo, K = 1: no global downtime
}

}  // namespace
}  // namespace atl::sim
