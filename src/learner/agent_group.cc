#include "atoll/learner/agent_group.h"

#include <algorithm>

namespace atl::learner {

AgentGroup::AgentGroup(const AgentOptions& options, const diloco::FragmentPlan& plan,
                       const std::vector<std::span<float>>& tensors, const std::vector<syncer::SyncerApi*>& apis,
                       Clock& clock)
    : learner_id_(options.learner_id) {
  ATOLL_CHECK(!apis.empty());
  const int S = static_cast<int>(apis.size());
  for (int i = 0; i < S; ++i) {
    AgentOptions o = options;
    o.shard = {i, S};
    agents_.push_back(std::make_unique<LearnerAgent>(o, plan, tensors, *apis[static_cast<size_t>(i)], clock));
  }
}

Status AgentGroup::Start() {
  if (agents_.size() > 1 && learner_id_ < 0) {
    return InvalidArgumentError(
        "a learner of a sharded syncer needs its own id (not -1): every shard must know it by the same id");
  }
  for (auto& a : agents_) ATOLL_RETURN_IF_ERROR(a->Start());  // a permanent refusal ends the learner
  return Status::Ok();
}

StepResult AgentGroup::AfterStep(int64_t step, int64_t tokens) { return AfterStepRule(*this, step, tokens); }

StepResult AgentGroup::ApplyDue(int64_t next_step) {
  StepResult sum;
  for (auto& a : agents_) {
    const StepResult r = a->ApplyDue(next_step);
    sum.applied += r.applied;
    sum.barrier_wait_s += r.barrier_wait_s;
  }
  return sum;
}

void AgentGroup::OnStep(int64_t step, int64_t tokens) {
  for (auto& a : agents_) a->OnStep(step, tokens);
}

int AgentGroup::ApplyReady(int64_t next_step) {
  int applied = 0;
  for (auto& a : agents_) applied += a->ApplyReady(next_step);
  return applied;
}

int AgentGroup::WaitForAllFragments(int64_t next_step, double timeout_s) {
  int applied = 0;
  for (auto& a : agents_) applied += a->WaitForAllFragments(next_step, timeout_s);
  return applied;
}

int AgentGroup::FlushAll(int64_t step, double timeout_s) {
  // Every shard's final pushes go out together; each agent waits for its own.
  int flushed = 0;
  for (auto& a : agents_) flushed += a->FlushAll(step, timeout_s / static_cast<double>(agents_.size()));
  return flushed;
}

void AgentGroup::SetProgress(const Progress& p) {
  for (auto& a : agents_) a->SetProgress(p);
}

Status AgentGroup::Leave() {
  Status first = Status::Ok();
  for (auto& a : agents_) {
    Status st = a->Leave();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

bool AgentGroup::finish_requested() const {
  return std::any_of(agents_.begin(), agents_.end(), [](const auto& a) { return a->finish_requested(); });
}

Status AgentGroup::fatal_error() const {
  for (const auto& a : agents_) {
    if (Status st = a->fatal_error(); !st.ok()) return st;
  }
  return Status::Ok();
}

AgentCounters AgentGroup::counters() const {
  AgentCounters sum = agents_.front()->counters();
  for (size_t i = 1; i < agents_.size(); ++i) {
    const AgentCounters k = agents_[i]->counters();
    sum.pushes += k.pushes;
    sum.pushes_failed += k.pushes_failed;
    sum.pulls += k.pulls;
    sum.fragments_applied += k.fragments_applied;
    sum.pulls_delta += k.pulls_delta;
    sum.pulls_full += k.pulls_full;
    sum.payload_bytes_up += k.payload_bytes_up;
    sum.payload_bytes_down += k.payload_bytes_down;
    sum.joins += k.joins;
    sum.catchup_fragments += k.catchup_fragments;
    sum.rejected += k.rejected;
    sum.checksum_mismatches += k.checksum_mismatches;
    sum.pushes_repeated += k.pushes_repeated;
    sum.pushes_deferred += k.pushes_deferred;
    sum.rebases += k.rebases;
    sum.copies_offered += k.copies_offered;
    sum.copies_adopted += k.copies_adopted;
    if (k.first_contribution_s >= 0 &&
        (sum.first_contribution_s < 0 || k.first_contribution_s < sum.first_contribution_s)) {
      sum.first_contribution_s = k.first_contribution_s;
    }
    sum.joined = sum.joined && k.joined;
    if (sum.learner_id < 0) sum.learner_id = k.learner_id;
    sum.version_held = std::max(sum.version_held, k.version_held);
  }
  return sum;
}

}  // namespace atl::learner
