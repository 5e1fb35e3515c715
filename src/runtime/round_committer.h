// RoundCommitter: what the syncer does with each closed round, on the loop thread, before the new
// version becomes visible (docs/failure-semantics.md): the learner table and the fragment written
// to the durable state (a fragment that cannot be persisted aborts the process: a version that is
// not durable is never published), the round logged, and every `checkpoint_every` committed rounds
// a periodic model write offered, when it fits on the disk beside the space the next commits need.
// With replicated commits the standbys in sync hold the commit before it returns (Replicator).
// Private to src/runtime. Thread-safety: Commit on the loop thread only; StopCheckpoints from any
// thread.
#pragma once

#include <atomic>
#include <string>

#include "atoll/syncer/commit_headroom.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_core.h"
#include "checkpoint_writer.h"
#include "replicator.h"
#include "round_log.h"
#include "syncer_summary.h"

namespace atl::runtime {

class RoundCommitter {
 public:
  RoundCommitter(syncer::DurableState& durable, syncer::CommitHeadroom& headroom, RoundLog& log,
                 CheckpointWriter& checkpoints, const SyncerSummary& summary, const diloco::FragmentPlan& plan,
                 std::string out_dir, int checkpoint_every, Replicator* replicator = nullptr)
      : durable_(durable),
        headroom_(headroom),
        log_(log),
        checkpoints_(checkpoints),
        summary_(summary),
        plan_(plan),
        out_(std::move(out_dir)),
        checkpoint_every_(checkpoint_every),
        replicator_(replicator) {}

  void Commit(const syncer::SyncerCore& core, const syncer::RoundReport& r, TimePoint now);
  // No periodic model write from now on: the finish writes the model.
  void StopCheckpoints() { finishing_ = true; }

 private:
  // Whether the periodic model write fits on the disk (otherwise it is skipped with a warning; the
  // next comes N rounds later).
  bool CheckpointFits() const;

  syncer::DurableState& durable_;
  syncer::CommitHeadroom& headroom_;
  RoundLog& log_;
  CheckpointWriter& checkpoints_;
  const SyncerSummary& summary_;
  const diloco::FragmentPlan& plan_;
  const std::string out_;
  const int checkpoint_every_;
  Replicator* const replicator_;      // null: no standbys follow
  int commits_since_checkpoint_ = 0;  // loop thread only
  std::atomic<bool> finishing_{false};
};

}  // namespace atl::runtime
