// `atoll export`: a syncer's committed durable state (state/meta.json + fragment-NNN.bin, see
// atoll/syncer/durable_state.h) turned into a safetensors checkpoint of the global model Θ —
// for a run that ended without writing global.safetensors (the syncer was killed, the machine
// went down), or to look at the global model while a run is still going.
//
// The model is rebuilt from the run config (preset, seq and the vocabulary of its data folder)
// to get the tensor specs and the fragment plan exactly as the syncer did (MakePlan); the state
// is restored into a SyncerCore with DurableState::Restore, which checks that it belongs to this
// run, model and plan and verifies every fragment's checksum; Θ is then scattered into the
// tensors and written with model::WriteSafetensors (atomic, self-checksummed), loadable by
// `atoll sample/eval --checkpoint` when written into the run folder.
// Thread-safety: one call at a time per output file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/runtime/run_config.h"

namespace atl::runtime {

struct ExportOptions {
  // At least one of config and state. config: the run's config.json (or TOML run file), or its
  // run folder; "" = the config.json beside the state folder (every syncer writes one into its
  // run folder). state: the state folder; "" = <folder of the config>/state.
  std::string config;
  std::string state;
  std::string out;        // the .safetensors file to write; "" = <folder of the config>/global.safetensors
  bool force = false;     // overwrite `out` when it exists
  bool evaluate = false;  // also measure the exported model's eval loss (the run's eval_batches)
};

struct ExportResult {
  std::string out;
  std::string state;
  std::string run_id;
  int64_t rounds = 0;             // committed rounds: the sum of the fragment versions
  std::vector<int64_t> versions;  // per fragment
  int64_t params = 0;
  uint64_t theta_checksum = 0;                  // XOR of the fragments' value checksums (as the syncer's summary)
  double eval_loss = -1, eval_perplexity = -1;  // with evaluate; -1 otherwise
};

// A sharded syncer's run (docs/decisions/011): `state` lists every shard's state folder,
// comma-separated in shard order; each fragment is taken from the shard that owns it, and a
// state resumed as another shard is refused (FailedPrecondition).
// InvalidArgument when neither config nor state is given; NotFound for a missing config, state or data
// folder; AlreadyExists for an existing --out without force; FailedPrecondition for the state of
// another run, model or plan; DataLoss for a truncated or corrupted state file.
StatusOr<ExportResult> ExportState(const ExportOptions& options);

// `atoll init`: the initial weights of the run's preset (its seed, the data folder's vocabulary,
// prepared when missing) written as a model spec (model/model_spec.h) at `path`, with the
// metadata atoll.preset, atoll.seed, atoll.seq and atoll.vocab.
struct PresetSpec {
  int64_t params = 0;
  size_t tensors = 0;
};
StatusOr<PresetSpec> WritePresetSpec(const RunConfig& config, const std::string& path);

}  // namespace atl::runtime
