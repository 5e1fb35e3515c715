// LearnerAgent on the training thread's side of a fragment's round trip: how a merged fragment
// is written into the parameters (receipts), and the sends of fragments with staged slices that
// wait for the caller's values (AgentOptions::staged; include/atoll/learner/learner_agent.h).
#include <algorithm>

#include "atoll/exchange/fragment_exchange.h"
#include "atoll/learner/learner_agent.h"

namespace atl::learner {

namespace {

// x ← x + (to − from): a snapshot of a fragment moved with the copy its parameters descend from.
void Rebase(std::vector<float>& x, const std::vector<float>& to, const std::vector<float>& from) {
  if (x.size() != to.size()) return;
  for (size_t i = 0; i < x.size(); ++i) x[i] += to[i] - from[i];
}

}  // namespace

void LearnerAgent::ApplyOne(const Ready& r) {
  const size_t pi = static_cast<size_t>(r.fragment);
  auto sent = sent_.find(r.fragment);
  if (!r.from.empty()) {
    // A rebase: θ ← θ + (Φ_new − Φ_old), no mixing; the progress and its counters stay, and the
    // last snapshot sent moves with the parameters (a merge of it keeps θ − θ_sent).
    WriteReceipt(plan_.fragments[pi], r.values, &r.from, 0.0);
    receipts_.push_back({r.fragment, true});
    if (sent != sent_.end()) Rebase(sent->second.local, r.values, r.from);
    std::lock_guard<std::mutex> lock(mu_);
    counters_.rebases += 1;
    return;
  }
  const bool keep = r.own_push && sent != sent_.end() && sent->second.local.size() == r.values.size();
  WriteReceipt(plan_.fragments[pi], r.values, keep ? &sent->second.local : nullptr, options_.alpha);
  receipts_.push_back({r.fragment, keep});
  if (!keep) {
    c_steps_[pi] = 0;
    c_tokens_[pi] = 0;
    sent_.erase(r.fragment);
    return;
  }
  c_steps_[pi] = std::max<int64_t>(0, c_steps_[pi] - sent->second.c_steps);
  c_tokens_[pi] = std::max<int64_t>(0, c_tokens_[pi] - sent->second.c_tokens);
  sent_.erase(sent);
}

void LearnerAgent::WriteReceipt(const diloco::Fragment& f, std::span<const float> merged,
                                const std::vector<float>* at_send, double alpha) {
  ATOLL_CHECK(static_cast<int64_t>(merged.size()) == f.numel);
  ATOLL_CHECK(alpha >= 0.0 && alpha < 1.0);
  const float a = static_cast<float>(alpha), b = static_cast<float>(1.0 - alpha);
  size_t pos = 0;
  for (const auto& s : f.slices) {
    std::span<float> dst =
        tensors_[static_cast<size_t>(s.tensor)].subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.count));
    const float* m = merged.data() + pos;
    const float* sent = at_send != nullptr ? at_send->data() + pos : nullptr;
    pos += dst.size();
    if (Staged(s.tensor)) {
      // What the caller does to its live values: add Δ = (1−α)(Θ − θ_sent), or mix Θ in by α.
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = sent != nullptr ? b * (m[i] - sent[i]) : m[i];
      continue;
    }
    // Keep the progress made since the send: Θ_p + (θ_now − θ_sent), then the mix by α.
    for (size_t i = 0; i < dst.size(); ++i) {
      const float target = sent != nullptr ? m[i] + (dst[i] - sent[i]) : m[i];
      dst[i] = alpha == 0.0 ? target : a * dst[i] + b * target;
    }
  }
}

void LearnerAgent::PostRebaseLocked(int p, int64_t version, const std::vector<float>& values, std::vector<float> from,
                                    PushJob* in_flight) {
  ATOLL_CHECK(from.size() == values.size());
  // Snapshots of p taken before (queued, parked for their staged values, being pushed) descend
  // from `from` too. A parked one's staged positions hold the shift until Send adds the values.
  auto shift = [&](PushJob& job) {
    if (job.fragment == p) Rebase(job.local, values, from);
  };
  for (PushJob& job : push_queue_) shift(job);
  if (auto it = pending_.find(p); it != pending_.end()) shift(it->second);
  if (in_flight != nullptr) shift(*in_flight);
  // A copy of p still waiting for the training thread takes the newer values: a catch-up then
  // writes them, a merge keeps θ − θ_sent on them (θ and θ_sent both still descend from its
  // values), an earlier rebase moves from its own origin to them.
  for (Ready& r : ready_) {
    if (r.fragment != p) continue;
    r.version = version;
    r.values = values;
    return;
  }
  ready_.push_back({p, version, 0, false, values, std::move(from)});
}

void LearnerAgent::ParkPushLocked(int p, int64_t step) {
  const size_t pi = static_cast<size_t>(p);
  PushJob job;
  job.fragment = p;
  job.step = step;
  job.c_tokens = c_tokens_[pi];
  job.c_steps = c_steps_[pi];
  job.local.assign(static_cast<size_t>(plan_.fragments[pi].numel), 0.0f);
  size_t pos = 0;
  for (const auto& s : plan_.fragments[pi].slices) {  // the shared slices as they are now
    if (!Staged(s.tensor)) {
      auto src =
          tensors_[static_cast<size_t>(s.tensor)].subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.count));
      std::copy(src.begin(), src.end(), job.local.begin() + static_cast<ptrdiff_t>(pos));
    }
    pos += static_cast<size_t>(s.count);
  }
  std::erase_if(push_queue_, [p](const PushJob& j) { return j.fragment == p; });
  pending_[p] = std::move(job);
}

std::vector<int> LearnerAgent::PendingSends() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [p, job] : pending_) out.push_back(p);
  return out;
}

std::vector<int> LearnerAgent::DueAt(int64_t step) const {
  std::vector<int> due;
  std::lock_guard<std::mutex> lock(mu_);
  if (!counters_.joined) return due;
  for (int p : options_.schedule.FragmentsAt(step)) {
    if (Mine(p) && !PushOutstandingLocked(p)) due.push_back(p);
  }
  return due;
}

Status LearnerAgent::Send(int fragment, std::span<const float> staged_values, int64_t next_step) {
  const size_t pi = static_cast<size_t>(fragment);
  if (fragment < 0 || fragment >= plan_.num_fragments()) {
    return InvalidArgumentError("fragment " + std::to_string(fragment) + " does not exist");
  }
  if (static_cast<int64_t>(staged_values.size()) != staged_numel_[pi]) {
    return InvalidArgumentError("fragment " + std::to_string(fragment) + " has " + std::to_string(staged_numel_[pi]) +
                                " staged values, not " + std::to_string(staged_values.size()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.count(fragment) > 0) {
      CompletePushLocked(fragment, staged_values);
      cv_.notify_all();
      return Status::Ok();
    }
  }
  const std::vector<int> due = DueAt(next_step);
  if (staged_numel_[pi] == 0 || std::find(due.begin(), due.end(), fragment) == due.end()) {
    return InvalidArgumentError("fragment " + std::to_string(fragment) +
                                " is neither waiting for its staged values nor due at step " +
                                std::to_string(next_step));
  }
  provided_[fragment].assign(staged_values.begin(), staged_values.end());
  return Status::Ok();
}

void LearnerAgent::CompletePushLocked(int p, std::span<const float> staged_values) {
  const size_t pi = static_cast<size_t>(p);
  auto it = pending_.find(p);
  ATOLL_CHECK(it != pending_.end());
  PushJob job = std::move(it->second);
  pending_.erase(it);
  size_t pos = 0, from = 0;
  for (const auto& s : plan_.fragments[pi].slices) {
    const size_t n = static_cast<size_t>(s.count);
    if (Staged(s.tensor)) {  // added: the positions hold 0, or a rebase's shift posted since the park
      for (size_t i = 0; i < n; ++i) job.local[pos + i] += staged_values[from + i];
      from += n;
    }
    pos += n;
  }
  if (options_.keep_progress) sent_[p] = {job.local, job.c_tokens, job.c_steps};
  push_queue_.push_back(std::move(job));
}

void LearnerAgent::UnstageAll() {
  staged_.clear();
  std::fill(staged_numel_.begin(), staged_numel_.end(), 0);
}

}  // namespace atl::learner
