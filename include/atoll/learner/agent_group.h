// AgentGroup: a learner's LearnerAgents, one per syncer shard (docs/decisions/011).
//
// With a sharded syncer each shard owns the fragments p ≡ i (mod S) and keeps its own learner
// table, rounds, incarnation and durable state. The learner runs one LearnerAgent per shard, each
// exchanging only its shard's fragments over its own connection: a shard that is down (or
// restarting) stalls only its agent's fragments, while the others keep pushing and pulling. The
// group forwards the training loop's calls to every agent and adds up their counters. With one
// shard it holds one agent over every fragment: the unsharded learner, unchanged.
//
// Thread-safety: as LearnerAgent (the training thread calls everything but the counters).
#pragma once

#include <memory>
#include <vector>

#include "atoll/learner/learner_agent.h"

namespace atl::learner {

class AgentGroup {
 public:
  // `apis[i]` reaches shard i of apis.size() (in shard order); options.shard is set per agent.
  AgentGroup(const AgentOptions& options, const diloco::FragmentPlan& plan,
             const std::vector<std::span<float>>& tensors, const std::vector<syncer::SyncerApi*>& apis, Clock& clock);

  int shards() const { return static_cast<int>(agents_.size()); }
  LearnerAgent& agent(int shard) { return *agents_[static_cast<size_t>(shard)]; }

  // Starts every agent in shard order (each waits, bounded, for its shard's join); stops at the
  // first permanent refusal (wrong run, model, shard) and returns it. With more than one shard
  // the learner id must be given (≥ 0): no shard assigns it (InvalidArgument).
  Status Start();
  // The after-step rule (LearnerAgent::AfterStep) over every shard: every agent's sends first,
  // then every agent's due merges; waits and counts are summed.
  StepResult AfterStep(int64_t step, int64_t tokens);
  void OnStep(int64_t step, int64_t tokens);
  // Every agent's due merges (LearnerAgent::ApplyDue), summed.
  StepResult ApplyDue(int64_t next_step);
  int ApplyReady(int64_t next_step);
  int WaitForAllFragments(int64_t next_step, double timeout_s);
  int FlushAll(int64_t step, double timeout_s);
  void SetProgress(const Progress& p);
  // Leaves every shard; the first error.
  Status Leave();
  // A shard asked the run to finish (--finish-when-done, or the operator's Finish).
  bool finish_requested() const;
  Status fatal_error() const;
  // Summed over the shards; learner_id and version_held from any; joined when every shard
  // joined; the first contribution is the earliest.
  AgentCounters counters() const;

 private:
  int learner_id_ = -1;
  std::vector<std::unique_ptr<LearnerAgent>> agents_;
};

}  // namespace atl::learner
