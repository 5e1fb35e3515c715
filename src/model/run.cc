// The training-run driver behind `atoll train` (torch-free: it sees only the Trainer interface).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/core/format.h"
#include "atoll/model/data.h"
#include "atoll/model/model_source.h"
#include "atoll/model/run.h"
#include "atoll/model/safetensors.h"
#include "model_json.h"

namespace atl::model {
namespace {

namespace fs = std::filesystem;

std::string Duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return fmt::format("{}h{:02}m", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
}

std::string Rate(double tokens_per_s) {
  return tokens_per_s >= 1000 ? fmt::format("{:.1f}k", tokens_per_s / 1000) : fmt::format("{:.0f}", tokens_per_s);
}

class JsonLines {
 public:
  explicit JsonLines(const std::string& path) : f_(std::fopen(path.c_str(), "a")) {}
  ~JsonLines() {
    if (f_) std::fclose(f_);
  }
  JsonLines(const JsonLines&) = delete;
  JsonLines& operator=(const JsonLines&) = delete;
  bool ok() const { return f_ != nullptr; }
  void Write(const nlohmann::json& j) {
    std::string line = j.dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), f_);
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

// Continues from a checkpoint (everything restored, bit-exact), or starts from the global model
// of an atoll run folder, which holds the weights only.
Status Resume(const ModelSource& from, Trainer& trainer, const std::function<void(const std::string&)>& log) {
  if (from.kind != ModelSourceKind::kClusterRun) {
    Status st = trainer.LoadCheckpoint(from.checkpoint_dir);
    if (!st.ok()) return st.WithContext("resuming from " + from.checkpoint_dir);
    log("resumed from " + from.checkpoint_dir + " at step " + std::to_string(trainer.step()));
    return Status::Ok();
  }
  Status st = LoadSourceWeights(from, trainer);
  if (!st.ok()) return st.WithContext("starting from " + from.weights_file);
  trainer.ResetOptimizerState();
  log("started from the global model of " + from.Describe() +
      ": weights only; an atoll run folder keeps no optimizer state, so the AdamW moments start "
      "fresh, at step 0, with the warm-up and schedule from their start");
  return Status::Ok();
}

}  // namespace

std::string FreshRunDir(const std::string& root, const std::string& prefix) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &tm);
  std::string base = (fs::path(root) / (prefix + "-" + stamp)).string();
  std::string dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

StatusOr<std::string> ResolveCheckpointDir(const std::string& path) {
  if (FileExists((fs::path(path) / "checkpoint.json").string())) return path;
  std::error_code ec;
  fs::path ckpts = fs::path(path) / "checkpoints";
  std::string best;
  if (fs::is_directory(ckpts, ec)) {
    for (const auto& e : fs::directory_iterator(ckpts, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) == 0 && FileExists((e.path() / "checkpoint.json").string()) &&
          name > fs::path(best).filename().string()) {
        best = e.path().string();
      }
    }
  }
  if (!best.empty()) return best;
  return NotFoundError("no checkpoint at " + path +
                       " (expected a folder with checkpoint.json, or a run folder with "
                       "checkpoints/step_*)");
}

namespace {

std::string RunMode(const TrainRunOptions& o) { return o.trainer.replicas > 1 ? "data_parallel" : "single"; }

Status ValidateRunOptions(const TrainRunOptions& o) {
  if (o.steps < 1) return InvalidArgumentError("--steps must be ≥ 1");
  if (o.eval_every < 0 || o.eval_batches < 1 || o.checkpoint_every < 0 || o.log_every < 1) {
    return InvalidArgumentError(
        "--eval-every and --checkpoint-every must be ≥ 0, "
        "--eval-batches ≥ 1");
  }
  return Status::Ok();
}

// What the stages of one run share: the options (out_dir filled in), the trainer, the metrics
// file, and the running totals the summary reports.
struct TrainRun {
  TrainRun(const TrainRunOptions& o, Trainer& trainer, JsonLines& metrics, double wall0)
      : o(o), trainer(trainer), metrics(metrics), mode(RunMode(o)), wall0(wall0) {}

  const TrainRunOptions& o;
  Trainer& trainer;
  JsonLines& metrics;
  const std::string mode;
  const double wall0;  // when the run began, before the trainer was built
  int64_t first_step = 0;
  int64_t tokens_start = 0;
  double eval_loss_start = 0;
  EvalStats last_eval;
  double eval_seconds = 0, train_seconds = 0, last_loss = 0;
  std::string last_checkpoint;

  void Log(const std::string& s) const {
    if (o.log) o.log(s);
  }
  int64_t steps_run() const { return trainer.step() - first_step; }
  int64_t tokens_run() const { return trainer.tokens_trained() - tokens_start; }
};

void LogRunSetup(const TrainRunOptions& o, const Trainer& trainer, const std::function<void(const std::string&)>& log) {
  const auto& tc = o.trainer;
  const auto& mc = tc.model;
  log(
      fmt::format("model: {}, {:.2f} M params (d_model {}, {} layers, {} heads, d_ff {}, {}, "
                  "vocab {}, seq {})",
                  mc.preset, static_cast<double>(trainer.num_params()) / 1e6, mc.d_model, mc.n_layers, mc.n_heads,
                  mc.d_ff, MlpName(mc.mlp), mc.vocab_size, mc.seq_len));
  log(
      fmt::format("train: {}, {} replica(s) × batch {} × seq {} = {} tokens/step, {} steps, "
                  "lr {:.2g}, {} thread(s), {} → {}",
                  RunMode(o), tc.replicas, tc.batch_size, mc.seq_len, Grouped(trainer.tokens_per_step()), o.steps,
                  tc.optim.lr, tc.threads, PrecisionName(trainer.precision()), o.out_dir));
}

nlohmann::json RunConfigJson(const TrainRunOptions& o, const std::string& resume_dir) {
  const auto& tc = o.trainer;
  return {{"mode", RunMode(o)},
          {"model", ModelConfigToJson(tc.model)},
          {"optimizer", OptimizerConfigToJson(tc.optim)},
          {"batch_size", tc.batch_size},
          {"replicas", tc.replicas},
          {"learner_id", tc.learner_id},
          {"num_learners", tc.num_learners},
          {"seed", tc.seed},
          {"threads", tc.threads},
          {"data_dir", fs::absolute(tc.data_dir).string()},
          {"steps", o.steps},
          {"eval_every", o.eval_every},
          {"eval_batches", o.eval_batches},
          {"checkpoint_every", o.checkpoint_every},
          {"resume", resume_dir}};
}

Status Evaluate(TrainRun& r) {
  const double t = RealClock::Default().NowSeconds();
  ATOLL_ASSIGN_OR_RETURN(r.last_eval, r.trainer.Evaluate(r.o.eval_batches));
  r.eval_seconds += RealClock::Default().NowSeconds() - t;
  r.metrics.Write({{"kind", "eval"},
                   {"step", r.trainer.step()},
                   {"tokens", r.trainer.tokens_trained()},
                   {"eval_loss", r.last_eval.loss},
                   {"perplexity", r.last_eval.perplexity},
                   {"eval_tokens", r.last_eval.tokens}});
  r.Log(fmt::format("eval  step {}: loss {:.4f}, perplexity {:.2f} ({} tokens)", r.trainer.step(), r.last_eval.loss,
                    r.last_eval.perplexity, Grouped(r.last_eval.tokens)));
  return Status::Ok();
}

Status SaveCheckpoint(TrainRun& r) {
  std::string dir = (fs::path(r.o.out_dir) / "checkpoints" / fmt::format("step_{:06}", r.trainer.step())).string();
  ATOLL_RETURN_IF_ERROR(r.trainer.SaveCheckpoint(dir));
  r.last_checkpoint = dir;
  return Status::Ok();
}

// One metrics line per step; a progress line on the first step, every log_every and the last,
// with throughput averaged over this run's steps so far.
void RecordStep(TrainRun& r, const StepStats& st, double loop0) {
  const double tps = st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0;
  r.metrics.Write({{"kind", "train"},
                   {"step", st.step},
                   {"tokens", r.trainer.tokens_trained()},
                   {"loss", st.loss},
                   {"lr", st.lr},
                   {"grad_norm", st.grad_norm},
                   {"tokens_per_second", tps},
                   {"seconds", st.seconds},
                   {"elapsed", RealClock::Default().NowSeconds() - r.wall0}});
  const int64_t done = st.step - r.first_step;
  if (done != 1 && st.step % r.o.log_every != 0 && st.step != r.o.steps) return;
  const double elapsed = RealClock::Default().NowSeconds() - loop0;
  const double avg_tps =
      static_cast<double>(r.trainer.tokens_trained() - r.tokens_start) / std::max(1e-9, r.train_seconds);
  const double eta = elapsed / static_cast<double>(done) * static_cast<double>(r.o.steps - st.step);
  r.Log(fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | {} tok/s | {:.0f} ms/step | ETA {}", st.step, r.o.steps,
                    st.loss, st.lr, Rate(avg_tps), 1000 * r.train_seconds / static_cast<double>(done), Duration(eta)));
}

// Steps up to o.steps with the periodic evaluations and checkpoints; the final ones (at
// o.steps) are left to FinishRun so they happen exactly once.
Status TrainToEnd(TrainRun& r) {
  const double loop0 = RealClock::Default().NowSeconds();
  while (r.trainer.step() < r.o.steps) {
    ATOLL_ASSIGN_OR_RETURN(StepStats st, r.trainer.Step());
    r.train_seconds += st.seconds;
    r.last_loss = st.loss;
    RecordStep(r, st, loop0);
    if (r.o.eval_every > 0 && st.step % r.o.eval_every == 0 && st.step != r.o.steps) {
      ATOLL_RETURN_IF_ERROR(Evaluate(r));
    }
    if (r.o.checkpoint_every > 0 && st.step % r.o.checkpoint_every == 0 && st.step != r.o.steps) {
      ATOLL_RETURN_IF_ERROR(SaveCheckpoint(r));
    }
  }
  return Status::Ok();
}

nlohmann::json SummaryJson(const TrainRun& r, double wall) {
  const auto& tc = r.o.trainer;
  const int64_t steps_run = r.steps_run();
  const int64_t tokens_run = r.tokens_run();
  const double train_seconds = r.train_seconds;
  return {{"mode", r.mode},
          {"learners", tc.replicas},
          {"replicas", tc.replicas},
          {"preset", tc.model.preset},
          {"params", r.trainer.num_params()},
          {"steps", r.trainer.step()},
          {"steps_this_run", steps_run},
          {"tokens_trained", r.trainer.tokens_trained()},
          {"tokens_per_step", r.trainer.tokens_per_step()},
          {"train_loss", r.last_loss},
          {"eval_loss_start", r.eval_loss_start},
          {"eval_loss", r.last_eval.loss},
          {"perplexity", r.last_eval.perplexity},
          {"wall_seconds", wall},
          {"train_seconds", train_seconds},
          {"eval_seconds", r.eval_seconds},
          {"tokens_per_second", train_seconds > 0 ? tokens_run / train_seconds : 0.0},
          {"ms_per_step", steps_run > 0 ? 1000 * train_seconds / steps_run : 0.0},
          {"threads", tc.threads},
          {"precision", PrecisionName(r.trainer.precision())},
          {"seed", tc.seed},
          {"checkpoint", r.last_checkpoint},
          {"data_dir", fs::absolute(tc.data_dir).string()},
          {"out_dir", r.o.out_dir}};
}

// The closing evaluation (skipped when a resumed run had nothing left to do and already has a
// checkpoint), the last checkpoint, and summary.json.
StatusOr<nlohmann::json> FinishRun(TrainRun& r) {
  if (r.trainer.step() > r.first_step || r.last_checkpoint.empty()) {
    ATOLL_RETURN_IF_ERROR(Evaluate(r));
  }
  ATOLL_RETURN_IF_ERROR(SaveCheckpoint(r));
  const double wall = RealClock::Default().NowSeconds() - r.wall0;
  nlohmann::json summary = SummaryJson(r, wall);
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic((fs::path(r.o.out_dir) / "summary.json").string(), summary.dump(2) + "\n"));
  r.Log(fmt::format(
      "done: {} steps, {} tokens in {} ({} tok/s); eval loss {:.4f} → {:.4f}; "
      "checkpoint {}",
      r.steps_run(), Grouped(r.tokens_run()), Duration(wall), Rate(summary["tokens_per_second"].get<double>()),
      r.eval_loss_start, r.last_eval.loss, r.last_checkpoint));
  return summary;
}

}  // namespace

StatusOr<TrainRunResult> RunTraining(const TrainRunOptions& in) {
  TrainRunOptions o = in;
  auto log = [&o](const std::string& s) {
    if (o.log) o.log(s);
  };
  ATOLL_RETURN_IF_ERROR(ValidateRunOptions(o));
  if (o.trainer.optim.total_steps <= 0) o.trainer.optim.total_steps = o.steps;
  const double wall0 = RealClock::Default().NowSeconds();

  std::optional<ModelSource> resume;
  if (!o.resume.empty()) {
    ATOLL_ASSIGN_OR_RETURN(resume, ResolveModelSource(o.resume));
  }
  if (o.out_dir.empty()) o.out_dir = FreshRunDir("runs", "train");
  ATOLL_RETURN_IF_ERROR(MakeDirs(o.out_dir));

  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(o.trainer));
  if (resume) ATOLL_RETURN_IF_ERROR(Resume(*resume, *trainer, log));
  const std::string resume_dir = !resume                          ? std::string()
                                 : resume->checkpoint_dir.empty() ? resume->weights_file
                                                                  : resume->checkpoint_dir;
  LogRunSetup(o, *trainer, log);
  ATOLL_RETURN_IF_ERROR(
      WriteFileAtomic((fs::path(o.out_dir) / "config.json").string(), RunConfigJson(o, resume_dir).dump(2) + "\n"));
  JsonLines metrics((fs::path(o.out_dir) / "metrics.jsonl").string());
  if (!metrics.ok()) return InternalError("cannot write " + o.out_dir + "/metrics.jsonl");

  TrainRun r(o, *trainer, metrics, wall0);
  ATOLL_RETURN_IF_ERROR(Evaluate(r));
  r.eval_loss_start = r.last_eval.loss;
  r.first_step = trainer->step();
  r.tokens_start = trainer->tokens_trained();
  ATOLL_RETURN_IF_ERROR(TrainToEnd(r));
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json summary, FinishRun(r));
  return TrainRunResult{o.out_dir, summary};
}

}  // namespace atl::model
