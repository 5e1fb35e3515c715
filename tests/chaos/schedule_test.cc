#include "atoll/chaos/schedule.h"

#include <gtest/gtest.h>

#include <map>

namespace atl::chaos {
namespace {

ChaosConfig Random(uint64_t seed) {
  ChaosConfig c;
  c.mode = ChaosMode::kRandom;
  c.seed = seed;
  c.random.learner_mtbf_s = 120;
  c.random.repair_s = 10;
  c.random.straggler_every_s = 60;
  c.random.partition_every_s = 90;
  c.random.syncer_mtbf_s = 200;
  return c;
}

TEST(ChaosSchedule, SameSeedSameFaultsDifferentSeedDifferent) {
  auto a = BuildSchedule(Random(7), 4, 600);
  auto b = BuildSchedule(Random(7), 4, 600);
  auto c = BuildSchedule(Random(8), 4, 600);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_FALSE(a->empty());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  for (size_t i = 1; i < a->size(); ++i) EXPECT_LE((*a)[i - 1].at_s, (*a)[i].at_s);
}

TEST(ChaosSchedule, RandomFailuresMatchTheMtbfAndNeverOverlapARepair) {
  ChaosConfig c;
  c.mode = ChaosMode::kRandom;
  c.seed = 3;
  c.random.learner_mtbf_s = 100;
  c.random.repair_s = 10;
  c.random.start_after_s = 0;
  const double horizon = 200000;
  auto s = BuildSchedule(c, 2, horizon);
  ASSERT_TRUE(s.ok());
  std::map<int, std::vector<FaultEvent>> per;
  for (const auto& e : *s) {
    ASSERT_EQ(e.kind, FaultKind::kKill);
    per[e.target].push_back(e);
  }
  for (auto& [id, ev] : per) {
    // Alive ~100 s then down ~10 s: about horizon / 110 failures.
    EXPECT_NEAR(static_cast<double>(ev.size()), horizon / 110.0, 0.08 * horizon / 110.0) << "learner " << id;
    double repair_sum = 0;
    for (size_t i = 1; i < ev.size(); ++i) {
      EXPECT_GE(ev[i].at_s, ev[i - 1].at_s + ev[i - 1].duration_s);  // never killed while down
    }
    for (const auto& e : ev) repair_sum += e.duration_s;
    EXPECT_NEAR(repair_sum / static_cast<double>(ev.size()), 10.0, 1.0);
  }
}

TEST(ChaosSchedule, ExplicitEventsAreKeptAndValidated) {
  ChaosConfig c;
  c.mode = ChaosMode::kEvents;
  c.events = {{30, -1, FaultKind::kPause, 1, 5, 0},
              {10, -1, FaultKind::kKill, 0, 8, 0},
              {0, 50, FaultKind::kKillSyncer, -1, 3, 0}};
  auto s = BuildSchedule(c, 2, 100);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 3u);
  EXPECT_EQ((*s)[0].kind, FaultKind::kKill);  // sorted by time
  EXPECT_EQ((*s)[1].kind, FaultKind::kPause);
  EXPECT_EQ((*s)[2].kind, FaultKind::kKillSyncer);  // step-triggered after time-triggered

  c.events = {{1, -1, FaultKind::kKill, 5, 1, 0}};
  auto bad = BuildSchedule(c, 2, 100);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("learner 5 out of range"), std::string::npos) << bad.status();
  c.events = {{1, -1, FaultKind::kSlow, 0, 5, 1.5}};
  EXPECT_FALSE(BuildSchedule(c, 2, 100).ok());
  c.events = {{1, -1, FaultKind::kPause, 0, 0, 0}};
  EXPECT_FALSE(BuildSchedule(c, 2, 100).ok());
}

TEST(ChaosSchedule, JsonRoundTripAndUnknownKeys) {
  auto c = Random(11);
  c.events = {{3, -1, FaultKind::kBandwidth, 1, 4, 2.5}};
  auto back = ChaosFromJson(ToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->events, c.events);
  EXPECT_EQ(back->seed, 11u);
  EXPECT_EQ(back->random.syncer_mtbf_s, 200);
  auto bad = ChaosFromJson({{"mode", "random"}, {"mtbf", 3}});
  EXPECT_NE(bad.status().message().find("unknown key 'mtbf'"), std::string::npos);
  auto kind = ChaosFromJson({{"events", {{{"kind", "explode"}}}}});
  EXPECT_EQ(
      kind.status().message(),
      "chaos: fault kind must be kill, pause, slow, partition, bandwidth, kill_syncer or lose_syncer (got 'explode')");
  EXPECT_EQ(ChaosFromJson({{"mode", "chaotic"}}).status().message(),
            "chaos: chaos mode must be none, random or events (got 'chaotic')");
  EXPECT_EQ(ChaosFromJson({{"repair_dist", "weibull"}}).status().message(),
            "chaos: repair_dist must be exponential, fixed or lognormal (got 'weibull')");
  c.random.repair_dist = RepairDist::kLogNormal;
  c.mode = ChaosMode::kEvents;
  back = ChaosFromJson(ToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->random.repair_dist, RepairDist::kLogNormal);
  EXPECT_EQ(back->mode, ChaosMode::kEvents);
  ChaosConfig none;
  auto empty = BuildSchedule(none, 4, 100);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

}  // namespace
}  // namespace atl::chaos
