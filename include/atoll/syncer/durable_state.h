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
// Layout of the state folder (each file written atomically: temp, fsync, rename; the initial
// state as a whole: written into a temp folder beside it and renamed into place):
//   meta.json            run id, model signature, plan fingerprint, P (self-checksummed)
//   fragment-NNN.bin     magic "ATOLFRG2", version, round (= version), numel, what follows, the sweep's
//                        share, the body's XXH3, the header's own XXH3; then Θ_p, the Nesterov
//                        buffer (when kept), the public copy Φ_p and its lattice exponents
//                        (fp32 little-endian; docs/decisions/014). Only a shard's own fragments.
//                        Files of the earlier format "ATOLFRG1" (no header checksum, no public
//                        copy) are still read.
//   learners.json        the learner table (accounting; rewritten with every committed round).
//                        Not essential: a damaged one is ignored with a warning (the table is
//                        rebuilt as learners rejoin; rounds_closed is recounted from the fragments)
//   eval-start.json      the initial model's eval loss (self-checksummed); a damaged one is
//                        ignored with a warning and the initial model evaluated again
// The public copy is committed with Θ_p, so learners that hold its version resume with deltas
// after a restart; the history of deltas is not, so a learner further behind fetches in full once.
// A folder that holds any of these files but no meta.json is refused, never overwritten (Inspect);
// temp files a killed syncer left behind are removed at start (RemoveStaleTempFiles).
// Thread-safety: called from the syncer's loop thread only.
#pragma once

#include <map>
#include <optional>
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
  // What the folder holds, before a syncer writes anything into it: kEmpty when it is absent or
  // holds nothing (a fresh run writes its initial state there with SaveAll), kSaved when it holds
  // meta.json (Restore then verifies the rest). FailedPrecondition naming what is there when it
  // holds anything else — fragment files or a learner table without meta.json (damaged or
  // incomplete: starting over would overwrite committed rounds), or files that are not a syncer
  // state at all. Run RemoveStaleTempFiles first: temp files count as contents.
  enum class Contents { kEmpty, kSaved };
  StatusOr<Contents> Inspect() const;
  // Removes the temp files of writes a killed syncer left in the folder and the temp folders of
  // an interrupted SaveAll beside it; returns their names (for the log).
  std::vector<std::string> RemoveStaleTempFiles() const;
  // Writes the initial state: every owned fragment, the learner table and meta.json, into a temp
  // folder renamed to dir() as a whole (a kill leaves no partial state; where the rename is not
  // possible, a mount point, in place with meta.json last). FailedPrecondition when dir() holds
  // anything.
  Status SaveAll(const SyncerCore& core);
  // The name of fragment p's file in the folder ("fragment-NNN.bin").
  static std::string FragmentFileName(int p);
  // Writes one fragment (after each committed round). A write that fails for a transient reason
  // (Unavailable: out of file descriptors, EMFILE/ENFILE) is retried up to kCommitAttempts times
  // with backoff (10 ms doubling) before the error is returned.
  static constexpr int kCommitAttempts = 6;
  Status SaveFragment(const SyncerCore& core, int fragment);
  Status SaveLearners(const SyncerCore& core);
  // Loads a saved state into `core` (which must have been created with the same plan).
  // FailedPrecondition when it belongs to another run/model/plan; DataLoss naming the file for a
  // missing, truncated or corrupted fragment file (its header is checksummed too: a flipped bit
  // in a version is refused, never served), a fragment file beyond the plan, or a bad meta.json.
  // A damaged learners.json is not an error: it is ignored with a warning. On error `core` is
  // unchanged. Restored learners count as live from `now` (they get the learner timeout).
  Status Restore(SyncerCore& core, TimePoint now);
  // The initial model's eval loss saved by SaveStartEval; nullopt when there is none or it is
  // damaged (then with a warning: the caller evaluates again).
  std::optional<double> SavedStartEval();
  Status SaveStartEval(double loss);
  // What Restore and SavedStartEval ignored or rebuilt, and what was lost with it: one line each,
  // for the log.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  std::string FragmentPath(int p) const;
  Status WriteFragment(const SyncerCore& core, int p);
  Status WriteAllFiles(const SyncerCore& core);
  Status CheckNoStrayFragments(int num_fragments) const;
  struct LearnerTable {
    std::map<int, LearnerRecord> rows;
    int64_t rounds_closed = 0;
  };
  // The learner table from learners.json; a damaged file is a warning and an empty table, with
  // rounds_closed recounted as the fragments' rounds (`fragment_rounds`).
  LearnerTable ReadLearnerTable(int64_t fragment_rounds);
  // Throws nlohmann::json exceptions for fields of the wrong type.
  static LearnerTable ReadLearnerRows(const nlohmann::json& lj);
  std::string dir_;
  std::vector<std::string> warnings_;
};

// A fingerprint of the plan: fragment count and every slice (tensor, offset, count).
uint64_t PlanFingerprint(const diloco::FragmentPlan& plan);

}  // namespace atl::syncer
