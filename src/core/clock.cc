#include "atoll/core/clock.h"

#include <thread>

namespace atl {

TimePoint RealClock::Now() const {
  return std::chrono::duration_cast<TimePoint>(std::chrono::steady_clock::now().time_since_epoch());
}

void RealClock::SleepFor(Duration d) {
  if (d > Duration::zero()) std::this_thread::sleep_for(d);
}

RealClock& RealClock::Default() {
  static RealClock clock;
  return clock;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace atl
