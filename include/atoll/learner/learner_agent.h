// LearnerAgent: a learner's side of Decoupled DiLoCo, independent of the model framework.
//
// The training loop (main thread) never waits on the network, except at the synchronous
// schedule's barrier. After every inner step it calls AfterStep, the learner's after-step rule:
// this step's sends (OnStep), then the merged fragments that are due (ApplyDue: the ones that have
// arrived, or at the barrier all of them). A background exchange thread joins the syncer (with backoff), catches up on the
// current global fragments, pushes each fragment's outer gradient on the staggered schedule and
// pulls the merged values; a heartbeat thread reports progress. The three meet only through a
// small locked hand-off (push jobs in, merged fragments out).
//
// Per fragment the agent keeps the public copy Φ_p it last received, its lattice and its version,
// so uplink (Δ = Φ_p − θ_p) and downlink deltas stay bit-identical with the syncer's view
// (docs/decisions/014).
// Counters c_steps/c_tokens of a fragment count the inner steps/tokens not yet merged into the
// value the learner holds.
//
// Receipt (docs/decisions/007). A fragment sent after step s is applied before step
// Schedule::DueStep(s) = s + 1 + τ, and only once the syncer has merged *this* push (the version
// the push reply names): a version without it would throw the learner's own progress away. With
// keep_progress the τ steps trained while the round was merged are kept:
//   θ_p ← α·θ_p + (1 − α)·(Θ_p + θ_p − θ_p,sent)
// and the counters keep those τ steps; without it θ_p ← α·θ_p + (1 − α)·Θ_p and they reset.
//
// Staged tensors (AgentOptions::staged): buffers the caller keeps as host copies of parameters
// that live elsewhere (a GPU, another dtype). The agent does not read them at each send: it parks
// the send until the caller brings the fragment's staged values (Send), so the caller copies only
// the fragments that move, when it has them; and a receipt writes into them what the caller must
// do to its live values (Receipt) instead of values the caller would have to copy back whole.
//
// Thread-safety: AfterStep/OnStep/ApplyDue/ApplyReady/WaitForAllFragments/Progress/Send/UnstageAll
// and the receipt accessors are called from the training thread only (one thread at a time); the parameter spans
// are touched only on that thread. Everything else is internal.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "atoll/core/clock.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/mode.h"
#include "atoll/exchange/lattice.h"
#include "atoll/syncer/api.h"

namespace atl::learner {

struct AgentOptions {
  std::string run_id = "atoll";
  int learner_id = -1;  // -1: let the syncer choose
  std::string host = "localhost";
  bool rejoin = false;        // restarting after a failure
  diloco::Schedule schedule;  // H, P, τ; synchronous for diloco mode (Schedule::Of)
  diloco::CodecOptions uplink{diloco::Encoding::kInt4, 128};
  double alpha = 0.0;         // mixing on receipt: θ ← α·θ + (1−α)·Θ_p
  bool keep_progress = true;  // keep the steps trained since the send on receipt
  double heartbeat_s = 0.5;
  double backoff_initial_s = 0.2, backoff_max_s = 5.0;
  double initial_join_timeout_s = 20.0;  // how long Start() waits for the first join + catch-up
  // How long the training thread waits at the synchronous barrier for the fragments pushed there
  // (ApplyDue); past it, training goes on with those that came back. A synchronous run's rounds
  // wait for every live learner, so this bounds a wait behind a learner that is down but not yet
  // past the syncer's learner timeout.
  double barrier_timeout_s = 600.0;
  // false (ddp mode): join and heartbeat only; the training loop exchanges (DdpExchange).
  bool exchange_fragments = true;
  // true: the join is refused (FailedPrecondition) unless the syncer's H, τ and mode are this
  // schedule's. `atoll learner` reads both from the same run file; the C API's caller may not.
  bool check_schedule = false;
  // Where the agent keeps its public copies (one file per fragment, rewritten whenever a pull moved
  // it; "" = nowhere). A learner process restarted with the same folder loads them, offers their
  // checksums at its join, and catches up with deltas from the versions it held instead of full
  // fetches; its model starts from those copies (docs/failure-semantics.md).
  std::string state_dir;
  // Tensors whose buffers the caller stages (the C API's staged buffers: host copies of GPU or
  // low-precision parameters), by plan tensor index; empty: none. The agent reads a staged buffer
  // only in Start (the initial values) and FlushAll (the caller refreshes it first, UnstageAll).
  // A scheduled send of a fragment with staged slices waits (PendingSends) until Send brings
  // their values, and a receipt writes into them what the caller must do (Receipt).
  std::vector<bool> staged;
  // A sharded syncer (docs/decisions/011): this agent talks to shard `shard.index` of
  // `shard.count` and exchanges only the fragments that shard owns (p mod count = index); a
  // learner runs one agent per shard. The join is refused (FailedPrecondition, fatal) when the
  // syncer is another shard or has another shard count. {0, 1}: one syncer, every fragment.
  syncer::ShardSpec shard;
};

struct AgentCounters {
  int64_t pushes = 0, pushes_failed = 0, pulls = 0, fragments_applied = 0;
  int64_t pulls_delta = 0, pulls_full = 0;  // pulls that carried a compressed delta / full fp32 values
  int64_t payload_bytes_up = 0, payload_bytes_down = 0;
  int64_t joins = 0, catchup_fragments = 0, rejected = 0;
  int64_t checksum_mismatches = 0;  // pulled copies that disagreed with the syncer's bits
  int64_t pushes_repeated = 0;      // pushes a restarted syncer had not committed (sent again)
  int64_t pushes_deferred = 0;      // scheduled sends skipped: the fragment's last push was not applied yet
  int64_t rebases = 0;              // newer public copies the parameters moved onto, their progress kept
  int64_t state_loaded = 0;         // fragments whose public copy came from the state folder at Start
  int64_t state_errors = 0;         // state files that could not be written (the run goes on)
  // Public copies a rebuilding syncer asked for (docs/decisions/021): offered, and adopted by it.
  int64_t copies_offered = 0, copies_adopted = 0;
  double first_contribution_s = -1;  // seconds from Start() to the first accepted push
  bool joined = false;
  int learner_id = -1;
  uint64_t push_session = 0;  // of its latest join: every push carries it (docs/decisions/019)
  int64_t version_held = -1;  // newest fragment version received
};

using Progress = syncer::LearnerProgress;  // version_held is filled in by the agent

// What the merges applied after a step did to the training thread.
struct StepResult {
  int applied = 0;            // fragments written into the parameters
  double barrier_wait_s = 0;  // time blocked at the synchronous barrier (0 between barriers)
};

// The after-step rule, once for an agent and for a group of them (AgentGroup): the sends of inner
// step `step` (OnStep), then the merges due before step + 1 (ApplyDue).
template <typename Agent>
StepResult AfterStepRule(Agent& agent, int64_t step, int64_t tokens) {
  agent.OnStep(step, tokens);
  return agent.ApplyDue(step + 1);
}

class LearnerAgent {
 public:
  // `tensors` are live views of the model's parameters in the plan's tensor order.
  LearnerAgent(AgentOptions options, diloco::FragmentPlan plan, std::vector<std::span<float>> tensors,
               syncer::SyncerApi& api, Clock& clock);
  ~LearnerAgent();
  LearnerAgent(const LearnerAgent&) = delete;
  LearnerAgent& operator=(const LearnerAgent&) = delete;

  // Starts the threads and waits (bounded) for the first join and catch-up; when that succeeds
  // the global fragments are applied before returning. Returns OK either way unless the syncer
  // refused us for good (wrong run, model, version, token): then the error says why.
  Status Start();
  // The after-step rule: call after inner step `step` (0-based) finished, with the tokens it
  // processed. OnStep(step, tokens), then ApplyDue(step + 1).
  StepResult AfterStep(int64_t step, int64_t tokens);
  // This step's sends: snapshots the fragments the schedule sends after `step` and queues them.
  void OnStep(int64_t step, int64_t tokens);
  // Whether the training thread waits before `next_step` for every fragment pushed at the barrier:
  // the synchronous schedule, at the end of each H-step period.
  bool BarrierBefore(int64_t next_step) const;
  // The merges due before `next_step`: at a barrier WaitForAllFragments(next_step,
  // barrier_timeout_s), else ApplyReady(next_step).
  StepResult ApplyDue(int64_t next_step);
  // Applies merged fragments that are due (sent at s, applied at step ≥ s + τ). Returns how many.
  int ApplyReady(int64_t next_step);
  // diloco mode: blocks until every fragment pushed at this barrier has come back merged (or
  // `timeout_s` passes / the run finishes). Returns the number of fragments applied.
  int WaitForAllFragments(int64_t next_step, double timeout_s);
  // End of training: pushes every fragment that has unsent progress (c_steps > 0) and waits,
  // bounded by `timeout_s`, until those pushes are accepted, so the last steps are merged too.
  // Returns the number of fragments pushed.
  int FlushAll(int64_t step, double timeout_s);
  void SetProgress(const Progress& p);
  // Stops the threads; pending pushes are abandoned.
  void Stop();
  // End of training: tells the syncer this learner is done (it stops counting as live at once,
  // so no round waits for it), then stops the threads. Returns the Leave call's status.
  Status Leave();

  // What ApplyReady (or WaitForAllFragments, or Start) last wrote, fragment by fragment in
  // order. Shared slices hold the final values, as always. A staged slice holds what the caller
  // must do to its live values: `additive` — add the buffer's values: Δ = (1−α)(Θ_p − θ_sent) for
  // the merge of this learner's own push (the progress since the send kept), Φ_new − Φ_old for a
  // rebase onto a newer public copy; otherwise θ ← α·θ + (1−α)·Θ_p (a copy when α = 0). Training
  // thread.
  struct Receipt {
    int fragment;
    bool additive;
  };
  const std::vector<Receipt>& receipts() const { return receipts_; }
  // The fragments the last OnStep scheduled for sending (pushed, or pending their staged values).
  const std::vector<int>& sent_at_last_step() const { return sent_at_last_step_; }
  // The fragments OnStep(step) would schedule now. A join or rejoin in between may change that;
  // a scheduled fragment whose staged values were not provided is then parked (PendingSends).
  std::vector<int> DueAt(int64_t step) const;
  // Scheduled sends waiting for Send, ascending.
  std::vector<int> PendingSends() const;
  // The staged values of a fragment (its staged slices concatenated in slice order): of a pending
  // one, as they were after the step that scheduled it (completes the snapshot, queues the push);
  // of one in DueAt(next_step), as they are before OnStep(next_step), which then sends it at once.
  // InvalidArgument (nothing changes) for any other fragment or a count other than staged_numel(p).
  Status Send(int fragment, std::span<const float> staged_values, int64_t next_step);
  int64_t staged_numel(int fragment) const { return staged_numel_[static_cast<size_t>(fragment)]; }
  // The caller wrote every staged tensor's live values into its buffer: from now on they are
  // shared (the end of training: FlushAll reads them, receipts land as final values).
  void UnstageAll();
  // The public copy held of each fragment (version -1: none yet), for a learner's state file.
  struct HeldCopy {
    int64_t version = -1;
    uint64_t checksum = 0;
  };
  std::vector<HeldCopy> HeldCopies() const;

  bool finish_requested() const { return finish_.load(); }
  Status fatal_error() const;
  AgentCounters counters() const;

 private:
  struct PushJob {
    int fragment;
    int64_t step;
    int64_t c_tokens, c_steps;
    std::vector<float> local;
    bool final_sync = false;  // queued by FlushAll: the learner's last work on this fragment
  };
  // A pulled copy of a fragment for the training thread. Three kinds: the merge of this learner's
  // push (own_push: progress since the send kept), a catch-up (the values replace the
  // parameters), or a rebase (`from` set: the public copy moved from `from` to `values` while the
  // parameters still descend from `from`; they move by values − from and keep their progress).
  struct Ready {
    int fragment;
    int64_t version;
    int64_t due_step;
    bool own_push;  // the merge of this learner's push
    std::vector<float> values;
    std::vector<float> from;  // a rebase: the copy the parameters descend from
  };
  struct Awaited {
    int64_t due_step;
    int64_t merged_version;  // the version that includes the push
    uint64_t incarnation;    // of the syncer process that accepted the push (0: not said)
  };
  // What a pulled version is for.
  enum class PullPurpose { kCatchUp, kAwaited, kRefresh };
  // The snapshot last sent of a fragment, for keep_progress (training thread).
  struct Sent {
    std::vector<float> local;
    int64_t c_tokens = 0, c_steps = 0;
  };
  // Writes a received fragment into the parameters (training thread).
  void ApplyOne(const Ready& r);
  // Writes merged values into fragment f's slices: shared slices take their final values (kept
  // progress θ − θ_sent when `at_send` is given, mixed by `alpha`); staged slices the Receipt.
  void WriteReceipt(const diloco::Fragment& f, std::span<const float> merged, const std::vector<float>* at_send,
                    double alpha);
  // A newer public copy of p (`values`, version `version`) replaced `from`, the copy the learner's
  // parameters descend from, while it keeps its progress (a rejoin's refresh, a version passed on
  // the way to an awaited merge): queued snapshots of p move by values − from now, the parameters
  // when the training thread applies the rebase (mu_ held). `in_flight`: a snapshot being pushed.
  void PostRebaseLocked(int p, int64_t version, const std::vector<float>& values, std::vector<float> from,
                        PushJob* in_flight);
  bool Staged(int tensor) const { return !staged_.empty() && staged_[static_cast<size_t>(tensor)]; }
  // The fragment's snapshot of shared slices (staged positions left 0), parked until Send (mu_ held).
  void ParkPushLocked(int p, int64_t step);
  // Fills a parked snapshot's staged positions and queues its push (mu_ held).
  void CompletePushLocked(int p, std::span<const float> staged_values);
  // The held copy of p as the exchange thread now has it (exchange thread).
  void NoteHeld(int p, uint64_t checksum);

  // Snapshots fragment p (training thread, mu_ held) and queues it for the exchange thread.
  void QueuePushLocked(int p, int64_t step, bool final_sync = false);
  // Whether p's last push is being sent, awaited, or received but not applied, or a pulled copy
  // of p waits for the training thread (a snapshot taken before it is applied would be measured
  // against the wrong copy) (mu_ held). A push still queued is not outstanding: a newer snapshot
  // replaces it.
  bool PushOutstandingLocked(int p) const;
  void ExchangeLoop();
  // The exchange thread's stages. What one pass of the loop does: a queued push, or else a poll
  // of the awaited merges (waiting `poll_wait` on the first).
  struct ExchangeWork {
    std::optional<PushJob> job;
    std::map<int, Awaited> awaiting;
    double poll_wait = 0;
  };
  // Sleeps until there is work (or a second has passed with nothing awaited) and takes it;
  // false when the agent stops.
  bool TakeExchangeWork(ExchangeWork& work);
  // Pushes `job`; if the syncer no longer holds the copy it was computed against (restarted),
  // refreshes the fragment in full and pushes the same snapshot again.
  Status PushWithRefresh(PushJob& job);
  // Counts a failed push or pull and marks a rejoin where the syncer is down or restarted.
  void NoteExchangeError(const Status& st);
  void HeartbeatLoop();
  Status JoinAndCatchUp();
  // The join request: identity, and per fragment the checksum and version of the copy it holds.
  syncer::JoinRequestData JoinRequest();
  // A rebuilding syncer's join reply: offers the public copies it asked for (each a push with
  // public_copy set, its fp32 values at the version held). Refusals are counted, never fatal: the
  // learner then takes the syncer's copies like any other.
  void OfferCopies(const syncer::JoinReplyData& reply);
  // The state folder (AgentOptions::state_dir): loads the public copies a previous process of
  // this learner kept (Start; damaged or foreign files are ignored) and writes one after a pull
  // moved it (exchange thread).
  void LoadState();
  void SaveState(int p);
  // After a join: which fragments the learner holds at which version (the syncer matched their
  // checksums), the run's initial values snapped to their lattice where those matched.
  void AdoptHeld(const syncer::JoinReplyData& reply);
  // The syncer's fragment plan is this learner's (FailedPrecondition naming the difference).
  Status CheckPlan(const syncer::JoinReplyData& reply) const;
  // Pulls every fragment whose version differs from `versions` (a rejoin keeps local progress).
  Status CatchUp(const std::vector<int64_t>& versions, bool rejoin_in_process);
  Status PushOne(PushJob& job);
  // Pulls fragment p; on a newer version updates Φ_p. kCatchUp queues it for the training thread
  // at once; kAwaited queues it once it holds the learner's push (`awaited`); kRefresh keeps the
  // local progress: the parameters are rebased onto the new Φ_p (PostRebaseLocked), so the next
  // push's outer gradient is this learner's progress only, never the others' merges undone.
  // A version before the awaited one is a rebase too.
  Status PullOne(int p, double wait_s, PullPurpose purpose, Awaited awaited = {0, 0, 0}, PushJob* in_flight = nullptr);
  // PullOne's request: fragment p from version have_[p] (in full when the syncer does not know
  // it), at least version `want` (-1: any); Unavailable (and a rejoin marked) when another syncer
  // incarnation answered. Counts the pull.
  StatusOr<syncer::PullPayload> FetchFragment(int p, double wait_s, int64_t want);
  void Backoff(double& delay_s);
  // After a syncer restart (new incarnation; `versions` are its committed versions): stops
  // waiting for merges of pushes it never committed, so their work goes out again (mu_ held).
  void ForgetUncommittedPushesLocked(const syncer::JoinReplyData& reply);
  // How long the exchange thread's long poll for an awaited merge may wait (mu_ held): until just
  // before the training thread's next push is expected, within [0.05, 1] s. The syncer answers as
  // soon as the merge exists, so a long wait costs no latency; ending it before the next push
  // keeps pushes from queueing behind it. Polling every 50 ms instead cost ~10 % of the training
  // threads' throughput on 2 cores (thread wake-ups on both processes).
  double PollWaitLocked(TimePoint now) const;
  // Whether this agent exchanges fragment p (its shard owns it).
  bool Mine(int p) const { return options_.shard.owns(p); }

  AgentOptions options_;
  diloco::FragmentPlan plan_;
  std::vector<std::span<float>> tensors_;
  syncer::SyncerApi& api_;
  Clock& clock_;
  TimePoint started_{};

  // Training-thread state.
  std::vector<int64_t> c_tokens_, c_steps_;
  std::map<int, Sent> sent_;
  std::vector<bool> staged_;           // AgentOptions::staged until UnstageAll
  std::vector<int64_t> staged_numel_;  // per fragment: its values in staged slices
  std::vector<Receipt> receipts_;
  std::vector<int> sent_at_last_step_;
  std::map<int, std::vector<float>> provided_;  // staged values given before OnStep

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PushJob> push_queue_;   // guarded by mu_
  std::map<int, PushJob> pending_;   // sends waiting for their staged values; guarded by mu_
  std::vector<HeldCopy> held_;       // guarded by mu_
  int pushes_in_flight_ = 0;         // popped, not yet answered; guarded by mu_
  std::set<int> pushing_;            // fragments of those pushes; guarded by mu_
  std::deque<Ready> ready_;          // guarded by mu_
  std::map<int, Awaited> awaiting_;  // fragment → its pushed round; guarded by mu_
  Progress progress_;                // guarded by mu_
  // When the training thread last called OnStep and the recent interval between calls (EMA): the
  // exchange thread long-polls until shortly before the next push is due (PollWaitLocked).
  TimePoint last_step_at_{};    // guarded by mu_
  double step_interval_s_ = 0;  // guarded by mu_
  bool flushing_ = false;       // FlushAll called: no next push to wait for; guarded by mu_
  AgentCounters counters_;      // guarded by mu_
  Status fatal_;                // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  // Exchange and heartbeat threads that have not returned yet. Stop() waits for 0 on the clock
  // (not in join alone): under SimClock a thread blocked in join would hold simulated time still
  // while the thread it joins waits for a simulated deadline (a long poll), and neither moves.
  int threads_running_ = 0;   // guarded by mu_
  bool need_rejoin_ = true;   // guarded by mu_
  uint64_t incarnation_ = 0;  // guarded by mu_
  uint64_t push_seq_ = 0;     // the last push's sequence number (never reused); guarded by mu_

  // Exchange-thread state: the public copies, their lattices and their versions.
  std::vector<std::vector<float>> public_;
  std::vector<exchange::Lattice> lattice_;
  std::vector<int64_t> have_;
  std::vector<bool> loaded_;  // public_[p] came from the state folder (until the first join)
  // The fragments' values when Start() was called, offered at the first join: the syncer sends
  // none of those it already holds bit for bit (same seed). Cleared after the first join.
  std::vector<std::vector<float>> initial_;

  std::atomic<bool> finish_{false};
  std::thread exchange_thread_, heartbeat_thread_;
  // Runs `loop` on a thread of the clock, counted in threads_running_ until it returns.
  std::thread StartLoop(void (LearnerAgent::*loop)());
};

}  // namespace atl::learner
