// SyncerLoop: the syncer's event loop. One thread owns the SyncerCore; every public method may be
// called from any thread (gRPC handler threads, tests) and only queues a task to the loop and
// waits for its result. The loop also wakes at grace deadlines and every `tick` to re-run the
// round policy (a learner that stops heartbeating stops counting as live).
//
// Pull is a bounded long poll: the caller waits until the fragment has a version newer than the
// one it holds and at least the one it wants, or until `wait` runs out (then it gets
// not_modified) — never longer.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/clock.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {

class SyncerLoop final : public SyncerApi {
 public:
  using RoundCallback = std::function<void(const SyncerCore&, const RoundReport&)>;
  // Consulted on the loop thread before any round is closed (the syncer: CommitHeadroom). A
  // non-OK status holds every round: none closes, they stay open and keep taking pushes, pulls
  // and heartbeats are served from the last committed state, and the gate is asked again at the
  // next tick. Its message is the reason (holding(), logged once when the hold starts and once
  // when it ends).
  using RoundGate = std::function<Status(const SyncerCore&)>;

  // `on_round` runs on the loop thread after every closed round and before the new version is
  // visible to any caller (log, metrics, persistence); it must not call back into the loop.
  // Closing a round and its `on_round` must not throw: an exception there may leave a round half
  // closed (its version counted, not committed), so the loop reports it as a bug and aborts;
  // the restarted syncer resumes from the committed state.
  SyncerLoop(SyncerCore core, Clock& clock, RoundCallback on_round, Duration tick = std::chrono::milliseconds(50),
             RoundGate gate = nullptr);
  ~SyncerLoop() override;
  SyncerLoop(const SyncerLoop&) = delete;
  SyncerLoop& operator=(const SyncerLoop&) = delete;

  StatusOr<JoinReplyData> Join(const JoinRequestData& request) override;
  StatusOr<HeartbeatReplyData> Heartbeat(int learner_id, const LearnerProgress& progress) override;
  StatusOr<PushResult> Push(const PushHeaderData& header, std::span<const std::byte> payload) override;
  StatusOr<PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                             int64_t want_version) override;
  // Pull's reply as the syncer holds it, shared with its cache (no copy per learner).
  StatusOr<SharedPull> PullShared(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                  int64_t want_version);
  Status Leave(int learner_id) override;

  // Runs f(core, now) on the loop thread and returns its result (for status, snapshots, bytes).
  // An exception thrown by f is rethrown here, in the caller's thread; the loop runs on. Every
  // other task catches its exceptions and returns them as Internal errors (a hostile input must
  // never terminate the syncer).
  template <typename F>
  auto Call(F&& f) -> decltype(f(std::declval<SyncerCore&>(), TimePoint{})) {
    using R = decltype(f(std::declval<SyncerCore&>(), TimePoint{}));
    auto promise = std::make_shared<std::promise<R>>();
    auto future = promise->get_future();
    Post([promise, fn = std::forward<F>(f)](SyncerCore& core, TimePoint now) mutable {
      try {
        promise->set_value(fn(core, now));
      } catch (...) {
        promise->set_exception(std::current_exception());  // rethrown to the caller, not on the loop
      }
    });
    return future.get();
  }

  // Asks learners to stop (heartbeat replies carry finish = true from now on).
  void RequestFinish();
  bool finish_requested() const;
  // Long polls waiting now and later are answered at once (what the fragment holds, or
  // not_modified), so that a server shutting down waits for no poll (the syncer, on its way out).
  void EndLongPolls();
  // Why rounds are held ("" while they close normally). Any thread.
  std::string holding() const;
  // Stops the loop thread; pending pulls get Unavailable. Idempotent.
  void Stop();

 private:
  using Task = std::function<void(SyncerCore&, TimePoint)>;
  // One call's answer, handed from the loop thread to the caller, who waits for it on the clock
  // (so that the loop and its callers also run on a SimClock). Set once; later Sets are ignored.
  template <typename R>
  struct Reply {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<R> value;
    void Set(R v) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (value) return;
        value.emplace(std::move(v));
      }
      cv.notify_all();
    }
  };
  using PullReply = Reply<StatusOr<SharedPull>>;
  struct Waiter {
    int learner_id;
    int fragment;
    int64_t have_version;
    int64_t want_version;
    TimePoint deadline;
    std::shared_ptr<PullReply> reply;
  };
  // Queues a task that answers `reply`: if the task is dropped unrun (the loop stops first), the
  // caller gets Unavailable.
  template <typename R>
  void PostFor(std::shared_ptr<Reply<R>> reply, Task task);
  // Waits for the answer on the clock.
  template <typename R>
  R Await(Reply<R>& reply);
  void Post(Task task);
  // Runs fn(core, now) on the loop thread and returns its Status / StatusOr (Unavailable when the
  // loop is stopping, Internal when fn throws).
  template <typename R, typename F>
  R Ask(F fn);
  void Run();
  // Asks the gate, then closes due rounds and runs on_round for each (or aborts: see above).
  // Returns whether rounds are held.
  bool CloseDueRounds();
  void ServeWaiters(TimePoint now, bool expire_all);
  // Push of a public copy (header.public_copy, a rebuilding syncer): SyncerCore::AdoptCopy, then
  // on_round with its report (the commit), before the reply.
  StatusOr<PushResult> Adopt(const PushHeaderData& header, std::span<const std::byte> payload);
  bool long_polls_ended() const;

  SyncerCore core_;
  // What Push prepares a payload with on the caller's thread (fixed when the core was made).
  diloco::CodecOptions uplink_;
  std::vector<size_t> numel_;  // per fragment (0: another shard's)
  Clock& clock_;
  RoundCallback on_round_;
  Duration tick_;
  RoundGate gate_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;         // guarded by mu_
  bool stopping_ = false;          // guarded by mu_
  bool finish_ = false;            // guarded by mu_
  bool long_polls_ended_ = false;  // guarded by mu_
  std::string holding_;            // guarded by mu_: why rounds are held, "" when they are not
  std::vector<Waiter> waiters_;    // loop thread only
  std::thread thread_;
};

}  // namespace atl::syncer
