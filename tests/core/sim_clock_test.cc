// SimClock: simulated time that moves only when every participating thread waits.
#include "atoll/core/sim_clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace atl {
namespace {

using std::chrono::milliseconds;

TEST(SimClock, SleepersWakeInDeadlineOrderAtTheirSimulatedTimes) {
  SimClock clock;
  std::mutex mu;
  std::vector<std::pair<int, TimePoint>> woke;  // (thread, time it woke)
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);  // time stands still until every thread is counted
    for (int i : {3, 1, 2}) {
      threads.push_back(StartThread(clock, [&, i] {
        clock.SleepFor(milliseconds(100 * i));
        std::lock_guard<std::mutex> g(mu);
        woke.emplace_back(i, clock.Now());
      }));
    }
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(woke.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(woke[static_cast<size_t>(k)].first, k + 1);
    EXPECT_EQ(woke[static_cast<size_t>(k)].second, milliseconds(100 * (k + 1)));
  }
  EXPECT_EQ(clock.Now(), milliseconds(300));
  EXPECT_EQ(clock.jumps(), 3);
}

TEST(SimClock, TimeStandsStillWhileAParticipantRuns) {
  SimClock clock;
  std::atomic<bool> release{false};
  std::atomic<int64_t> slept_at{-1};
  // A participant busy (spinning, not waiting on the clock) keeps a sleeper asleep for ever.
  std::thread busy = StartThread(clock, [&] {
    while (!release.load()) std::this_thread::yield();
    clock.SleepFor(milliseconds(5));
  });
  std::thread sleeper = StartThread(clock, [&] {
    clock.SleepFor(milliseconds(1));
    slept_at = clock.Now().count();
  });
  for (int i = 0; i < 200; ++i) std::this_thread::yield();
  EXPECT_EQ(clock.Now(), TimePoint::zero());
  EXPECT_EQ(slept_at.load(), -1);
  release = true;
  busy.join();
  sleeper.join();
  EXPECT_EQ(TimePoint(slept_at.load()), milliseconds(1));
  EXPECT_EQ(clock.Now(), milliseconds(5)) << clock.Now().count() << " jumps " << clock.jumps();
}

TEST(SimClock, ANotifiedWaiterRunsBeforeTimeMoves) {
  SimClock clock;
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  TimePoint seen = TimePoint::max();
  std::thread waiter, notifier;
  {
    ClockThread setup(clock);  // time stands still until both threads are counted
    waiter = StartThread(clock, [&] {
      std::unique_lock<std::mutex> lock(mu);
      const bool ok = clock.WaitFor(cv, lock, std::chrono::seconds(10), [&] { return ready; });
      EXPECT_TRUE(ok);
      seen = clock.Now();
    });
    notifier = StartThread(clock, [&] {
      clock.SleepFor(milliseconds(7));
      {
        std::lock_guard<std::mutex> g(mu);
        ready = true;
      }
      cv.notify_all();
      clock.SleepFor(std::chrono::seconds(100));  // waits too: time may only move once the waiter ran
    });
  }
  waiter.join();
  notifier.join();
  EXPECT_EQ(seen, milliseconds(7));
}

TEST(SimClock, AWaitTimesOutAtItsSimulatedDeadline) {
  SimClock clock(milliseconds(50));
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  // A thread that never entered waits as a participant for the duration of its wait.
  EXPECT_FALSE(clock.WaitFor(cv, lock, std::chrono::hours(2), [] { return false; }));
  EXPECT_EQ(clock.Now(), milliseconds(50) + std::chrono::hours(2));
  EXPECT_TRUE(clock.WaitUntil(cv, lock, kNever, [] { return true; }));
}

TEST(Clock, DeadlineAfterSaturates) {
  ManualClock clock(milliseconds(5));
  EXPECT_EQ(clock.DeadlineAfter(kNever), kNever);
  EXPECT_EQ(clock.DeadlineAfter(milliseconds(1)), milliseconds(6));
}

TEST(RealClock, WaitUntilReturnsThePredicateAndHonoursTheDeadline) {
  RealClock& clock = RealClock::Default();
  std::mutex mu;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_FALSE(clock.WaitFor(cv, lock, milliseconds(1), [] { return false; }));
  EXPECT_TRUE(clock.WaitUntil(cv, lock, kNever, [] { return true; }));
}

}  // namespace
}  // namespace atl
