#include "atoll/core/sim_clock.h"

#include <algorithm>

namespace atl {
namespace {
// Whether this thread entered a SimClock (participants are counted per clock; a thread enters
// at most one at a time).
thread_local const SimClock* tl_entered = nullptr;
// How long a waiter sleeps in real time before it re-checks. Notifications make this rare: it only
// covers a wake-up sent while the waiter was between registering and waiting.
constexpr auto kRecheck = std::chrono::milliseconds(2);
}  // namespace

void SimClock::EnterThread() {
  std::lock_guard<std::mutex> g(mu_);
  ++participants_;
}

void SimClock::AdoptThread() { tl_entered = this; }

void SimClock::ExitThread() {
  std::lock_guard<std::mutex> g(mu_);
  --participants_;
  if (tl_entered == this) tl_entered = nullptr;
  MaybeJumpLocked(nullptr);  // this thread may have been the last one running
}

int64_t SimClock::jumps() const {
  std::lock_guard<std::mutex> g(mu_);
  return jumps_;
}

void SimClock::SleepFor(Duration d) {
  std::mutex m;
  std::condition_variable cv;
  std::unique_lock<std::mutex> lock(m);
  WaitUntil(cv, lock, DeadlineAfter(d), [] { return false; });
}

bool SimClock::WaitUntil(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, TimePoint deadline,
                         const std::function<bool()>& pred) {
  const bool visitor = tl_entered != this;  // waits without having entered: a participant while waiting
  for (;;) {
    if (pred()) return true;
    if (Now() >= deadline) return false;
    Waiter w{&cv, lock.mutex(), &pred, deadline};
    {
      std::lock_guard<std::mutex> g(mu_);
      if (visitor) ++participants_;
      waiters_.push_back(&w);
      MaybeJumpLocked(lock.mutex());
    }
    if (!pred() && Now() < deadline) cv.wait_for(lock, kRecheck);
    std::lock_guard<std::mutex> g(mu_);
    waiters_.remove(&w);
    if (visitor) --participants_;
  }
}

void SimClock::MaybeJumpLocked(const std::mutex* held) {
  if (static_cast<int>(waiters_.size()) < participants_) return;  // someone is running
  TimePoint earliest = kNever;
  for (Waiter* w : waiters_) {
    bool ready;
    if (w->mu == held) {
      ready = (*w->pred)();
    } else {
      // Never blocks (lock order: a waiter's mutex, then mu_): a waiter that holds its mutex is
      // about to wait or is running; it re-checks within kRecheck.
      if (!w->mu->try_lock()) return;
      ready = (*w->pred)();
      w->mu->unlock();
    }
    if (ready) return;  // notified, not yet awake: time stands still until it has run
    earliest = std::min(earliest, w->deadline);
  }
  if (earliest == kNever) return;  // everyone waits for something only a thread can do
  if (earliest > Now()) {
    now_ns_.store(earliest.count(), std::memory_order_release);
    ++jumps_;
  }
  for (Waiter* w : waiters_) {
    if (w->deadline <= earliest) w->cv->notify_all();
  }
}

}  // namespace atl
