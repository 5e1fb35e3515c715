// Where a trained model lives, whichever command wrote it: what `atoll sample`, `atoll eval`
// and `atoll train --resume` accept.
//
// Three layouts are recognised (ResolveModelSource):
//   checkpoint    an `atoll train` checkpoint folder: checkpoint.json (model config, data
//                 folder, file checksums), model.safetensors, optimizer.safetensors
//   train run     an `atoll train` run folder: its latest checkpoints/step_* is used
//   atoll run     an `atoll run` folder: global.safetensors (the syncer's Θ at the end of the
//                 run) and config.json (the flat run config: preset, seq, data, batch, seed,
//                 run_id, eval_batches). The model is the preset at that seq with the vocabulary
//                 of the run's data folder (data.json); the tokenizer is that folder's. A
//                 .safetensors file inside such a folder (e.g. one `atoll export` wrote) is
//                 accepted in place of global.safetensors.
// An atoll run folder holds no optimizer state: resuming from it starts fresh AdamW moments at
// step 0 (weights only).
//
// Torch-free (the model is reached through Trainer or named spans). Thread-safety: pure
// functions of the file system.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/tensor_spec.h"
#include "atoll/model/safetensors.h"
#include "atoll/model/trainer.h"

namespace atl::model {

enum class ModelSourceKind { kCheckpoint, kTrainRun, kClusterRun };
// "checkpoint", "train run", "atoll run".
const char* ModelSourceKindName(ModelSourceKind kind);

struct ModelSource {
  ModelSourceKind kind = ModelSourceKind::kCheckpoint;
  std::string path;              // as given
  std::string checkpoint_dir;    // checkpoint / train run: the checkpoint folder; "" otherwise
  std::string weights_file;      // model.safetensors or global.safetensors
  std::string weights_checksum;  // XXH3-64 hex from checkpoint.json; "" = the file's own
                                 // atoll.checksum (always verified)
  ModelConfig model;
  std::string data_dir;  // the data folder the model was trained on (as recorded)
  int batch_size = 16;   // its training batch (sequences per step)
  uint64_t seed = 0;
  int eval_batches = 0;  // validation batches its run evaluated with; 0 = unknown
  int64_t step = -1;     // inner step of a checkpoint; -1 for an atoll run folder
  std::string run_id;    // atoll run: the run id (checked against the weights file)

  // One line for people: "atoll run folder runs/x (global.safetensors; preset tiny, vocab 256,
  // seq 64)".
  std::string Describe() const;
};

// Recognises `path` as one of the layouts above. `data_dir` (optional): read an atoll run
// folder's vocabulary from this data folder instead of the recorded one (which may have moved);
// ModelSource::data_dir stays the recorded folder. NotFound (naming the
// layouts) for a missing or unrecognised folder; FailedPrecondition for an atoll run folder
// without global.safetensors (the message says how to `atoll export` one from its state);
// DataLoss / InvalidArgument for a damaged or foreign checkpoint.json or config.json.
StatusOr<ModelSource> ResolveModelSource(const std::string& path, const std::string& data_dir = "");

// Reads the source's weights and copies them into the tensors described by `specs` (param(i)
// views tensor i's live storage, specs[i].numel floats). Everything is checked before anything
// is written: DataLoss for a corrupted file (checksum) or a tensor missing or of another shape,
// FailedPrecondition for the weights of another run.
Status LoadSourceWeights(const ModelSource& source, const std::vector<diloco::TensorSpec>& specs,
                         const std::function<std::span<float>(size_t)>& param);
// The same into a trainer's parameters (its step, AdamW moments and data position unchanged).
Status LoadSourceWeights(const ModelSource& source, Trainer& trainer);

// Validation batches `atoll eval` uses when neither the flag nor the source run names a number.
inline constexpr int kDefaultEvalBatches = 16;

struct EvalOptions {
  std::string checkpoint;  // checkpoint, train run or atoll run folder
  std::string data_dir;    // "" = the data folder the model was trained on
  int batches = 0;         // validation batches; 0 = the source run's eval batches, else kDefaultEvalBatches
  int batch_size = 0;      // sequences per batch; 0 = the source's training batch
  int threads = 1;
};

struct EvalResult {
  ModelSource source;
  std::string data_dir;  // the data folder evaluated on
  int batches = 0;
  int batch_size = 0;
  int64_t params = 0;
  EvalStats stats;  // loss, perplexity, tokens
  double seconds = 0;
};

// The eval loss (mean token cross-entropy on the first batches × batch_size validation windows,
// the windows Trainer::Evaluate uses) of any source. FailedPrecondition when `data_dir` holds
// another tokenizer than the one the model was trained with.
StatusOr<EvalResult> EvaluateSource(const EvalOptions& options);

}  // namespace atl::model
