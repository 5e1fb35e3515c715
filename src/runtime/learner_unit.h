// Multi-rank learner units (`atoll learner --ranks R`, learner_unit.cc): the supervisor, the
// follower ranks, and what rank 0 (LearnerProcess) shares with them. Private to src/runtime.
#pragma once

#include "atoll/model/trainer.h"
#include "atoll/runtime/learner_process.h"
#include "atoll/runtime/run_options.h"
#include "atoll/runtime/rank_group.h"

namespace atl::runtime {

// A collective waits this long for a dead rank before it fails (and its rank exits).
inline constexpr double kRankTimeoutSeconds = 30.0;

// Starts and watches the R ranks; restarts the whole unit when one dies. Returns the exit code.
int RunLearnerUnit(const LearnerProcessOptions& options);
// Ranks 1..R-1.
int RunFollowerRank(const LearnerProcessOptions& options);
// Learner `id`'s trainer options for `rank` of `ranks`: the same batch per rank, its own slice of
// the data (shard id·R + rank of M·R).
StatusOr<model::TrainerOptions> RankTrainerOptions(const RunConfig& config, int id, int rank, int ranks);
// After ComputeGradients on every rank: averages the gradients and the loss over the ranks,
// applies AdamW. The result's tokens are the unit's (R × this rank's), its loss the unit's mean.
StatusOr<model::StepStats> AverageAndApply(RankGroup& group, model::Trainer& trainer, model::StepStats computed);
// At the end of training, each rank writes the XXH3 of its parameters to
// <out>/unit-<id>/rank-<rank>.checksum: the ranks of a unit hold the same bits (tests check it).
Status WriteRankChecksum(const std::string& out_dir, int id, int rank, const std::vector<std::span<float>>& params);

}  // namespace atl::runtime
