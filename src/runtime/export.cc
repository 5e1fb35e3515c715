// `atoll export` (export.h): durable syncer state → safetensors.
#include "atoll/core/text.h"
#include "atoll/runtime/export.h"

#include <filesystem>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/model/model_spec.h"
#include "model_host.h"
#include "atoll/runtime/run_options.h"
#include "atoll/syncer/durable_state.h"

namespace atl::runtime {
namespace {

namespace fs = std::filesystem;

// Fills in what was left out: the config (a run folder means its config.json; with only --state,
// the config.json beside the state folder, which every syncer writes into its run folder), the
// state folder (<run folder>/state) and --out (<run folder>/global.safetensors).
Status ResolvePaths(ExportOptions& o) {
  if (o.config.empty() && o.state.empty()) {
    return InvalidArgumentError(
        "give --state (the syncer's state folder) or --config (the run folder or its config.json)");
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
    return NotFoundError("no run config at " + o.config + " (pass --config with the run folder or its config.json)");
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

// Splits --state: one folder, or the state folders of a sharded syncer's shards in shard order
// (comma-separated).
StatusOr<std::vector<std::string>> StateFolders(const std::string& state) {
  const std::vector<std::string> folders = SplitText(state, ',');
  for (const std::string& f : folders) {
    if (f.empty()) return InvalidArgumentError("--state '" + state + "' has an empty folder in its list");
  }
  if (static_cast<int>(folders.size()) > syncer::kMaxShards)
    return InvalidArgumentError("--state lists too many shards");
  return folders;
}

// Restores shard k's state (of `folders.size()` shards) into a core; FailedPrecondition when the
// state belongs to another run or another shard.
StatusOr<syncer::SyncerCore> RestoreShard(const RunConfig& c, const std::string& config_path,
                                          const diloco::FragmentPlan& plan, const std::string& folder,
                                          syncer::ShardSpec shard) {
  if (!syncer::DurableState(folder).Exists()) {
    return NotFoundError("no committed syncer state in " + folder +
                         " (no meta.json); pass --state with the folder the syncer wrote "
                         "(default <run folder>/state; a sharded run: every shard's, in shard order)");
  }
  syncer::SyncerOptions sopts = MakeSyncerOptions(c);
  sopts.shard = shard;
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan.fragments) initial.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  ATOLL_ASSIGN_OR_RETURN(syncer::SyncerCore core, syncer::SyncerCore::Create(sopts, plan, std::move(initial)));
  Status restored = syncer::DurableState(folder).Restore(core, RealClock::Default().Now());
  if (restored.code() == StatusCode::kFailedPrecondition) {
    return FailedPreconditionError("the state in " + folder + " is not the run of " + config_path +
                                   (shard.count > 1 ? " as shard " + shard.ToString() : std::string()) + " (" +
                                   restored.message() +
                                   "): pass the config.json of the run folder the state "
                                   "came from" +
                                   (shard.count > 1 ? ", and the shards' states in shard order" : ""));
  }
  ATOLL_RETURN_IF_ERROR(restored.WithContext("reading the state in " + folder));
  return core;
}

// The exported global model's eval loss (the run's own model only: a foreign spec has no
// forward pass here).
template <typename Owner>
Status EvaluateGlobal(const RunConfig& c, const ModelHost& model, const diloco::FragmentPlan& plan, const Owner& owner,
                      ExportResult& r) {
  model::Trainer* ev = model.evaluator();
  if (ev == nullptr) return FailedPreconditionError("cannot evaluate: " + model.no_evaluation());
  exchange::ScatterAll(
      plan, [&](int p) { return owner(p).theta(p); }, model::ParameterViews(*ev));
  ATOLL_ASSIGN_OR_RETURN(auto e, ev->Evaluate(c.eval_batches));
  r.eval_loss = e.loss;
  r.eval_perplexity = e.perplexity;
  return Status::Ok();
}

}  // namespace

StatusOr<ExportResult> ExportState(const ExportOptions& options) {
  ExportOptions o = options;
  std::vector<std::string> folders;
  if (!o.state.empty()) {
    ATOLL_ASSIGN_OR_RETURN(folders, StateFolders(o.state));
    o.state = folders.front();  // a sharded run: the config is beside the first shard's state
  }
  ATOLL_RETURN_IF_ERROR(ResolvePaths(o));
  if (folders.empty()) folders.push_back(o.state);
  ATOLL_ASSIGN_OR_RETURN(RunConfig loaded, LoadRunConfig(o.config));
  const RunConfig c = Normalized(loaded);
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c).WithContext(o.config));
  if (folders.size() == 1 && !syncer::DurableState(o.state).Exists()) {
    return NotFoundError("no committed syncer state in " + o.state +
                         " (no meta.json); pass --state with the folder the syncer wrote "
                         "(default <run folder>/state)");
  }

  auto host = ModelHost::Open(c, /*evaluate=*/false);
  if (!host.ok())
    return host.status().WithContext(c.spec.empty() ? "the data folder of the run (" + c.data + ")"
                                                    : "the run's model spec");
  const ModelHost& model = **host;
  ATOLL_ASSIGN_OR_RETURN(diloco::FragmentPlan plan, MakePlan(c, model.tensors()));
  const int S = static_cast<int>(folders.size());
  if (S > plan.num_fragments()) {
    return InvalidArgumentError("--state lists " + std::to_string(S) + " shards, the run has only " +
                                std::to_string(plan.num_fragments()) + " fragments");
  }
  // Every fragment from the shard that owns it (shard k of S owns p ≡ k mod S).
  std::vector<syncer::SyncerCore> cores;
  for (int k = 0; k < S; ++k) {
    ATOLL_ASSIGN_OR_RETURN(auto core, RestoreShard(c, o.config, plan, folders[static_cast<size_t>(k)], {k, S}));
    cores.push_back(std::move(core));
  }
  const auto owner = [&](int p) -> const syncer::SyncerCore& {
    return cores[static_cast<size_t>(syncer::OwnerShard(p, S))];
  };
  ExportResult r;
  r.out = o.out;
  r.state = options.state.empty() ? o.state : options.state;
  r.run_id = c.run_id;
  for (int p = 0; p < plan.num_fragments(); ++p) r.versions.push_back(owner(p).version(p));
  // Each committed round advanced one fragment by one version (learners.json's count is only
  // rewritten every few seconds, so it may lag).
  for (int64_t v : r.versions) r.rounds += v;
  r.params = model.num_params();
  for (int p = 0; p < plan.num_fragments(); ++p) r.theta_checksum ^= exchange::ValuesChecksum(owner(p).theta(p));
  if (o.evaluate) ATOLL_RETURN_IF_ERROR(EvaluateGlobal(c, model, plan, owner, r));
  ATOLL_RETURN_IF_ERROR(model.WriteModel(o.out, plan, [&](int p) { return owner(p).theta(p); },
                                         {{"run_id", c.run_id},
                                          {"rounds", std::to_string(r.rounds)},
                                          {"versions", nlohmann::json(r.versions).dump()},
                                          {"exported_from", S == 1 ? fs::absolute(o.state).string() : r.state}}));
  return r;
}

StatusOr<PresetSpec> WritePresetSpec(const RunConfig& config, const std::string& path) {
  const RunConfig c = Normalized(config);
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c));
  auto manifest = model::EnsureDataPrepared(c.data, [](const std::string& m) { std::printf("%s\n", m.c_str()); });
  if (!manifest.ok()) return manifest.status();
  ATOLL_ASSIGN_OR_RETURN(auto topts, MakeTrainerOptions(c, 0));
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<model::Trainer> trainer, model::Trainer::Create(topts));
  const nlohmann::json metadata = {{"atoll.preset", c.preset},
                                   {"atoll.seed", std::to_string(c.seed)},
                                   {"atoll.seq", std::to_string(c.seq)},
                                   {"atoll.vocab", std::to_string(manifest->vocab_size)}};
  ATOLL_RETURN_IF_ERROR(
      model::WriteModelSpec(path, trainer->tensors(), metadata, [&](size_t t, int64_t begin, std::span<float> out) {
        const auto values = trainer->Parameter(static_cast<int>(t));
        std::copy(values.begin() + begin, values.begin() + begin + static_cast<int64_t>(out.size()), out.begin());
      }));
  return PresetSpec{trainer->num_params(), trainer->tensors().size()};
}

}  // namespace atl::runtime
