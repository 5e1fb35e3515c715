// `atoll export` (export.h): durable syncer state → safetensors.
#include "atoll/runtime/export.h"

#include <filesystem>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/safetensors.h"
#include "atoll/runtime/processes.h"
#include "atoll/syncer/durable_state.h"

namespace atl::runtime {
namespace {

namespace fs = std::filesystem;

// Fills in what was left out: the config (a run folder means its config.json; with only --state,
// the config.json beside the state folder, which every syncer writes into its run folder), the
// state folder (<run folder>/state) and --out (<run folder>/global.safetensors).
Status ResolvePaths(ExportOptions& o) {
  if (o.config.empty() && o.state.empty()) {
    return InvalidArgumentError("give --state (the syncer's state folder) or --config (the run folder or its config.json)");
  }
  std::error_code ec;
  if (o.config.empty()) {
    const fs::path parent = fs::path(o.state).lexically_normal().parent_path();
    o.config = ((parent.empty() ? fs::path(".") : parent) / "config.json").string();
    if (!FileExists(o.config)) {
      return NotFoundError("no run config beside the state folder (" + o.config +
                           "); pass --config with the run's config.json or run file");
    }
  }
  if (fs::is_directory(o.config, ec)) o.config = (fs::path(o.config) / "config.json").string();
  if (!FileExists(o.config)) {
    return NotFoundError("no run config at " + o.config +
                         " (pass --config with the run folder or its config.json)");
  }
  fs::path run_folder = fs::path(o.config).parent_path();
  if (run_folder.empty()) run_folder = ".";
  if (o.state.empty()) o.state = (run_folder / "state").string();
  if (o.out.empty()) o.out = (run_folder / "global.safetensors").string();
  if (FileExists(o.out) && !o.force) {
    return AlreadyExistsError(o.out + " exists; pass --force to overwrite it (or --out elsewhere)");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ExportResult> ExportState(const ExportOptions& options) {
  ExportOptions o = options;
  ATOLL_RETURN_IF_ERROR(ResolvePaths(o));
  ATOLL_ASSIGN_OR_RETURN(RunConfig loaded, LoadRunConfig(o.config));
  const RunConfig c = Normalized(loaded);
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c).WithContext(o.config));
  if (!syncer::DurableState(o.state).Exists()) {
    return NotFoundError("no committed syncer state in " + o.state +
                         " (no meta.json); pass --state with the folder the syncer wrote "
                         "(default <run folder>/state)");
  }

  auto topts = MakeTrainerOptions(c, 0);
  if (!topts.ok()) return topts.status().WithContext("the data folder of the run (" + c.data + ")");
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<model::Trainer> model, model::Trainer::Create(*topts));
  ATOLL_ASSIGN_OR_RETURN(diloco::FragmentPlan plan, MakePlan(c, model->tensors()));
  ATOLL_ASSIGN_OR_RETURN(syncer::SyncerOptions sopts, MakeSyncerOptions(c));
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan.fragments) initial.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  ATOLL_ASSIGN_OR_RETURN(syncer::SyncerCore core,
                         syncer::SyncerCore::Create(sopts, plan, std::move(initial)));
  Status restored = syncer::DurableState(o.state).Restore(core, RealClock::Default().Now());
  if (restored.code() == StatusCode::kFailedPrecondition) {
    return FailedPreconditionError("the state in " + o.state + " is not the run of " + o.config +
                                   " (" + restored.message() + "): pass the config.json of the "
                                   "run folder the state came from");
  }
  ATOLL_RETURN_IF_ERROR(restored.WithContext("reading the state in " + o.state));

  std::vector<std::span<float>> params;
  for (int i = 0; i < static_cast<int>(model->tensors().size()); ++i) {
    params.push_back(model->Parameter(i));
  }
  for (int p = 0; p < plan.num_fragments(); ++p) {
    exchange::ScatterFragment(plan.fragments[static_cast<size_t>(p)], core.theta(p), params);
  }
  ExportResult r;
  r.out = o.out;
  r.state = o.state;
  r.run_id = c.run_id;
  r.versions = core.versions();
  // Each committed round advanced one fragment by one version (learners.json's count is only
  // rewritten every few seconds, so it may lag).
  for (int64_t v : r.versions) r.rounds += v;
  r.params = model->num_params();
  const std::vector<std::span<const float>> views(params.begin(), params.end());
  ATOLL_RETURN_IF_ERROR(model::WriteSafetensors(
      o.out, model->tensors(), views,
      {{"run_id", c.run_id},
       {"rounds", std::to_string(r.rounds)},
       {"versions", nlohmann::json(r.versions).dump()},
       {"exported_from", fs::absolute(o.state).string()}}));
  return r;
}

}  // namespace atl::runtime
