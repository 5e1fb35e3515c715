#include "atoll/syncer/syncer_loop.h"

#include <algorithm>

namespace atl::syncer {

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
    for (auto& t : batch) t(core_, clock_.Now());
    const TimePoint now = clock_.Now();
    for (const RoundReport& r : core_.Poll(now, clock_)) {
      if (on_round_) on_round_(core_, r);
    }
    ServeWaiters(clock_.Now(), false);
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
      it->promise->set_value(core_.Pull(it->learner_id, it->fragment, it->have_version));
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {
template <typename T>
StatusOr<T> Await(std::future<StatusOr<T>>& f) {
  try {
    return f.get();
  } catch (const std::future_error&) {
    return UnavailableError("syncer is shutting down");
  }
}
Status Await(std::future<Status>& f) {
  try {
    return f.get();
  } catch (const std::future_error&) {
    return UnavailableError("syncer is shutting down");
  }
}
}  // namespace

StatusOr<JoinReplyData> SyncerLoop::Join(const JoinRequestData& request) {
  auto p = std::make_shared<std::promise<StatusOr<JoinReplyData>>>();
  auto f = p->get_future();
  Post([p, request](SyncerCore& core, TimePoint now) { p->set_value(core.Join(request, now)); });
  return Await(f);
}

Status SyncerLoop::Leave(int learner_id) {
  auto p = std::make_shared<std::promise<Status>>();
  auto f = p->get_future();
  Post([p, learner_id](SyncerCore& core, TimePoint now) { p->set_value(core.Leave(learner_id, now)); });
  return Await(f);
}

StatusOr<HeartbeatReplyData> SyncerLoop::Heartbeat(int learner_id, const LearnerProgress& progress) {
  auto p = std::make_shared<std::promise<StatusOr<HeartbeatReplyData>>>();
  auto f = p->get_future();
  const bool finish = finish_requested();
  Post([p, learner_id, progress, finish](SyncerCore& core, TimePoint now) {
    Status st = core.Heartbeat(learner_id, progress, now);
    if (!st.ok()) {
      p->set_value(st);
      return;
    }
    HeartbeatReplyData r;
    r.versions = core.versions();
    r.finish = finish;
    r.incarnation = core.options().incarnation;
    p->set_value(r);
  });
  return Await(f);
}

StatusOr<PushResult> SyncerLoop::Push(const PushHeaderData& header, std::span<const std::byte> payload) {
  auto p = std::make_shared<std::promise<StatusOr<PushResult>>>();
  auto f = p->get_future();
  Post([p, header, payload](SyncerCore& core, TimePoint now) {
    p->set_value(core.Push(header, payload, now));  // payload outlives the call: we wait below
  });
  return Await(f);
}

StatusOr<PullPayload> SyncerLoop::Pull(int learner_id, int fragment, int64_t have_version,
                                       double wait_seconds) {
  auto p = std::make_shared<std::promise<StatusOr<PullPayload>>>();
  auto f = p->get_future();
  wait_seconds = std::clamp(wait_seconds, 0.0, 60.0);
  Post([this, p, learner_id, fragment, have_version, wait_seconds](SyncerCore& core, TimePoint now) {
    auto r = core.Pull(learner_id, fragment, have_version);
    if (!r.ok() || !r->not_modified || wait_seconds <= 0) {
      p->set_value(std::move(r));
      return;
    }
    waiters_.push_back({learner_id, fragment, have_version, now + FromSeconds(wait_seconds), p});
  });
  return Await(f);
}

}  // namespace atl::syncer
