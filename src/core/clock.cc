#include "atoll/core/clock.h"

#include <thread>

namespace atl {

TimePoint RealClock::Now() const {
  return std::chrono::duration_cast<TimePoint>(std::chrono::steady_clock::now().time_since_epoch());
}

void RealClock::SleepFor(Duration d) {
  if (d > Duration::zero()) std::this_thread::sleep_for(d);
}

bool Clock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                      const std::function<bool()>& pred) {
  // Real time: the remaining duration on the steady clock (this clock's Now() is steady time for
  // RealClock, the only clock that does not override this).
  while (!pred()) {
    if (deadline == kNever) {
      cv.wait(lock);
      continue;
    }
    const TimePoint now = Now();
    if (now >= deadline) return false;
    cv.wait_for(lock, deadline - now);
  }
  return true;
}

bool ManualClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                            const std::function<bool()>& pred) {
  while (!pred()) {
    if (Now() >= deadline) return false;
    cv.wait_for(lock, std::chrono::milliseconds(1));
  }
  return true;
}

std::thread StartThread(Clock& clock, std::function<void()> body) {
  clock.EnterThread();  // counted before it runs: simulated time cannot move past its start
  return std::thread([&clock, body = std::move(body)] {
    clock.AdoptThread();
    struct Exit {
      Clock& c;
      ~Exit() { c.ExitThread(); }
    } exit{clock};
    body();
  });
}

RealClock& RealClock::Default() {
  static RealClock clock;
  return clock;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace atl
