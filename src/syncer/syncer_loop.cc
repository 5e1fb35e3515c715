#include "atoll/syncer/syncer_loop.h"

#include <algorithm>
#include <cstdio>

namespace atl::syncer {
namespace {

// Runs f() (which returns what the promise holds) and sets the promise; an exception becomes an
// Internal error for the caller instead of escaping the loop thread.
template <typename T, typename F>
void Fulfil(std::promise<T>& p, F&& f) {
  try {
    p.set_value(f());
  } catch (const std::exception& e) {
    p.set_value(InternalError(std::string("syncer: the request failed: ") + e.what()));
  } catch (...) {
    p.set_value(InternalError("syncer: the request failed with an unknown exception"));
  }
}

template <typename F>
void Guarded(const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "syncer: %s failed with an exception (ignored): %s\n", what, e.what());
  } catch (...) {
    std::fprintf(stderr, "syncer: %s failed with an unknown exception (ignored)\n", what);
  }
}

}  // namespace

SyncerLoop::SyncerLoop(SyncerCore core, Clock& clock, RoundCallback on_round, Duration tick)
    : core_(std::move(core)), clock_(clock), on_round_(std::move(on_round)), tick_(tick) {
  thread_ = std::thread([this] { Run(); });
}

SyncerLoop::~SyncerLoop() { Stop(); }

void SyncerLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SyncerLoop::RequestFinish() {
  std::lock_guard<std::mutex> lock(mu_);
  finish_ = true;
}

bool SyncerLoop::finish_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_;
}

void SyncerLoop::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;  // the promise is dropped: its future reports broken_promise
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void SyncerLoop::Run() {
  for (;;) {
    std::deque<Task> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const TimePoint now = clock_.Now();
      Duration wait = tick_;
      if (auto wake = core_.NextWake(now)) wait = std::clamp(*wake - now, Duration::zero(), tick_);
      for (const auto& w : waiters_) wait = std::min(wait, std::max(Duration::zero(), w.deadline - now));
      cv_.wait_for(lock, wait, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) break;
      batch.swap(tasks_);
    }
    // A task or callback that throws must not take the syncer down: the exception is logged, the
    // caller of a task gets an error (each task catches its own; this is the last resort).
    for (auto& t : batch) Guarded("task", [&] { t(core_, clock_.Now()); });
    Guarded("round close", [&] {
      for (const RoundReport& r : core_.Poll(clock_.Now(), clock_)) {
        if (on_round_) on_round_(core_, r);
      }
    });
    Guarded("pull wait", [&] { ServeWaiters(clock_.Now(), false); });
  }
  ServeWaiters(clock_.Now(), true);
  // Tasks still queued are dropped; their callers see a broken promise → Unavailable.
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.clear();
}

void SyncerLoop::ServeWaiters(TimePoint now, bool expire_all) {
  auto it = waiters_.begin();
  while (it != waiters_.end()) {
    if (expire_all) {
      it->promise->set_value(UnavailableError("syncer is shutting down"));
      it = waiters_.erase(it);
      continue;
    }
    const bool newer = core_.version(it->fragment) > it->have_version;  // Pull below sends it
    if (newer || now >= it->deadline) {
      auto promise = std::move(it->promise);
      const Waiter w = *it;
      it = waiters_.erase(it);
      Fulfil(*promise, [&] { return core_.Pull(w.learner_id, w.fragment, w.have_version); });
    } else {
      ++it;
    }
  }
}

namespace {
// R is Status or StatusOr<T>: both are made from an error Status.
template <typename R>
R Await(std::future<R>& f) {
  try {
    return f.get();
  } catch (const std::future_error&) {
    return UnavailableError("syncer is shutting down");
  } catch (const std::exception& e) {
    return InternalError(std::string("syncer: ") + e.what());
  }
}
}  // namespace

template <typename R, typename F>
R SyncerLoop::Ask(F fn) {
  auto p = std::make_shared<std::promise<R>>();
  auto f = p->get_future();
  Post([p, fn = std::move(fn)](SyncerCore& core, TimePoint now) mutable { Fulfil(*p, [&] { return fn(core, now); }); });
  return Await(f);
}

StatusOr<JoinReplyData> SyncerLoop::Join(const JoinRequestData& request) {
  return Ask<StatusOr<JoinReplyData>>([request](SyncerCore& core, TimePoint now) { return core.Join(request, now); });
}

Status SyncerLoop::Leave(int learner_id) {
  return Ask<Status>([learner_id](SyncerCore& core, TimePoint now) { return core.Leave(learner_id, now); });
}

StatusOr<HeartbeatReplyData> SyncerLoop::Heartbeat(int learner_id, const LearnerProgress& progress) {
  const bool finish = finish_requested();
  return Ask<StatusOr<HeartbeatReplyData>>(
      [learner_id, progress, finish](SyncerCore& core, TimePoint now) -> StatusOr<HeartbeatReplyData> {
        ATOLL_RETURN_IF_ERROR(core.Heartbeat(learner_id, progress, now));
        HeartbeatReplyData r;
        r.versions = core.versions();
        r.finish = finish;
        r.incarnation = core.options().incarnation;
        return r;
      });
}

StatusOr<PushResult> SyncerLoop::Push(const PushHeaderData& header, std::span<const std::byte> payload) {
  // The payload outlives the call: Ask waits for the loop.
  return Ask<StatusOr<PushResult>>(
      [header, payload](SyncerCore& core, TimePoint now) { return core.Push(header, payload, now); });
}

StatusOr<PullPayload> SyncerLoop::Pull(int learner_id, int fragment, int64_t have_version,
                                       double wait_seconds) {
  auto p = std::make_shared<std::promise<StatusOr<PullPayload>>>();
  auto f = p->get_future();
  wait_seconds = std::clamp(wait_seconds, 0.0, 60.0);
  Post([this, p, learner_id, fragment, have_version, wait_seconds](SyncerCore& core, TimePoint now) {
    try {
      auto r = core.Pull(learner_id, fragment, have_version);
      if (!r.ok() || !r->not_modified || wait_seconds <= 0) {
        p->set_value(std::move(r));
        return;
      }
      waiters_.push_back({learner_id, fragment, have_version, now + FromSeconds(wait_seconds), p});
    } catch (const std::exception& e) {
      p->set_value(InternalError(std::string("syncer: pull failed: ") + e.what()));
    }
  });
  return Await(f);
}

}  // namespace atl::syncer
