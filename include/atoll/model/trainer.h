// Trainer: one learner's model, data and inner optimizer behind a torch-free interface.
//
// This is the seam between libtorch and the rest of atoll: the runtime (learner process, syncer
// evaluation), benchmarks and the CLI see only this header, TensorSpec and flat fp32 spans, so
// <torch/torch.h> stays confined to src/model/*.cc (compile cost).
//
// Parameters are exposed as named flat fp32 tensors in a fixed order (the order of
// tensors()); Parameter(i) is a view of the live, contiguous storage the model trains, so a
// caller may read it (to compute an outer gradient) and overwrite it (to apply a merged global
// fragment) between two Step() calls. The tied token embedding appears once, flagged
// is_embedding.
//
// Thread-safety: not thread-safe; one thread drives Step/Evaluate and may touch Parameter()
// spans only between calls. at::set_num_threads(options.threads) is applied at Create.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"
#include "atoll/diloco/tensor_spec.h"

namespace atl::model {

// The MLP of each transformer block: SwiGLU (w1, w3 gate and value, w2 out) or GELU (w1, w2).
enum class Mlp { kSwiglu, kGelu };
inline constexpr EnumNames<Mlp, 2> kMlpNames{"mlp", {{{Mlp::kSwiglu, "swiglu"}, {Mlp::kGelu, "gelu"}}}};
constexpr const auto& NamesOf(Mlp) { return kMlpNames; }
inline const char* MlpName(Mlp m) { return kMlpNames.Name(m); }
inline StatusOr<Mlp> ParseMlp(std::string_view s) { return kMlpNames.Parse(s); }

// Training arithmetic: kFp32; kBf16 (autocast: matrix products in bf16 with fp32 master weights,
// residual stream, gradients and AdamW; evaluation stays fp32); kAuto = bf16 where the CPU has
// bf16 matrix hardware (AMX or AVX-512-BF16), else fp32 (ResolvePrecision).
enum class Precision { kAuto, kFp32, kBf16 };
inline constexpr EnumNames<Precision, 3> kPrecisionNames{
    "precision", {{{Precision::kAuto, "auto"}, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}}}};
constexpr const auto& NamesOf(Precision) { return kPrecisionNames; }
inline const char* PrecisionName(Precision p) { return kPrecisionNames.Name(p); }
inline StatusOr<Precision> ParsePrecision(std::string_view s) { return kPrecisionNames.Parse(s); }
// kFp32 or kBf16: kAuto decided from this machine's CPU, the others as they are.
Precision ResolvePrecision(Precision precision);

struct ModelConfig {
  std::string preset = "tiny";  // tiny (~1 M params) | small (~5 M) | base (~20 M)
  int vocab_size = 4096;
  int d_model = 128;
  int n_layers = 4;
  int n_heads = 4;
  int d_ff = 344;  // SwiGLU hidden width
  int seq_len = 256;
  Mlp mlp = Mlp::kSwiglu;
};

// Fills a config from a preset name (vocab_size kept from the tokenizer). InvalidArgument for an
// unknown preset. Presets (d_model / layers / heads / d_ff, seq 256; params at vocab 4096):
//   tiny  128 / 4 / 4 /  344   1.32 M
//   small 256 / 5 / 8 /  688   5.00 M
//   base  512 / 6 / 8 / 1280  20.19 M
StatusOr<ModelConfig> PresetConfig(const std::string& preset, int vocab_size);

// The preset names, smallest first.
std::vector<std::string> PresetNames();

// InvalidArgument unless every size is positive, d_model divides into n_heads heads of even
// width (rotary embeddings rotate pairs) and vocab ≤ 65536.
Status ValidateModelConfig(const ModelConfig& config);

// Number of trainable parameters of the model a config describes (tied embedding counted once).
int64_t ParameterCount(const ModelConfig& config);

struct OptimizerConfig {
  double lr = 3e-3;          // peak AdamW learning rate
  double min_lr_frac = 0.1;  // cosine floor as a fraction of lr
  int64_t warmup_steps = 50;
  int64_t total_steps = 1000;  // cosine horizon
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double clip_norm = 1.0;
};

// The warm-up the schedule uses: warmup_steps, but at most half of total_steps (when that is set),
// so that every run has a decay phase. A run shorter than its warm-up would otherwise end at its
// peak learning rate, and its final model would be whatever its last step made of it: at a high
// learning rate one inner step can spike the loss, the next one recovers, and a decoupled learner's
// final push sends the spike (a 16-step test run with the default warm-up of 20 ended with a global
// model worse than its initial one this way).
int64_t EffectiveWarmupSteps(const OptimizerConfig& optim);
// What a command prints when EffectiveWarmupSteps cuts the warm-up asked for; empty when it does not.
std::string WarmupCutNote(const OptimizerConfig& optim);

// The learning rate of the step that follows `step` completed steps: linear warm-up to lr over
// EffectiveWarmupSteps, then cosine decay to min_lr_frac·lr at total_steps, flat after.
double ScheduledLearningRate(const OptimizerConfig& optim, int64_t step);

struct TrainerOptions {
  ModelConfig model;
  OptimizerConfig optim;
  std::string data_dir = "data";  // prepared by `atoll data prepare` (tokenizer + shards)
  int batch_size = 16;            // sequences per step
  int learner_id = 0;             // which disjoint shard of the training data to read
  int num_learners = 1;           // how many shards the training data is cut into
  uint64_t seed = 0;
  int threads = 1;                         // torch intra-op threads
  Precision precision = Precision::kAuto;  // training arithmetic
  // Synchronous data-parallel baseline: each Step() runs `replicas` micro-batches of batch_size
  // sequences, replica r reading shard learner_id·replicas + r of num_learners·replicas, and
  // applies their averaged gradient — the same global batch M learners of a Decoupled DiLoCo run
  // process per step. The replicas run one after another in this thread on one model copy
  // (mathematically identical to M copies with an all-reduce, since every copy holds the same
  // parameters).
  int replicas = 1;
  // A learner restarted after a failure continues at this step: the learning-rate schedule
  // resumes there and every data reader skips the batches of the first start_step steps, so it
  // does not train on its shard's beginning again. AdamW moments start fresh (they died with the
  // process; docs/failure-semantics.md).
  int64_t start_step = 0;
  // A model spec written for this preset (model/model_spec.h, `atoll init`): its values replace
  // the seed's initial weights. "" = the seed's. Create refuses (FailedPrecondition) a spec of
  // another model, naming the first tensor that differs.
  std::string init_weights;
};

struct StepStats {
  int64_t step = 0;    // inner steps completed after this one
  int64_t tokens = 0;  // tokens in this step's batch
  double loss = 0;     // mean token cross-entropy of the batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  double seconds = 0;    // wall time of the step
};

struct EvalStats {
  double loss = 0;  // mean token cross-entropy on the validation set
  double perplexity = 0;
  int64_t tokens = 0;
};

class Trainer {
 public:
  virtual ~Trainer() = default;
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);

  virtual const std::vector<diloco::TensorSpec>& tensors() const = 0;
  virtual std::span<float> Parameter(int i) = 0;
  virtual int64_t num_params() const = 0;

  // One inner step: next batch of this learner's shard, forward, backward, clip, AdamW.
  // Equivalent to ComputeGradients() followed by ApplyGradients().
  virtual StatusOr<StepStats> Step() = 0;
  // The two halves of Step(), for a data-parallel step whose gradient is averaged elsewhere
  // (atoll's `ddp` mode): ComputeGradients runs forward and backward on the next batch (loss and
  // tokens filled in); Gradient(i) then views tensor i's gradient (contiguous fp32, writable, so a
  // caller can replace it with the all-reduced average; valid until the next ComputeGradients); ApplyGradients clips, runs AdamW and
  // advances the step. ApplyGradients without a preceding ComputeGradients is FailedPrecondition.
  virtual StatusOr<StepStats> ComputeGradients() = 0;
  virtual std::span<float> Gradient(int i) = 0;
  virtual StatusOr<StepStats> ApplyGradients(StepStats computed) = 0;
  // Mean cross-entropy over `batches` fixed validation batches (same batches every call).
  virtual StatusOr<EvalStats> Evaluate(int batches) = 0;

  // The training arithmetic in use: kFp32 or kBf16 (TrainerOptions::precision resolved).
  virtual Precision precision() const = 0;
  virtual int64_t step() const = 0;
  virtual int64_t tokens_trained() const = 0;
  virtual int64_t tokens_per_step() const = 0;

  // Checkpoint of model + AdamW state + data position + step (safetensors + JSON manifest,
  // atomic, checksummed). Load restores all of it so the next Step() is bit-identical.
  virtual Status SaveCheckpoint(const std::string& dir) = 0;
  virtual Status LoadCheckpoint(const std::string& dir) = 0;
  // Resets AdamW moments (used when a learner's parameters are replaced wholesale).
  virtual void ResetOptimizerState() = 0;
};

// Views of every parameter (Parameter(i)) and of every gradient (Gradient(i), valid until the
// next ComputeGradients), in tensors() order: the model as the fragment plan sees it.
inline std::vector<std::span<float>> ParameterViews(Trainer& trainer) {
  std::vector<std::span<float>> views;
  for (int i = 0; i < static_cast<int>(trainer.tensors().size()); ++i) views.push_back(trainer.Parameter(i));
  return views;
}
inline std::vector<std::span<float>> GradientViews(Trainer& trainer) {
  std::vector<std::span<float>> views;
  for (int i = 0; i < static_cast<int>(trainer.tensors().size()); ++i) views.push_back(trainer.Gradient(i));
  return views;
}

}  // namespace atl::model
