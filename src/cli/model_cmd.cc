// `atoll data prepare`, `atoll train`, `atoll sample`, `atoll eval`: flag parsing for the model
// module; the work happens in atoll/model (data.h, run.h, model_source.h).
#include <cstdio>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "atoll/core/format.h"
#include "atoll/model/data.h"
#include "atoll/model/model_source.h"
#include "atoll/model/run.h"
#include "atoll/model/trainer.h"
#include "atoll/observe/run_report.h"
#include "command.h"

namespace atl::cli {
namespace {

void PrintLine(const std::string& s) {
  std::printf("%s\n", s.c_str());
  std::fflush(stdout);
}

int Fail(const std::string& command, const Status& st) {
  std::fprintf(stderr, "atoll %s: error: %s\n", command.c_str(), st.ToString().c_str());
  return 1;
}

void RegisterData(CLI::App& app, CommandContext& ctx) {
  auto* data = app.add_subcommand("data", "Prepare training data (corpus, tokenizer, shards)");
  data->require_subcommand(1);
  auto opts = std::make_shared<model::DataOptions>();
  auto* prep =
      data->add_subcommand("prepare",
                           "Extract the default public-domain corpus (King James Bible, World English Bible, "
                           "fortunes) or read your own text / token shards, train the tokenizer, write shards "
                           "and a validation split. Does nothing when the folder is already prepared the same way.");
  prep->add_option("--out", opts->out_dir, "Data folder")->capture_default_str();
  prep->add_option("--vocab", opts->vocab_size, "BPE vocabulary size (≤ 65536)")->capture_default_str();
  AddEnumOption(prep, "--tokenizer", opts->tokenizer, "SentencePiece BPE or bytes (external: from --shards)");
  prep->add_option("--input", opts->inputs, "Your own text files or folders (repeatable)");
  prep->add_option("--shards", opts->shards, "Existing tokenised .bin shards (repeatable)");
  prep->add_option("--val-fraction", opts->val_fraction, "Share held out for validation")->capture_default_str();
  prep->add_flag("--force", opts->force, "Prepare again even if already done");
  prep->callback([&ctx, opts] {
    ctx.action = [opts] {
      opts->log = PrintLine;
      auto m = model::PrepareData(*opts);
      if (!m.ok()) return Fail("data prepare", m.status());
      std::printf("data ready in %s: tokenizer %s, vocab %d, %s train + %s val tokens\n", m->dir.c_str(),
                  model::TokenizerKindName(m->tokenizer), m->vocab_size, Grouped(m->train_tokens).c_str(),
                  Grouped(m->val_tokens).c_str());
      return 0;
    };
  });
}

struct TrainFlags {
  model::TrainRunOptions run;
  std::string preset = "tiny";
  int seq = 256;
  int d_model = 0, layers = 0, heads = 0, d_ff = 0;
  model::Mlp mlp = model::Mlp::kSwiglu;  // used when --mlp is given
  int64_t warmup = -1;
};

bool Given(const CLI::App& cmd, const char* flag) { return cmd.count(flag) > 0; }

// --resume: flags the user left unset follow the source (the model it holds, the data folder and
// seed it was trained with), so `atoll train --resume DIR` needs nothing else.
StatusOr<std::optional<model::ModelSource>> AdoptResumeSource(const CLI::App& cmd, TrainFlags& f) {
  if (f.run.resume.empty()) return std::optional<model::ModelSource>();
  ATOLL_ASSIGN_OR_RETURN(model::ModelSource src, model::ResolveModelSource(f.run.resume));
  if (!Given(cmd, "--data")) f.run.trainer.data_dir = src.data_dir;
  if (!Given(cmd, "--seed")) f.run.trainer.seed = src.seed;
  PrintLine("resume from " + src.Describe());
  return std::optional<model::ModelSource>(src);
}

bool ModelFlagsGiven(const CLI::App& cmd) {
  for (const char* flag : {"--preset", "--d-model", "--layers", "--heads", "--d-ff", "--mlp"}) {
    if (Given(cmd, flag)) return true;
  }
  return false;
}

// The model of the run: the preset and overrides, or, resuming without model flags, the source's.
StatusOr<model::ModelConfig> TrainModelConfig(const CLI::App& cmd, const TrainFlags& f,
                                              const std::optional<model::ModelSource>& src, int vocab) {
  model::ModelConfig config;
  if (src && !ModelFlagsGiven(cmd)) {
    config = src->model;
  } else {
    ATOLL_ASSIGN_OR_RETURN(config, model::PresetConfig(f.preset, vocab));
  }
  if (Given(cmd, "--seq") || !src) config.seq_len = f.seq;
  if (f.d_model > 0) config.d_model = f.d_model;
  if (f.layers > 0) config.n_layers = f.layers;
  if (f.heads > 0) config.n_heads = f.heads;
  if (f.d_ff > 0) config.d_ff = f.d_ff;
  if (Given(cmd, "--mlp")) config.mlp = f.mlp;
  return config;
}

int RunTrain(const CLI::App& cmd, TrainFlags& f) {
  auto& run = f.run;
  run.log = PrintLine;
  // Flags are checked before the data is prepared (which may take a while).
  auto known = model::PresetConfig(f.preset, 256);
  if (!known.ok()) return Fail("train", known.status());
  if (run.steps < 1 || run.trainer.batch_size < 1 || f.seq < 1 || run.trainer.replicas < 1 || run.trainer.threads < 1 ||
      run.trainer.optim.lr <= 0) {
    return Fail("train", InvalidArgumentError("--steps, --batch, --seq, --replicas, --threads and --lr must be "
                                              "positive"));
  }
  auto src = AdoptResumeSource(cmd, f);
  if (!src.ok()) return Fail("train", src.status().WithContext("--resume"));
  auto data = model::EnsureDataPrepared(run.trainer.data_dir, PrintLine);
  if (!data.ok()) return Fail("train", data.status());
  auto config = TrainModelConfig(cmd, f, *src, data->vocab_size);
  if (!config.ok()) return Fail("train", config.status());
  run.trainer.model = *config;
  run.trainer.optim.total_steps = run.steps;
  run.trainer.optim.warmup_steps = f.warmup >= 0 ? f.warmup : run.steps / 10;
  if (auto note = model::WarmupCutNote(run.trainer.optim); !note.empty()) {
    std::fprintf(stderr, "atoll train: note: %s\n", note.c_str());
  }
  auto res = model::RunTraining(run);
  if (!res.ok()) return Fail("train", res.status());
  if (auto report = observe::WriteRunReport(res->out_dir); report.ok()) {
    std::printf("report: %s\n", report->path.c_str());
  } else {
    std::fprintf(stderr, "atoll train: warning: no report: %s\n", report.status().ToString().c_str());
  }
  std::printf("run folder: %s\n", res->out_dir.c_str());
  return 0;
}

void RegisterTrain(CLI::App& app, CommandContext& ctx) {
  auto f = std::make_shared<TrainFlags>();
  auto& r = f->run;
  auto& t = r.trainer;
  auto* cmd = app.add_subcommand("train",
                                 "Train one learner alone (the single-island baseline), or with --replicas M the "
                                 "synchronous data-parallel baseline (M micro-batches per step, gradients averaged). "
                                 "With no flags: prepares the default corpus if needed and trains the tiny model.");
  cmd->add_option("--preset", f->preset, "Model preset: tiny (~1 M), small (~5 M), base (~20 M)")
      ->capture_default_str();
  cmd->add_option("--steps", r.steps, "Inner steps")->capture_default_str();
  cmd->add_option("--batch", t.batch_size, "Sequences per step (per replica)")->capture_default_str();
  cmd->add_option("--seq", f->seq, "Sequence length")->capture_default_str();
  cmd->add_option("--lr", t.optim.lr, "Peak AdamW learning rate")->capture_default_str();
  cmd->add_option("--warmup", f->warmup,
                  "Warm-up steps (default: 10% of --steps; at most half of --steps, so that the run decays)");
  cmd->add_option("--min-lr-frac", t.optim.min_lr_frac, "Cosine floor as a fraction of --lr")->capture_default_str();
  cmd->add_option("--weight-decay", t.optim.weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--clip", t.optim.clip_norm, "Gradient clipping norm")->capture_default_str();
  cmd->add_option("--replicas", t.replicas, "Synchronous data-parallel replicas (gradients averaged every step)")
      ->capture_default_str();
  cmd->add_option("--threads", t.threads, "Torch threads (1 per learner is fastest here)")->capture_default_str();
  AddEnumOption(cmd, "--precision", t.precision,
                "Training arithmetic (auto: bf16 where the CPU has AMX or AVX-512-BF16, else fp32; bf16: matrix "
                "products in bf16, fp32 weights, gradients and optimizer; evaluation in fp32)");
  cmd->add_option("--eval-every", r.eval_every, "Evaluate every N steps (0: start and end)")->capture_default_str();
  cmd->add_option("--eval-batches", r.eval_batches, "Validation batches per evaluation")->capture_default_str();
  cmd->add_option("--checkpoint-every", r.checkpoint_every, "Checkpoint every N steps (0: end)")->capture_default_str();
  cmd->add_option("--log-every", r.log_every, "Progress line every N steps")->capture_default_str();
  cmd->add_option("--out", r.out_dir, "Run folder (default: runs/train-<timestamp>)");
  cmd->add_option("--data", t.data_dir, "Prepared data folder (prepared with defaults if absent)")
      ->capture_default_str();
  cmd->add_option("--seed", t.seed, "Seed of initial weights and data order")->capture_default_str();
  cmd->add_option("--resume", r.resume,
                  "Continue from a checkpoint or `atoll train` run folder (bit-exact), or start "
                  "from an `atoll run` folder's global model (weights only: fresh AdamW "
                  "moments). Unset model flags, --data and --seed follow it");
  cmd->add_option("--d-model", f->d_model, "Override the preset's width");
  cmd->add_option("--layers", f->layers, "Override the preset's layer count");
  cmd->add_option("--heads", f->heads, "Override the preset's head count");
  cmd->add_option("--d-ff", f->d_ff, "Override the preset's MLP width");
  AddEnumOption(cmd, "--mlp", f->mlp, "Override the preset's MLP");
  cmd->callback([&ctx, f, cmd] { ctx.action = [f, cmd] { return RunTrain(*cmd, *f); }; });
}

void RegisterSample(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<model::SampleOptions>();
  auto* cmd = app.add_subcommand("sample", "Generate text from a trained model");
  cmd->add_option("--checkpoint", o->checkpoint,
                  "Checkpoint folder, `atoll train` run folder, or `atoll run` folder "
                  "(global.safetensors)")
      ->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue");
  cmd->add_option("--tokens", o->max_new_tokens, "New tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--data", o->data_dir,
                  "Data folder with the tokenizer (default: the "
                  "checkpoint's)");
  cmd->callback([&ctx, o] {
    ctx.action = [o] {
      auto res = model::Sample(*o);
      if (!res.ok()) return Fail("sample", res.status());
      std::printf("%s%s\n", o->prompt.c_str(), res->completion.c_str());
      std::fprintf(stderr, "(%lld new tokens in %.1f s)\n", static_cast<long long>(res->new_tokens), res->seconds);
      return 0;
    };
  });
}

void PrintEval(const model::EvalResult& r, bool json) {
  if (json) {
    nlohmann::json j = {{"checkpoint", r.source.path},
                        {"kind", model::ModelSourceKindName(r.source.kind)},
                        {"weights", r.source.weights_file},
                        {"step", r.source.step},
                        {"preset", r.source.model.preset},
                        {"params", r.params},
                        {"data", r.data_dir},
                        {"batches", r.batches},
                        {"batch_size", r.batch_size},
                        {"seq", r.source.model.seq_len},
                        {"eval_loss", r.stats.loss},
                        {"perplexity", r.stats.perplexity},
                        {"eval_tokens", r.stats.tokens},
                        {"seconds", r.seconds}};
    PrintLine(j.dump());
    return;
  }
  std::printf(
      "eval loss %.4f, perplexity %.2f on %s validation tokens (%d batches × %d × %d) "
      "of %s\n",
      r.stats.loss, r.stats.perplexity, Grouped(r.stats.tokens).c_str(), r.batches, r.batch_size,
      r.source.model.seq_len, r.data_dir.c_str());
  std::printf("model: %s; %s params; %.1f s\n", r.source.Describe().c_str(), Grouped(r.params).c_str(), r.seconds);
}

void RegisterEval(CLI::App& app, CommandContext& ctx) {
  auto o = std::make_shared<model::EvalOptions>();
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("eval", "Eval loss and perplexity of a trained model on a validation set");
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint folder, `atoll train` run folder, or `atoll run` folder")
      ->required();
  cmd->add_option("--data", o->data_dir,
                  "Data folder to evaluate on (default: the one the model was trained on; it "
                  "must use the same tokenizer)");
  cmd->add_option("--batches", o->batches,
                  "Validation batches (default: the run's own eval batches, else " +
                      std::to_string(model::kDefaultEvalBatches) + ")");
  cmd->add_option("--batch", o->batch_size, "Sequences per batch (default: the model's training batch)");
  cmd->add_option("--threads", o->threads, "Torch threads")->capture_default_str();
  cmd->add_flag("--json", *json, "Print one JSON object instead of the lines for people");
  cmd->callback([&ctx, o, json] {
    ctx.action = [o, json] {
      auto res = model::EvaluateSource(*o);
      if (!res.ok()) return Fail("eval", res.status());
      PrintEval(*res, *json);
      return 0;
    };
  });
}

}  // namespace

ATOLL_COMMAND(20, RegisterData);
ATOLL_COMMAND(21, RegisterTrain);
ATOLL_COMMAND(22, RegisterSample);
ATOLL_COMMAND(23, RegisterEval);

}  // namespace atl::cli
