// The shared thousands-grouping helper (atoll/core/format.h).
#include "atoll/core/format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace atl {
namespace {

TEST(Format, GroupsThousands) {
  EXPECT_EQ(Grouped(0), "0");
  EXPECT_EQ(Grouped(999), "999");
  EXPECT_EQ(Grouped(1000), "1,000");
  EXPECT_EQ(Grouped(1315968), "1,315,968");
  EXPECT_EQ(Grouped(-1234), "-1,234");
  EXPECT_EQ(Grouped(-999), "-999");
  EXPECT_EQ(Grouped(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
  EXPECT_EQ(Grouped(std::numeric_limits<int64_t>::max()), "9,223,372,036,854,775,807");
}

TEST(Format, RoundsCountsHeldAsDoubles) {
  EXPECT_EQ(GroupedRound(1773568.0000000019), "1,773,568");
  EXPECT_EQ(GroupedRound(1773567.6), "1,773,568");
  EXPECT_EQ(GroupedRound(-2500.4), "-2,500");
  EXPECT_EQ(GroupedRound(std::nan("")), "n/a");
  EXPECT_EQ(GroupedRound(1e30), "1.000e+30");
}

TEST(Format, BytesInDecimalUnits) {
  EXPECT_EQ(HumanBytes(0), "0.0 B");
  EXPECT_EQ(HumanBytes(999), "999.0 B");
  EXPECT_EQ(HumanBytes(1234567), "1.2 MB");
  EXPECT_EQ(HumanBytes(2.5e12), "2.5 TB");
  EXPECT_EQ(HumanBytes(7e15), "7000.0 TB");
}

}  // namespace
}  // namespace atl
