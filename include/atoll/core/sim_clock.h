// SimClock: simulated time for multi-threaded components (the learner agent, the syncer loop,
// the WAN shaper) in tests. Time stands still while any participating thread runs and jumps to
// the earliest deadline once every one of them waits: a thread that "sleeps" 3 ms or waits for a
// 1 s grace window costs no real time, and no outcome depends on how fast the machine is.
//
// Participants are the threads started with StartThread or inside a ClockThread scope (counted
// from EnterThread, before such a thread first runs); a thread that waits without having entered counts as a participant for the duration of its wait. Time moves only when every
// participant is inside SleepFor/WaitUntil and no waiter's predicate already holds (a waiter that
// was notified but has not yet run keeps time still). A participant blocked on anything else (a
// mutex, a join, a future) keeps time still, as running code does.
//
// Starting several threads: time may move as soon as every thread counted so far waits, so a
// thread that starts them one by one does so inside a ClockThread scope (time stands still
// until it leaves the scope, and it must leave before it joins them).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <mutex>

#include "atoll/core/clock.h"

namespace atl {

class SimClock final : public Clock {
 public:
  explicit SimClock(TimePoint start = TimePoint::zero()) : now_ns_(start.count()) {}
  TimePoint Now() const override { return TimePoint(now_ns_.load(std::memory_order_acquire)); }
  // Waits until simulated time has moved by d.
  void SleepFor(Duration d) override;
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                 const std::function<bool()>& pred) override;
  void EnterThread() override;
  void AdoptThread() override;
  void ExitThread() override;

  // How many times time has jumped (for tests of the clock itself).
  int64_t jumps() const;

 private:
  struct Waiter {
    std::condition_variable* cv;
    std::mutex* mu;
    const std::function<bool()>* pred;
    TimePoint deadline;
  };
  // With mu_ held, by a thread that holds `held` (its own waiter's mutex, or none): moves time to
  // the earliest deadline when every participant waits and no predicate holds.
  void MaybeJumpLocked(const std::mutex* held);

  std::atomic<int64_t> now_ns_;
  mutable std::mutex mu_;
  int participants_ = 0;        // guarded by mu_
  std::list<Waiter*> waiters_;  // guarded by mu_; at most one per thread
  int64_t jumps_ = 0;           // guarded by mu_
};

}  // namespace atl
