// Training runs and sampling: what `atoll train` and `atoll sample` call.
//
// RunTraining drives one Trainer (a single learner alone, or with replicas > 1 the synchronous
// data-parallel baseline) for a number of steps, evaluates periodically on the validation set,
// checkpoints, and writes a run folder:
//   config.json        the options of the run
//   metrics.jsonl      one line per step {"kind":"train", step, tokens, loss, lr, grad_norm,
//                      tokens_per_second, seconds, elapsed} and per evaluation
//                      {"kind":"eval", step, tokens, eval_loss, perplexity}
//   checkpoints/step_NNNNNN/  checkpoints (model.safetensors, optimizer.safetensors,
//                      checkpoint.json); the last one is always written
//   summary.json       mode, learners, replicas, params, steps, tokens_trained, eval_loss_start,
//                      eval_loss, perplexity, wall_seconds, train_seconds, tokens_per_second,
//                      ms_per_step, checkpoint, … (written atomically at the end)
// Thread-safety: one run per thread; the log callback is called on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"
#include "atoll/model/trainer.h"

namespace atl::model {

struct TrainRunOptions {
  TrainerOptions trainer;  // trainer.optim.total_steps is set to `steps` when ≤ 0
  int64_t steps = 300;     // total inner steps (a resumed run continues up to this)
  int eval_every = 100;    // steps; 0 = only at the start and the end
  int eval_batches = 8;    // fixed validation batches per evaluation
  std::string out_dir;     // "" = a fresh runs/train-YYYYmmdd-HHMMSS folder
  // What to continue from (model_source.h): a checkpoint folder or `atoll train` run folder
  // (its latest checkpoint; everything restored, bit-exact), or an `atoll run` folder (the
  // global model's weights only: fresh AdamW moments, step 0). "" = fresh start.
  std::string resume;
  int64_t checkpoint_every = 0;                 // steps; 0 = only at the end
  int log_every = 10;                           // progress line every this many steps
  std::function<void(const std::string&)> log;  // progress lines; null = silent
};

struct TrainRunResult {
  std::string out_dir;
  nlohmann::json summary;
};

// InvalidArgument for bad options; errors of the trainer (data missing, checkpoint corrupted)
// pass through with context.
StatusOr<TrainRunResult> RunTraining(const TrainRunOptions& options);

// A checkpoint folder itself (holds checkpoint.json), or an `atoll train` run folder whose latest
// checkpoints/step_* is returned. NotFound otherwise. (ResolveModelSource in model_source.h also
// knows `atoll run` folders.)
StatusOr<std::string> ResolveCheckpointDir(const std::string& path);

// A fresh, not yet existing folder name under `root` ("runs"): root/<prefix>-YYYYmmdd-HHMMSS.
std::string FreshRunDir(const std::string& root, const std::string& prefix);

struct SampleOptions {
  std::string checkpoint;  // checkpoint, train run or atoll run folder (model_source.h)
  std::string data_dir;    // tokenizer location; "" = the one the model was trained on
  std::string prompt;
  int max_new_tokens = 200;
  double temperature = 0.8;  // 0 = greedy
  int top_k = 40;            // 0 = no top-k filter
  uint64_t seed = 0;
  int threads = 1;
};

struct SampleResult {
  std::string completion;  // the generated continuation only
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;
  double seconds = 0;
};

// Loads the model (checksums verified) and its tokenizer and continues the prompt.
StatusOr<SampleResult> Sample(const SampleOptions& options);

}  // namespace atl::model
