#include "atoll/syncer/syncer_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace atl::syncer {
namespace {

// Runs f() (which returns what the reply holds) and sets the reply; an exception becomes an
// Internal error for the caller instead of escaping the loop thread.
template <typename Reply, typename F>
void Fulfil(Reply& r, F&& f) {
  try {
    r.Set(f());
  } catch (const std::exception& e) {
    r.Set(InternalError(std::string("syncer: the request failed: ") + e.what()));
  } catch (...) {
    r.Set(InternalError("syncer: the request failed with an unknown exception"));
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

SyncerLoop::SyncerLoop(SyncerCore core, Clock& clock, RoundCallback on_round, Duration tick, RoundGate gate)
    : core_(std::move(core)), clock_(clock), on_round_(std::move(on_round)), tick_(tick), gate_(std::move(gate)) {
  uplink_ = core_.options().uplink;
  for (int p = 0; p < core_.plan().num_fragments(); ++p) numel_.push_back(core_.owns(p) ? core_.theta(p).size() : 0);
  thread_ = StartThread(clock_, [this] { Run(); });
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

void SyncerLoop::EndLongPolls() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    long_polls_ended_ = true;
  }
  cv_.notify_all();
}

bool SyncerLoop::long_polls_ended() const {
  std::lock_guard<std::mutex> lock(mu_);
  return long_polls_ended_;
}

bool SyncerLoop::finish_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_;
}

std::string SyncerLoop::holding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holding_;
}

void SyncerLoop::Post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;  // the task is dropped: its caller gets Unavailable (PostFor)
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void SyncerLoop::Run() {
  bool held = false;
  for (;;) {
    std::deque<Task> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      const TimePoint now = clock_.Now();
      Duration wait = tick_;
      // Held rounds are due now and would wake the loop at once, again and again: while rounds
      // are held the gate is asked once per tick.
      if (auto wake = core_.NextWake(now); wake && !held) wait = std::clamp(*wake - now, Duration::zero(), tick_);
      for (const auto& w : waiters_) wait = std::min(wait, std::max(Duration::zero(), w.deadline - now));
      if (long_polls_ended_ && !waiters_.empty()) wait = Duration::zero();
      clock_.WaitFor(cv_, lock, wait, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) break;
      batch.swap(tasks_);
    }
    // A task that throws must not take the syncer down: the exception is logged, its caller gets
    // an error (each task catches its own; this is the last resort).
    for (auto& t : batch) Guarded("task", [&] { t(core_, clock_.Now()); });
    held = CloseDueRounds();
    Guarded("pull wait", [&] { ServeWaiters(clock_.Now(), false); });
  }
  ServeWaiters(clock_.Now(), true);
  // Tasks still queued are dropped; their callers get Unavailable.
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.clear();
}

bool SyncerLoop::CloseDueRounds() {
  Status gate;
  try {
    if (gate_) gate = gate_(core_);
  } catch (const std::exception& e) {
    gate = InternalError(std::string("the commit check failed: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string why = gate.ok() ? "" : gate.message();
    if (why.empty() != holding_.empty()) {
      if (why.empty()) {
        std::fprintf(stderr, "syncer: rounds resume (they were held: %s)\n", holding_.c_str());
      } else {
        std::fprintf(stderr, "syncer: holding rounds: %s\n", why.c_str());
      }
    }
    holding_ = why;
  }
  if (!gate.ok()) return true;
  // Not Guarded: CloseRound counts the new version before the commit, so a round that threw
  // half way must not be served. The committed state is intact; a restart resumes from it.
  try {
    for (const RoundReport& r : core_.Poll(clock_.Now(), clock_)) {
      if (on_round_) on_round_(core_, r);
    }
  } catch (const std::exception& e) {
    CheckFailed(__FILE__, __LINE__, "closing and committing rounds throws nothing",
                std::string("a round close or its commit threw (") + e.what() +
                    "); the round may be half closed, so the syncer stops here and a restart resumes from its "
                    "committed state");
  } catch (...) {
    CheckFailed(__FILE__, __LINE__, "closing and committing rounds throws nothing",
                "a round close or its commit threw an unknown exception; a restart resumes from the committed state");
  }
  return false;
}

void SyncerLoop::ServeWaiters(TimePoint now, bool expire_all) {
  const bool ended = long_polls_ended();
  auto it = waiters_.begin();
  while (it != waiters_.end()) {
    if (expire_all) {
      it->reply->Set(UnavailableError("syncer is shutting down"));
      it = waiters_.erase(it);
      continue;
    }
    const int64_t v = core_.version(it->fragment);
    const bool newer = v > it->have_version && v >= it->want_version;  // Pull below sends it
    if (newer || now >= it->deadline || ended) {
      const Waiter w = *it;
      it = waiters_.erase(it);
      Fulfil(*w.reply, [&] { return core_.PullShared(w.learner_id, w.fragment, w.have_version, w.want_version); });
    } else {
      ++it;
    }
  }
}

template <typename R>
void SyncerLoop::PostFor(std::shared_ptr<Reply<R>> reply, Task task) {
  // Runs when the last copy of a task that never ran is destroyed (the loop stopped first): its
  // caller gets Unavailable instead of waiting for ever. A task that ran answers (or parks) itself.
  auto unrun = std::make_shared<bool>(true);
  std::shared_ptr<void> sentinel(nullptr, [reply, unrun](void*) {
    if (*unrun) reply->Set(UnavailableError("syncer is shutting down"));
  });
  Post([sentinel, unrun, task = std::move(task)](SyncerCore& core, TimePoint now) {
    *unrun = false;
    task(core, now);
  });
}

template <typename R>
R SyncerLoop::Await(Reply<R>& reply) {
  std::unique_lock<std::mutex> lock(reply.mu);
  clock_.WaitUntil(reply.cv, lock, kNever, [&] { return reply.value.has_value(); });
  return std::move(*reply.value);
}

template <typename R, typename F>
R SyncerLoop::Ask(F fn) {
  auto reply = std::make_shared<Reply<R>>();
  PostFor<R>(reply, [reply, fn = std::move(fn)](SyncerCore& core, TimePoint now) {
    Fulfil(*reply, [&] { return fn(core, now); });
  });
  return Await(*reply);
}

StatusOr<JoinReplyData> SyncerLoop::Join(const JoinRequestData& request) {
  return Ask<StatusOr<JoinReplyData>>([request](SyncerCore& core, TimePoint now) { return core.Join(request, now); });
}

Status SyncerLoop::Leave(int learner_id) {
  return Ask<Status>([learner_id](SyncerCore& core, TimePoint now) { return core.Leave(learner_id, now); });
}

StatusOr<HeartbeatReplyData> SyncerLoop::Heartbeat(int learner_id, const LearnerProgress& progress) {
  const bool finish = finish_requested();
  const TimePoint arrived = clock_.Now();
  return Ask<StatusOr<HeartbeatReplyData>>(
      [learner_id, progress, finish, arrived](SyncerCore& core, TimePoint now) -> StatusOr<HeartbeatReplyData> {
        ATOLL_RETURN_IF_ERROR(core.Heartbeat(learner_id, progress, now, arrived));
        HeartbeatReplyData r;
        r.versions = core.versions();
        r.finish = finish;
        r.incarnation = core.options().incarnation;
        return r;
      });
}

StatusOr<PushResult> SyncerLoop::Push(const PushHeaderData& header, std::span<const std::byte> payload) {
  if (header.public_copy) return Adopt(header, payload);
  const TimePoint arrived = clock_.Now();  // silence is measured to here, not to when the loop gets to it
  // The payload is inflated and checked here, on the caller's thread (pure work on its bytes), so
  // that M pushes arriving together are prepared in parallel and the loop only admits them. A
  // header the core will refuse anyway is passed on unprepared (its own error comes first).
  const bool known = CheckPushShape(header, uplink_, static_cast<int>(numel_.size()), [this](int p) {
                       return numel_[static_cast<size_t>(p)];
                     }).ok();
  if (!known) {  // the payload outlives the call: Ask waits for the loop
    return Ask<StatusOr<PushResult>>([header, payload, arrived](SyncerCore& core, TimePoint now) {
      return core.Push(header, payload, now, arrived);
    });
  }
  auto prepared =
      std::make_shared<PreparedPush>(PreparePush(uplink_, payload, numel_[static_cast<size_t>(header.fragment)]));
  return Ask<StatusOr<PushResult>>([header, prepared, arrived](SyncerCore& core, TimePoint now) {
    return core.Push(header, std::move(*prepared), now, arrived);
  });
}

StatusOr<PushResult> SyncerLoop::Adopt(const PushHeaderData& header, std::span<const std::byte> payload) {
  if (payload.size() % sizeof(float) != 0) {
    return InvalidArgumentError("an offered public copy of " + std::to_string(payload.size()) +
                                " bytes is not a whole number of fp32 values");
  }
  std::vector<float> values(payload.size() / sizeof(float));
  std::memcpy(values.data(), payload.data(), payload.size());
  return Ask<StatusOr<PushResult>>([this, header, &values](SyncerCore& core, TimePoint now) -> StatusOr<PushResult> {
    ATOLL_ASSIGN_OR_RETURN(RoundReport report, core.AdoptCopy(header, values, now));
    std::fprintf(stderr,
                 "syncer: rebuild: adopted fragment %d at version %lld from learner %d (outer momentum and sweep "
                 "reset to zero, no history)\n",
                 report.fragment, static_cast<long long>(report.version), header.learner_id);
    // Committed like a round before any caller can see the version (docs/decisions/004).
    try {
      if (on_round_) on_round_(core, report);
    } catch (const std::exception& e) {
      CheckFailed(__FILE__, __LINE__, "committing an adopted copy throws nothing", e.what());
    }
    return PushResult{report.version, report.version, "adopted as version " + std::to_string(report.version),
                      core.options().incarnation};
  });
}

StatusOr<PullPayload> SyncerLoop::Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                       int64_t want_version) {
  ATOLL_ASSIGN_OR_RETURN(SharedPull shared, PullShared(learner_id, fragment, have_version, wait_seconds, want_version));
  return *shared;
}

StatusOr<SharedPull> SyncerLoop::PullShared(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                            int64_t want_version) {
  auto reply = std::make_shared<PullReply>();
  wait_seconds = std::clamp(wait_seconds, 0.0, 60.0);
  PostFor<StatusOr<SharedPull>>(reply, [this, reply, learner_id, fragment, have_version, wait_seconds, want_version](
                                           SyncerCore& core, TimePoint now) {
    try {
      auto r = core.PullShared(learner_id, fragment, have_version, want_version);
      if (!r.ok() || !(*r)->not_modified || wait_seconds <= 0 || long_polls_ended()) {
        reply->Set(std::move(r));
        return;
      }
      // Parked: ServeWaiters answers when the fragment moves past `have` or the wait runs out.
      waiters_.push_back({learner_id, fragment, have_version, want_version, now + FromSeconds(wait_seconds), reply});
    } catch (const std::exception& e) {
      reply->Set(InternalError(std::string("syncer: pull failed: ") + e.what()));
    } catch (...) {
      reply->Set(InternalError("syncer: pull failed with an unknown exception"));
    }
  });
  return Await(*reply);
}

}  // namespace atl::syncer
