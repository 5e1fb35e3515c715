// Clock: the source of time every atoll component takes as a parameter, so that the syncer's
// round policy, the simulator and the tests run the same code against a manual clock. Every wait
// of a component that takes a Clock goes through it (SleepFor, WaitUntil), so the learner agent
// and the syncer loop also run on a SimClock (core/sim_clock.h): simulated time that moves only
// when every thread waits, with no real sleeps.
//
// Time is a monotonic duration since an arbitrary epoch (steady clock for RealClock, 0 for
// ManualClock). Thread-safety: RealClock is stateless; ManualClock is safe to read from any
// thread and to advance from one (its fields are atomic; SleepFor on a ManualClock advances it).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace atl {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::nanoseconds;  // since the clock's epoch

inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration FromSeconds(double s) { return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s)); }

// A deadline that never comes.
inline constexpr TimePoint kNever = TimePoint::max();

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Blocks (real) or advances time (manual) by d.
  virtual void SleepFor(Duration d) = 0;
  // With `lock` (on cv's mutex) held: waits on `cv` until pred() holds or this clock reaches
  // `deadline` (kNever: no deadline). Returns pred(). A RealClock waits on cv; the others wait
  // for their own time. Whoever makes pred() true must notify cv.
  virtual bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                         const std::function<bool()>& pred);
  bool WaitFor(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Duration d,
               const std::function<bool()>& pred) {
    return WaitUntil(cv, lock, DeadlineAfter(d), pred);
  }
  // Now() + d, saturating at kNever.
  TimePoint DeadlineAfter(Duration d) const {
    const TimePoint now = Now();
    return d >= kNever - now ? kNever : now + d;
  }
  // A thread that waits on this clock says so while it runs (StartThread, ClockThread below): a
  // SimClock moves time only when every such thread waits. EnterThread counts a participant (it
  // may be called by the thread that spawns it, so that it counts before it runs), AdoptThread
  // marks the calling thread as that participant, ExitThread ends it. No-ops for other clocks.
  virtual void EnterThread() {}
  virtual void AdoptThread() {}
  virtual void ExitThread() {}
  double NowSeconds() const { return ToSeconds(Now()); }
};

// Starts a thread that is a participant of `clock` from this call until `body` returns.
std::thread StartThread(Clock& clock, std::function<void()> body);

// RAII: the calling thread is a participant of `clock` for this scope.
class ClockThread {
 public:
  explicit ClockThread(Clock& clock) : clock_(clock) {
    clock_.EnterThread();
    clock_.AdoptThread();
  }
  ~ClockThread() { clock_.ExitThread(); }
  ClockThread(const ClockThread&) = delete;
  ClockThread& operator=(const ClockThread&) = delete;

 private:
  Clock& clock_;
};

class RealClock final : public Clock {
 public:
  TimePoint Now() const override;
  void SleepFor(Duration d) override;
  // A process-wide instance for code that has no injected clock (mains only).
  static RealClock& Default();
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimePoint start = TimePoint::zero()) : now_ns_(start.count()) {}
  TimePoint Now() const override { return TimePoint(now_ns_.load(std::memory_order_acquire)); }
  void SleepFor(Duration d) override { Advance(d); }
  // Waits (re-checking every millisecond of real time) for pred() or for another thread to
  // advance this clock to `deadline`.
  bool WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                 const std::function<bool()>& pred) override;
  void Advance(Duration d) { now_ns_.fetch_add(d.count(), std::memory_order_acq_rel); }
  void AdvanceSeconds(double s) { Advance(FromSeconds(s)); }
  void Set(TimePoint t) { now_ns_.store(t.count(), std::memory_order_release); }

 private:
  std::atomic<int64_t> now_ns_;
};

// Wall-clock seconds since the Unix epoch, for logs and run folders (never for decisions).
double UnixSeconds();

}  // namespace atl
