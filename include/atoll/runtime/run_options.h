// The options of each part of a run, from its RunConfig: the trainer, the fragment plan, the
// syncer, its gRPC server's limits and a learner's agent. What the processes, `atoll simulate` and
// `atoll export` build from the same run file, so that they agree.
// Thread-safety: pure functions (MakeTrainerOptions reads the data folder's manifest).
#pragma once

#include <vector>

#include "atoll/diloco/fragment_plan.h"
#include "atoll/learner/learner_agent.h"
#include "atoll/model/trainer.h"
#include "atoll/runtime/run_config.h"
#include "atoll/syncer/syncer_core.h"
#include "atoll/transport/grpc_server.h"

namespace atl::runtime {

// The TrainerOptions a learner (or the syncer's evaluator) of this run uses. Needs the prepared
// data folder for the vocabulary size.
StatusOr<model::TrainerOptions> MakeTrainerOptions(const RunConfig& config, int learner_id);
// The fragment plan of this run over the model's tensors (what the syncer and every learner
// build, and `atoll export` rebuilds). InvalidArgument when the tensors cannot be cut into P fragments.
StatusOr<diloco::FragmentPlan> MakePlan(const RunConfig& config, const std::vector<diloco::TensorSpec>& tensors);
// The syncer's options for this run (mode, quorum, grace, merge, outer optimizer, codecs).
syncer::SyncerOptions MakeSyncerOptions(const RunConfig& config);
// The gRPC server's limits of a run config's [limits] (docs/security.md).
transport::ServerLimits MakeServerLimits(const RunConfig& config);
// Learner `learner_id`'s agent options for this run (schedule, uplink codec, receipt rule); the
// caller adds where it runs (host, rejoin, state folder).
learner::AgentOptions MakeAgentOptions(const RunConfig& config, int learner_id);

}  // namespace atl::runtime
