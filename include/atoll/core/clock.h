// Clock: the source of time every atoll component takes as a parameter, so that the syncer's
// round policy, the simulator and the tests run the same code against a manual clock.
//
// Time is a monotonic duration since an arbitrary epoch (steady clock for RealClock, 0 for
// ManualClock). Thread-safety: RealClock is stateless; ManualClock is safe to read from any
// thread and to advance from one (its fields are atomic; SleepFor on a ManualClock advances it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace atl {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::nanoseconds;  // since the clock's epoch

inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }
inline Duration FromSeconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Blocks (real) or advances time (manual) by d.
  virtual void SleepFor(Duration d) = 0;
  double NowSeconds() const { return ToSeconds(Now()); }
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
  void Advance(Duration d) { now_ns_.fetch_add(d.count(), std::memory_order_acq_rel); }
  void AdvanceSeconds(double s) { Advance(FromSeconds(s)); }
  void Set(TimePoint t) { now_ns_.store(t.count(), std::memory_order_release); }

 private:
  std::atomic<int64_t> now_ns_;
};

// Wall-clock seconds since the Unix epoch, for logs and run folders (never for decisions).
double UnixSeconds();

}  // namespace atl
