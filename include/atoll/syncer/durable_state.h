// Durable syncer state: what lets a SIGKILLed syncer restart without losing a committed outer
// step.
//
// Committed. A round is committed when its new global value Θ_p, Nesterov buffer, version and
// round number are on disk. The syncer's event loop persists a fragment *before* the new version
// becomes visible to any learner (pulls and heartbeats are served after the persist), so every
// version a learner ever saw survives a crash; a round whose merge was in memory but not yet on
// disk was never committed and never seen, and its contributions are simply lost (the learners
// contribute again at their next sync of that fragment).
//
// Layout of the state folder (each file written atomically: temp, fsync, rename):
//   meta.json            run id, model signature, plan fingerprint, P (self-checksummed)
//   fragment-NNN.bin     magic "ATOLFRG2", version, round, numel, what follows, the sweep's
//                        share, the body's XXH3, the header's own XXH3; then Θ_p, the Nesterov
//                        buffer (when kept), the public copy Φ_p and its lattice exponents
//                        (fp32 little-endian; docs/decisions/014). Only a shard's own fragments.
//   learners.json        the learner table (accounting; rewritten with every committed round)
// The public copy is committed with Θ_p, so learners that hold its version resume with deltas
// after a restart; the history of deltas is not, so a learner further behind fetches in full once.
// Thread-safety: called from the syncer's loop thread only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {

class DurableState {
 public:
  explicit DurableState(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  // True when the folder holds a saved state (meta.json exists).
  bool Exists() const;
  // Writes meta.json and every fragment (at start, for a fresh run).
  Status SaveAll(const SyncerCore& core);
  // Writes one fragment (after each committed round). A write that fails for a transient reason
  // (Unavailable: out of file descriptors, EMFILE/ENFILE) is retried up to kCommitAttempts times
  // with backoff (10 ms doubling) before the error is returned.
  static constexpr int kCommitAttempts = 6;
  Status SaveFragment(const SyncerCore& core, int fragment);
  Status SaveLearners(const SyncerCore& core);
  // Loads a saved state into `core` (which must have been created with the same plan).
  // FailedPrecondition when it belongs to another run/model/plan; DataLoss naming the file for a
  // truncated or corrupted file. On error `core` is unchanged.
  // Restored learners count as live from `now` (they get the learner timeout to reappear).
  Status Restore(SyncerCore& core, TimePoint now) const;

 private:
  std::string FragmentPath(int p) const;
  Status WriteFragment(const SyncerCore& core, int p);
  static void ReadLearnerRows(const nlohmann::json& lj, std::map<int, LearnerRecord>& table, int64_t& rounds_closed);
  std::string dir_;
};

// A fingerprint of the plan: fragment count and every slice (tensor, offset, count).
uint64_t PlanFingerprint(const diloco::FragmentPlan& plan);

}  // namespace atl::syncer
