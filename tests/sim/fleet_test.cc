#include "atoll/sim/fleet.h"

#include <gtest/gtest.h>

#include <cmath>

namespace atl::sim {
namespace {

FleetSpec SmallFleet() {
  FleetSpec f;
  f.chips = 100'000;
  f.slice_chips = 256;
  f.mtbi_s = 365.25 * 86400;
  f.repair_mean_s = 2.5 * 3600;
  f.duration_s = 10 * 86400;
  return f;
}

TEST(SimFleet, SliceSizesCoverTheFleet) {
  FleetSpec f = SmallFleet();
  const auto sizes = SliceSizes(f);
  ASSERT_EQ(sizes.size(), 391u);  // 390 × 256 + 160
  EXPECT_EQ(sizes.back(), 100'000 - 390 * 256);
  int64_t total = 0;
  for (auto c : sizes) total += c;
  EXPECT_EQ(total, f.chips);
}

TEST(SimFleet, SameSeedSameTraceDifferentSeedDifferentTrace) {
  const FleetSpec f = SmallFleet();
  const FailureTrace a = GenerateTrace(f, 42), b = GenerateTrace(f, 42), c = GenerateTrace(f, 43);
  ASSERT_EQ(a.events.size(), b.events.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    ASSERT_EQ(a.events[i].time, b.events[i].time);
    ASSERT_EQ(a.events[i].slice, b.events[i].slice);
    ASSERT_EQ(a.events[i].up, b.events[i].up);
  }
  EXPECT_EQ(a.down_at_start, b.down_at_start);
  ASSERT_FALSE(a.events.empty());
  ASSERT_FALSE(c.events.empty());
  EXPECT_NE(a.events[0].time, c.events[0].time);
}

TEST(SimFleet, TraceIsOrderedAndConsistent) {
  const FleetSpec f = SmallFleet();
  const FailureTrace t = GenerateTrace(f, 5);
  std::vector<uint8_t> down = t.down_at_start;
  double last = 0;
  int64_t failures = 0;
  for (const auto& e : t.events) {
    ASSERT_GE(e.time, last);
    ASSERT_LE(e.time, f.duration_s);
    last = e.time;
    auto& d = down[static_cast<size_t>(e.slice)];
    // A slice fails only while up and returns only while down.
    ASSERT_EQ(d, e.up ? 1 : 0);
    d = e.up ? 0 : 1;
    failures += e.up ? 0 : 1;
  }
  EXPECT_EQ(failures, t.failures);
}

TEST(SimFleet, FailureRateAndDownFractionMatchRenewalTheory) {
  FleetSpec f = SmallFleet();
  f.duration_s = 120 * 86400;
  const FailureTrace t = GenerateTrace(f, 9);
  const double expected = StationarySliceFailureRate(f) * f.duration_s;
  // Poisson count: within 4 standard deviations.
  EXPECT_NEAR(static_cast<double>(t.failures), expected, 4 * std::sqrt(expected));

  // Time-averaged share of chips in repair, integrated over the trace.
  std::vector<uint8_t> down = t.down_at_start;
  double down_chips = 0, tprev = 0, integral = 0;
  for (size_t s = 0; s < down.size(); ++s) down_chips += down[s] ? t.slice_chips[s] : 0;
  for (const auto& e : t.events) {
    integral += down_chips * (e.time - tprev);
    tprev = e.time;
    down_chips += (e.up ? -1.0 : 1.0) * static_cast<double>(t.slice_chips[size_t(e.slice)]);
  }
  integral += down_chips * (f.duration_s - tprev);
  const double measured = integral / (static_cast<double>(f.chips) * f.duration_s);
  EXPECT_NEAR(measured, StationaryDownFraction(f), 0.004);
}

TEST(SimFleet, EveryRepairDistributionKeepsTheMeanDownFraction) {
  for (RepairDist d : {RepairDist::kFixed, RepairDist::kExponential, RepairDist::kLogNormal}) {
    FleetSpec f = SmallFleet();
    f.duration_s = 120 * 86400;
    f.repair_dist = d;
    const FailureTrace t = GenerateTrace(f, 11);
    std::vector<uint8_t> down = t.down_at_start;
    double n_down = 0, tprev = 0, integral = 0;
    for (auto x : down) n_down += x;
    for (const auto& e : t.events) {
      integral += n_down * (e.time - tprev);
      tprev = e.time;
      n_down += e.up ? -1 : 1;
    }
    integral += n_down * (f.duration_s - tprev);
    const double share = integral / f.duration_s / static_cast<double>(t.slice_chips.size());
    EXPECT_NEAR(share, StationaryDownFraction(f), 0.006) << RepairDistName(d);
  }
}

TEST(SimFleet, Validation) {
  FleetSpec f = SmallFleet();
  EXPECT_TRUE(ValidateFleet(f).ok());
  f.mtbi_s = 0;
  EXPECT_EQ(ValidateFleet(f).code(), StatusCode::kInvalidArgument);
  f = SmallFleet();
  f.chips = -1;
  EXPECT_EQ(ValidateFleet(f).code(), StatusCode::kInvalidArgument);
  f = SmallFleet();
  f.slice_chips = f.chips + 1;
  EXPECT_EQ(ValidateFleet(f).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseRepairDist("weibull").ok());
  EXPECT_EQ(*ParseRepairDist("lognormal"), RepairDist::kLogNormal);
}

}  // namespace
}  // namespace atl::sim
