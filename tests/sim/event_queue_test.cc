#include "atoll/sim/event_queue.h"

#include <gtest/gtest.h>

#include <vector>

#include "atoll/core/rng.h"

namespace atl::sim {
namespace {

TEST(SimEventQueue, PopsInTimeOrder) {
  EventQueue q;
  q.Push(3.0, 1, 30);
  q.Push(1.0, 1, 10);
  q.Push(2.0, 1, 20);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q.Pop().a, 10);
  EXPECT_EQ(q.Pop().a, 20);
  EXPECT_EQ(q.Pop().a, 30);
  EXPECT_TRUE(q.empty());
}

TEST(SimEventQueue, EqualTimesPopInPushOrder) {
  EventQueue q;
  for (int i = 0; i < 100; ++i) q.Push(5.0, 0, i);
  q.Push(4.0, 0, -1);
  EXPECT_EQ(q.Pop().a, -1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(q.Pop().a, i) << "tie-break must be FIFO";
}

TEST(SimEventQueue, RandomPushesComeOutSorted) {
  Rng rng(7);
  EventQueue q;
  for (int i = 0; i < 5000; ++i) q.Push(static_cast<double>(rng.UniformInt(100)), 0, i);
  double last_t = -1;
  int64_t last_a = -1;
  while (!q.empty()) {
    const Event e = q.Pop();
    ASSERT_GE(e.time, last_t);
    if (e.time == last_t) {
      ASSERT_GT(e.a, last_a);  // same time: push order
    }
    last_t = e.time;
    last_a = e.a;
  }
}

}  // namespace
}  // namespace atl::sim
