#include "atoll/learner/learner_agent.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "atoll/core/file.h"

#include "atoll/exchange/fragment_exchange.h"

namespace atl::learner {
namespace {

// Refusals that retrying cannot fix: the learner must stop and say why.
bool IsPermanent(const Status& st) {
  switch (st.code()) {
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnauthenticated:
    case StatusCode::kPermissionDenied:
    case StatusCode::kAlreadyExists: return true;
    default: return false;
  }
}

}  // namespace

LearnerAgent::LearnerAgent(AgentOptions options, diloco::FragmentPlan plan, std::vector<std::span<float>> tensors,
                           syncer::SyncerApi& api, Clock& clock)
    : options_(std::move(options)), plan_(std::move(plan)), tensors_(std::move(tensors)), api_(api), clock_(clock) {
  const size_t P = static_cast<size_t>(plan_.num_fragments());
  ATOLL_CHECK(tensors_.size() == plan_.tensors.size());
  c_tokens_.assign(P, 0);
  c_steps_.assign(P, 0);
  public_.resize(P);
  lattice_.resize(P);
  have_.assign(P, -1);
  loaded_.assign(P, false);
  held_.assign(P, HeldCopy{});
  counters_.learner_id = options_.learner_id;
  ATOLL_CHECK(options_.staged.empty() || options_.staged.size() == tensors_.size());
  staged_ = options_.staged;
  staged_numel_.assign(P, 0);
  for (const auto& f : plan_.fragments) {
    for (const auto& s : f.slices) staged_numel_[static_cast<size_t>(f.index)] += Staged(s.tensor) ? s.count : 0;
  }
}

LearnerAgent::~LearnerAgent() { Stop(); }

Status LearnerAgent::Start() {
  started_ = clock_.Now();
  if (options_.exchange_fragments) {
    LoadState();
    initial_.resize(static_cast<size_t>(plan_.num_fragments()));
    for (int p = 0; p < plan_.num_fragments(); ++p) {
      initial_[static_cast<size_t>(p)].resize(static_cast<size_t>(plan_.fragments[static_cast<size_t>(p)].numel));
      exchange::GatherFragment(plan_.fragments[static_cast<size_t>(p)], tensors_, initial_[static_cast<size_t>(p)]);
    }
  }
  exchange_thread_ = StartLoop(&LearnerAgent::ExchangeLoop);
  heartbeat_thread_ = StartLoop(&LearnerAgent::HeartbeatLoop);
  // Wait (bounded) for the first join so that the learner starts from the global model.
  std::unique_lock<std::mutex> lock(mu_);
  clock_.WaitFor(cv_, lock, FromSeconds(options_.initial_join_timeout_s),
                 [&] { return counters_.joined || !fatal_.ok() || stop_; });
  if (!fatal_.ok()) return fatal_;
  lock.unlock();
  ApplyReady(0);
  return Status::Ok();
}

std::thread LearnerAgent::StartLoop(void (LearnerAgent::*loop)()) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++threads_running_;
  }
  return StartThread(clock_, [this, loop] {
    struct Done {
      LearnerAgent* a;
      ~Done() {
        std::lock_guard<std::mutex> lock(a->mu_);
        --a->threads_running_;
        a->cv_.notify_all();
      }
    } done{this};
    (this->*loop)();
  });
}

void LearnerAgent::Stop() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
    // A thread in a long poll returns when the poll's wait ends (≤ 1 s); waiting for that on the
    // clock lets simulated time move to it (threads_running_).
    clock_.WaitFor(cv_, lock, std::chrono::seconds(120), [&] { return threads_running_ == 0; });
  }
  if (exchange_thread_.joinable()) exchange_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

Status LearnerAgent::Leave() {
  Stop();  // no heartbeat may race the goodbye and mark the learner live again
  int id;
  bool joined, current;
  syncer::LearnerProgress last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = counters_.learner_id;
    joined = counters_.joined;
    current = joined && !need_rejoin_;
    last = progress_;
    last.version_held = counters_.version_held;
  }
  if (!joined) return Status::Ok();
  // The last progress first (best effort): the periodic heartbeat may be up to heartbeat_s old,
  // and a short run may end before one carried any of its steps — the syncer's status would
  // then miss the tokens this learner trained.
  if (current) (void)api_.Heartbeat(id, last);
  return api_.Leave(id);
}

Status LearnerAgent::fatal_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

AgentCounters LearnerAgent::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void LearnerAgent::SetProgress(const Progress& p) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_ = p;
}

int LearnerAgent::FlushAll(int64_t step, double timeout_s) {
  // First take in the merges still in flight (bounded by half the budget): pushing a fragment
  // whose last push is not yet applied would send that progress a second time.
  const TimePoint deadline = clock_.Now() + FromSeconds(timeout_s / 2);
  {
    std::unique_lock<std::mutex> lock(mu_);
    flushing_ = true;  // polls stay short from here: Leave() waits for the one in progress
    clock_.WaitUntil(cv_, lock, deadline, [&] {
      return stop_ || finish_ || (push_queue_.empty() && pushes_in_flight_ == 0 && awaiting_.empty());
    });
  }
  ApplyReady(std::numeric_limits<int64_t>::max());
  int queued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!counters_.joined) return 0;
    for (int p = 0; p < plan_.num_fragments(); ++p) {
      if (c_steps_[static_cast<size_t>(p)] == 0 || !Mine(p)) continue;
      QueuePushLocked(p, step, /*final_sync=*/true);
      ++queued;
    }
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> lock(mu_);
  clock_.WaitFor(cv_, lock, FromSeconds(timeout_s / 2),
                 [&] { return stop_ || (push_queue_.empty() && pushes_in_flight_ == 0); });
  return queued;
}

void LearnerAgent::OnStep(int64_t step, int64_t tokens) {
  for (size_t p = 0; p < c_steps_.size(); ++p) {
    c_steps_[p] += 1;
    c_tokens_[p] += tokens;
  }
  const std::vector<int> send = options_.schedule.FragmentsAt(step);
  sent_at_last_step_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  const TimePoint now = clock_.Now();
  if (last_step_at_ != TimePoint{}) {
    const double dt = ToSeconds(now - last_step_at_);
    step_interval_s_ = step_interval_s_ <= 0 ? dt : 0.8 * step_interval_s_ + 0.2 * dt;
  }
  last_step_at_ = now;
  if (send.empty()) return;
  if (!counters_.joined) return;  // nothing to compute an outer gradient against yet
  for (int p : send) {
    if (!Mine(p)) continue;  // another shard's agent sends it
    if (PushOutstandingLocked(p)) {
      // The last push of p is not applied yet (a slow round, a partition): its progress and
      // counters are still here and go out with p's next push, once the merge is in. Sending now
      // would send the outstanding push's work a second time.
      counters_.pushes_deferred += 1;
      continue;
    }
    sent_at_last_step_.push_back(p);
    if (staged_numel_[static_cast<size_t>(p)] == 0) {
      QueuePushLocked(p, step);
      continue;
    }
    ParkPushLocked(p, step);  // its staged values were provided, or come with Send
    if (auto it = provided_.find(p); it != provided_.end()) CompletePushLocked(p, it->second);
  }
  provided_.clear();
  cv_.notify_all();
}

double LearnerAgent::PollWaitLocked(TimePoint now) const {
  constexpr double kMin = 0.05, kMax = 1.0, kMargin = 0.01;
  if (flushing_ || step_interval_s_ <= 0 || last_step_at_ == TimePoint{}) return kMin;
  const double until_next_push = step_interval_s_ - ToSeconds(now - last_step_at_) - kMargin;
  return std::clamp(until_next_push, kMin, kMax);
}

bool LearnerAgent::PushOutstandingLocked(int p) const {
  if (!options_.keep_progress) return false;  // overwrite on receipt: nothing is kept to resend
  if (awaiting_.count(p) > 0 || pushing_.count(p) > 0 || pending_.count(p) > 0) return true;
  return std::any_of(ready_.begin(), ready_.end(), [p](const Ready& r) { return r.fragment == p; });
}

void LearnerAgent::QueuePushLocked(int p, int64_t step, bool final_sync) {
  const size_t pi = static_cast<size_t>(p);
  PushJob job;
  job.fragment = p;
  job.step = step;
  job.final_sync = final_sync;
  job.c_tokens = c_tokens_[pi];
  job.c_steps = c_steps_[pi];
  job.local.resize(static_cast<size_t>(plan_.fragments[pi].numel));
  exchange::GatherFragment(plan_.fragments[pi], tensors_, job.local);
  if (options_.keep_progress) sent_[p] = {job.local, job.c_tokens, job.c_steps};
  // A newer snapshot of the same fragment supersedes one still waiting to be sent.
  std::erase_if(push_queue_, [p](const PushJob& j) { return j.fragment == p; });
  pending_.erase(p);
  push_queue_.push_back(std::move(job));
}

int LearnerAgent::ApplyReady(int64_t next_step) {
  receipts_.clear();
  std::vector<Ready> due;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = ready_.begin(); it != ready_.end();) {
      if (it->due_step <= next_step) {
        due.push_back(std::move(*it));
        it = ready_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Ready& r : due) ApplyOne(r);
  if (!due.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.fragments_applied += static_cast<int64_t>(due.size());
  }
  return static_cast<int>(due.size());
}

StepResult LearnerAgent::AfterStep(int64_t step, int64_t tokens) { return AfterStepRule(*this, step, tokens); }

bool LearnerAgent::BarrierBefore(int64_t next_step) const {
  return options_.schedule.synchronous && next_step % options_.schedule.H == 0;
}

StepResult LearnerAgent::ApplyDue(int64_t next_step) {
  StepResult r;
  if (!BarrierBefore(next_step)) {
    r.applied = ApplyReady(next_step);
    return r;
  }
  const TimePoint t0 = clock_.Now();
  r.applied = WaitForAllFragments(next_step, options_.barrier_timeout_s);
  r.barrier_wait_s = ToSeconds(clock_.Now() - t0);
  return r;
}

int LearnerAgent::WaitForAllFragments(int64_t next_step, double timeout_s) {
  const TimePoint deadline = clock_.Now() + FromSeconds(timeout_s);
  {
    std::unique_lock<std::mutex> lock(mu_);
    clock_.WaitUntil(cv_, lock, deadline,
                     [&] { return stop_ || finish_ || (push_queue_.empty() && awaiting_.empty()); });
  }
  return ApplyReady(next_step);
}

void LearnerAgent::Backoff(double& delay_s) {
  std::unique_lock<std::mutex> lock(mu_);
  clock_.WaitFor(cv_, lock, FromSeconds(delay_s), [&] { return stop_; });
  delay_s = std::min(options_.backoff_max_s, delay_s * 2);
}

syncer::JoinRequestData LearnerAgent::JoinRequest() {
  syncer::JoinRequestData req;
  req.protocol_version = syncer::kProtocolVersion;
  req.run_id = options_.run_id;
  req.model_signature = diloco::ModelSignature(plan_.tensors);
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.learner_id = counters_.learner_id;
    req.rejoin = options_.rejoin || counters_.joins > 0;
  }
  req.host = options_.host;
  req.shard = options_.shard;
  // What it holds: at the first join the values it starts from; later its copies Φ_p (so that a
  // syncer that still has, or restored, the same copies resumes with deltas).
  if (!initial_.empty()) {
    for (size_t p = 0; p < initial_.size(); ++p) {  // a copy loaded from the state folder, else the start values
      req.fragment_checksums.push_back(exchange::ValuesChecksum(loaded_[p] ? public_[p] : initial_[p]));
      req.fragment_versions.push_back(loaded_[p] ? have_[p] : -1);
    }
  } else if (options_.exchange_fragments) {
    for (size_t p = 0; p < public_.size(); ++p) {
      req.fragment_checksums.push_back(have_[p] >= 0 ? exchange::ValuesChecksum(public_[p]) : 0);
      req.fragment_versions.push_back(have_[p]);
    }
  }
  return req;
}

Status LearnerAgent::JoinAndCatchUp() {
  const syncer::JoinRequestData req = JoinRequest();
  ATOLL_ASSIGN_OR_RETURN(auto reply, api_.Join(req));
  if (!reply.rebuild_wanted.empty()) {
    // A rebuilding syncer wants copies this learner holds: offer them, then join again, so that
    // the reply says which copies the syncer now holds too (no pull for those).
    OfferCopies(reply);
    ATOLL_ASSIGN_OR_RETURN(reply, api_.Join(req));
  }
  ATOLL_RETURN_IF_ERROR(CheckPlan(reply));
  if (reply.shard.count != options_.shard.count || reply.shard.index != options_.shard.index) {
    return FailedPreconditionError("syncer shard mismatch: the syncer at this address is shard " +
                                   reply.shard.ToString() + ", this learner took it for shard " +
                                   options_.shard.ToString() +
                                   " (give --syncer every shard's address, in shard order)");
  }
  options_.uplink = reply.uplink;  // the syncer's run settings win (encoding, block size, compression)
  bool rejoin_in_process;
  {
    std::lock_guard<std::mutex> lock(mu_);
    rejoin_in_process = counters_.joins > 0;
    counters_.learner_id = reply.learner_id;
    counters_.push_session = reply.push_session;
    counters_.joins += 1;
    if (incarnation_ != 0 && reply.incarnation != incarnation_) ForgetUncommittedPushesLocked(reply);
    incarnation_ = reply.incarnation;
  }
  AdoptHeld(reply);
  ATOLL_RETURN_IF_ERROR(CatchUp(reply.versions, rejoin_in_process));
  std::lock_guard<std::mutex> lock(mu_);
  counters_.joined = true;
  need_rejoin_ = false;
  cv_.notify_all();
  return Status::Ok();
}

Status LearnerAgent::CheckPlan(const syncer::JoinReplyData& reply) const {
  if (static_cast<int>(reply.versions.size()) != plan_.num_fragments() ||
      reply.fragment_numel.size() != reply.versions.size()) {
    return FailedPreconditionError("plan mismatch: syncer has " + std::to_string(reply.versions.size()) +
                                   " fragments, this learner " + std::to_string(plan_.num_fragments()));
  }
  for (int p = 0; p < plan_.num_fragments(); ++p) {
    if (reply.fragment_numel[static_cast<size_t>(p)] != plan_.fragments[static_cast<size_t>(p)].numel) {
      return FailedPreconditionError(
          "plan mismatch at fragment " + std::to_string(p) + ": syncer " +
          std::to_string(reply.fragment_numel[static_cast<size_t>(p)]) + " values, learner " +
          std::to_string(plan_.fragments[static_cast<size_t>(p)].numel) + " (same --fragments and --plan on both?)");
    }
  }
  if (!options_.check_schedule) return Status::Ok();
  const diloco::Schedule& s = options_.schedule;
  const bool synchronous = reply.mode == diloco::Mode::kDiloco;
  if (reply.H != s.H || synchronous != s.synchronous || (!synchronous && reply.tau != s.tau)) {
    return FailedPreconditionError("schedule mismatch: the syncer runs " + std::string(diloco::ModeName(reply.mode)) +
                                   " with H=" + std::to_string(reply.H) + " tau=" + std::to_string(reply.tau) +
                                   ", this learner " + (s.synchronous ? "diloco" : "decoupled") +
                                   " with H=" + std::to_string(s.H) + " tau=" + std::to_string(s.tau));
  }
  return Status::Ok();
}

Status LearnerAgent::CatchUp(const std::vector<int64_t>& versions, bool rejoin_in_process) {
  // Fragment-level catch-up: only fragments whose version differs from what we hold.
  for (int p = 0; options_.exchange_fragments && p < plan_.num_fragments(); ++p) {
    if (!Mine(p) || have_[static_cast<size_t>(p)] == versions[static_cast<size_t>(p)]) continue;
    // A rejoin within this process (after a partition or a syncer restart) keeps the local
    // progress: only Φ_p is refreshed, and the next push of p carries that progress — unless the
    // version holds a push we await, which is then applied as its merge (its steps are not sent
    // twice). A fresh process has no progress to keep and takes Θ_p.
    PullPurpose purpose = PullPurpose::kCatchUp;
    Awaited awaited{0, 0, 0};
    if (rejoin_in_process && options_.keep_progress) {
      purpose = PullPurpose::kRefresh;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = awaiting_.find(p);
      if (it != awaiting_.end() && it->second.merged_version <= versions[static_cast<size_t>(p)]) {
        purpose = PullPurpose::kAwaited;
        awaited = it->second;
      }
    }
    Status st = PullOne(p, 0.0, purpose, awaited);
    if (!st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu_);
    counters_.catchup_fragments += 1;
  }
  return Status::Ok();
}

void LearnerAgent::ForgetUncommittedPushesLocked(const syncer::JoinReplyData& reply) {
  // The syncer restarted from its last commit: a push whose round it had not committed is gone.
  // The learner still holds that work (its parameters and counters move on only when a merge of
  // its push is applied), so forgetting the wait makes the next push of the fragment carry it.
  // Committed or not is what the syncer says it merged of this learner — not the fragment's
  // version, which other learners' rounds may have moved past the promised one since the restart.
  const bool said = reply.merged_versions.size() == reply.versions.size();
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    const size_t p = static_cast<size_t>(it->first);
    const Awaited& a = it->second;
    bool kept;
    if (a.incarnation != 0 && a.incarnation == reply.incarnation) {
      kept = true;  // accepted by the restarted syncer itself: in its open round
    } else if (said) {
      kept = reply.merged_versions[p] >= a.merged_version;
    } else {
      kept = p >= reply.versions.size() || reply.versions[p] >= a.merged_version;
    }
    if (!kept) {
      counters_.pushes_repeated += 1;
      it = awaiting_.erase(it);
    } else {
      ++it;
    }
  }
  cv_.notify_all();
}

StatusOr<syncer::PullPayload> LearnerAgent::FetchFragment(int p, double wait_s, int64_t want) {
  const size_t pi = static_cast<size_t>(p);
  int learner_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    learner_id = counters_.learner_id;
  }
  auto r = api_.Pull(learner_id, p, have_[pi], wait_s, want);
  if (!r.ok() && r.status().code() == StatusCode::kFailedPrecondition) {
    have_[pi] = -1;  // we hold a version the syncer does not know: start over with a full copy
    r = api_.Pull(learner_id, p, -1, 0.0, -1);
  }
  if (!r.ok()) return r.status();
  std::lock_guard<std::mutex> lock(mu_);
  if (r->incarnation != incarnation_) {
    // Another syncer process answered (it restarted): its versions are not the ones this
    // learner's pushes were promised. Rejoin first (which sorts out which pushes it kept).
    need_rejoin_ = true;
    return UnavailableError("pull answered by a new syncer incarnation: rejoining first");
  }
  counters_.pulls += 1;
  counters_.payload_bytes_down += static_cast<int64_t>(r->bytes.size());
  if (!r->not_modified) (r->is_delta ? counters_.pulls_delta : counters_.pulls_full) += 1;
  return r;
}

Status LearnerAgent::PullOne(int p, double wait_s, PullPurpose purpose, Awaited awaited, PushJob* in_flight) {
  const size_t pi = static_cast<size_t>(p);
  // Waiting for the merge of its own push: versions before it are not worth a download.
  auto r = FetchFragment(p, wait_s, purpose == PullPurpose::kAwaited ? awaited.merged_version : -1);
  if (!r.ok()) return r.status();
  if (r->not_modified) return Status::Ok();
  std::vector<float>& phi = public_[pi];
  const size_t numel = static_cast<size_t>(plan_.fragments[pi].numel);
  // A catch-up or the merge of its own push is written into the parameters; any other newer copy
  // (a refresh, a version on the way to the awaited one) moves them by what it changed, a rebase,
  // for which the previous copy is kept (the buffer ApplyPulled replaces, not a copy).
  const bool applied =
      purpose == PullPurpose::kCatchUp || (purpose == PullPurpose::kAwaited && r->version >= awaited.merged_version);
  const bool rebase = !applied && options_.keep_progress && phi.size() == numel;
  std::vector<float> previous;
  if (Status st = syncer::ApplyPulled(*r, have_[pi], numel, phi, lattice_[pi], rebase ? &previous : nullptr);
      !st.ok()) {
    have_[pi] = -1;  // whatever went wrong, the next pull fetches the fragment in full
    std::lock_guard<std::mutex> lock(mu_);
    counters_.checksum_mismatches += 1;
    return st;
  }
  have_[pi] = r->version;
  SaveState(p);
  std::lock_guard<std::mutex> lock(mu_);
  counters_.version_held = std::max(counters_.version_held, r->version);
  if (rebase) PostRebaseLocked(p, r->version, phi, std::move(previous), in_flight);
  if (applied) {
    std::erase_if(ready_, [p](const Ready& x) { return x.fragment == p; });
    const bool own = purpose == PullPurpose::kAwaited;
    ready_.push_back({p, r->version, own ? awaited.due_step : 0, own, phi, {}});
    awaiting_.erase(p);
  }
  cv_.notify_all();
  return Status::Ok();
}

Status LearnerAgent::PushOne(PushJob& job) {
  const size_t pi = static_cast<size_t>(job.fragment);
  syncer::PushHeaderData h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.learner_id = counters_.learner_id;
    h.push_session = counters_.push_session;
    h.push_seq = ++push_seq_;  // every attempt a new number: a push resent after a refusal is not a replay
  }
  h.fragment = job.fragment;
  h.base_version = have_[pi];
  h.c_tokens = job.c_tokens;
  h.c_steps = job.c_steps;
  h.encoding = options_.uplink.encoding;
  h.block_size = options_.uplink.block_size;
  h.compression = options_.uplink.compression;
  h.num_values = static_cast<int64_t>(job.local.size());
  h.local_step = job.step;
  h.final_sync = job.final_sync;
  std::vector<std::byte> payload;
  ATOLL_RETURN_IF_ERROR(exchange::EncodeOuterGradient(options_.uplink, public_[pi], job.local, payload));
  auto r = api_.Push(h, payload);
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.ok()) {
    counters_.pushes_failed += 1;
    return r.status();
  }
  counters_.pushes += 1;
  counters_.payload_bytes_up += static_cast<int64_t>(payload.size());
  if (r->incarnation != 0 && r->incarnation != incarnation_) need_rejoin_ = true;  // the syncer restarted
  if (counters_.first_contribution_s < 0) counters_.first_contribution_s = ToSeconds(clock_.Now() - started_);
  // diloco: applied at the barrier right after the send; decoupled: τ steps later.
  const int64_t due = options_.schedule.DueStep(job.step);
  // A push while an earlier one of the same fragment is still awaited keeps the earlier target:
  // if rounds take longer than H steps, each merge is still applied when it arrives (waiting for
  // the newest push's version every time would never apply anything).
  auto [it, fresh] = awaiting_.try_emplace(job.fragment, Awaited{due, r->merged_version, r->incarnation});
  if (!fresh) it->second.merged_version = std::min(it->second.merged_version, r->merged_version);
  return Status::Ok();
}

void LearnerAgent::ExchangeLoop() {
  double delay = options_.backoff_initial_s;
  for (;;) {
    bool rejoin;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      rejoin = need_rejoin_;
    }
    if (rejoin) {
      Status st = JoinAndCatchUp();
      if (!st.ok()) {
        if (IsPermanent(st)) {
          std::lock_guard<std::mutex> lock(mu_);
          fatal_ = st;
          stop_ = true;
          cv_.notify_all();
          return;
        }
        Backoff(delay);
        continue;
      }
      delay = options_.backoff_initial_s;
    }
    ExchangeWork work;
    if (!TakeExchangeWork(work)) return;
    Status st;
    if (work.job) {
      st = PushWithRefresh(*work.job);
      std::lock_guard<std::mutex> lock(mu_);
      --pushes_in_flight_;
      pushing_.erase(work.job->fragment);
      cv_.notify_all();
    } else {
      // Long-poll the first awaited fragment (server-side wait, until shortly before the next
      // push is due), the rest without waiting.
      double wait = work.poll_wait;
      for (const auto& [p, a] : work.awaiting) {
        st = PullOne(p, wait, PullPurpose::kAwaited, a);
        wait = 0.0;
        if (!st.ok()) break;
      }
    }
    if (st.ok()) continue;
    NoteExchangeError(st);
    // RESOURCE_EXHAUSTED: the syncer's limits refused the call (calls in flight, push budget): retried
    // after the backoff, not at once.
    if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded ||
        st.code() == StatusCode::kResourceExhausted) {
      Backoff(delay);
    }
  }
}

bool LearnerAgent::TakeExchangeWork(ExchangeWork& work) {
  std::unique_lock<std::mutex> lock(mu_);
  // Nothing awaited: sleep until a push is queued (QueuePushLocked notifies) or a second has
  // passed. Something awaited: no sleep here — the long poll is where this thread waits.
  if (awaiting_.empty()) {
    clock_.WaitFor(cv_, lock, std::chrono::seconds(1), [&] { return stop_ || need_rejoin_ || !push_queue_.empty(); });
  }
  if (stop_) return false;
  work.poll_wait = PollWaitLocked(clock_.Now());
  if (!push_queue_.empty()) {
    work.job = std::move(push_queue_.front());
    push_queue_.pop_front();
    ++pushes_in_flight_;
    pushing_.insert(work.job->fragment);
  }
  work.awaiting = awaiting_;
  return true;
}

Status LearnerAgent::PushWithRefresh(PushJob& job) {
  Status st = PushOne(job);
  if (st.code() != StatusCode::kAborted) return st;
  // The syncer does not hold the copy our outer gradient was computed against (it restarted):
  // fetch the fragment in full, then push the same local snapshot against it, so the local
  // progress is not thrown away.
  // The snapshot moves onto the new copy with the parameters (a rebase), so what is pushed is
  // still this learner's own progress.
  have_[static_cast<size_t>(job.fragment)] = -1;
  st = PullOne(job.fragment, 0.0, PullPurpose::kRefresh, {0, 0, 0}, &job);
  return st.ok() ? PushOne(job) : st;
}

void LearnerAgent::NoteExchangeError(const Status& st) {
  std::lock_guard<std::mutex> lock(mu_);
  if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kDataLoss) {
    counters_.rejected += 1;  // this contribution is lost; training goes on
  } else if (st.code() == StatusCode::kNotFound || IsPermanent(st) || st.code() == StatusCode::kUnavailable ||
             st.code() == StatusCode::kDeadlineExceeded) {
    need_rejoin_ = true;  // syncer down or restarted: rejoin with backoff, keep training
    counters_.joined = counters_.joined && st.code() != StatusCode::kNotFound;
  }
}

void LearnerAgent::HeartbeatLoop() {
  for (;;) {
    Progress p;
    int id;
    bool joined;
    {
      std::unique_lock<std::mutex> lock(mu_);
      clock_.WaitFor(cv_, lock, FromSeconds(options_.heartbeat_s), [&] { return stop_; });
      if (stop_) return;
      p = progress_;
      id = counters_.learner_id;
      joined = counters_.joined && !need_rejoin_;
    }
    if (!joined) continue;
    syncer::LearnerProgress rec = p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      rec.version_held = counters_.version_held;
    }
    auto r = api_.Heartbeat(id, rec);
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kNotFound) {
        need_rejoin_ = true;
        cv_.notify_all();  // the exchange thread may be sleeping for a push
      }
      continue;
    }
    if (r->finish) {
      finish_ = true;
      cv_.notify_all();
    }
    if (r->incarnation != incarnation_) {  // the syncer restarted
      need_rejoin_ = true;
      cv_.notify_all();
    }
  }
}

}  // namespace atl::learner
