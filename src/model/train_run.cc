// The training-run driver behind `atoll train` (torch-free: it sees only the Trainer interface).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>

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

std::string Printf(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

std::string Duration(double s) {
  if (s < 60) return Printf("%.0fs", s);
  if (s < 3600) return Printf("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return Printf("%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
}

std::string Rate(double tokens_per_s) {
  return tokens_per_s >= 1000 ? Printf("%.1fk", tokens_per_s / 1000) : Printf("%.0f", tokens_per_s);
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
Status Resume(const ModelSource& from, Trainer& trainer,
              const std::function<void(const std::string&)>& log) {
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

StatusOr<TrainRunResult> RunTraining(const TrainRunOptions& in) {
  TrainRunOptions o = in;
  auto log = [&o](const std::string& s) {
    if (o.log) o.log(s);
  };
  if (o.steps < 1) return InvalidArgumentError("--steps must be ≥ 1");
  if (o.eval_every < 0 || o.eval_batches < 1 || o.checkpoint_every < 0 || o.log_every < 1) {
    return InvalidArgumentError("--eval-every and --checkpoint-every must be ≥ 0, "
                                "--eval-batches ≥ 1");
  }
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
  const std::string resume_dir = !resume                   ? std::string()
                                 : resume->checkpoint_dir.empty() ? resume->weights_file
                                                                  : resume->checkpoint_dir;
  const auto& tc = o.trainer;
  const auto& mc = tc.model;
  const std::string mode = tc.replicas > 1 ? "data_parallel" : "single";
  log(Printf("model: %s, %.2f M params (d_model %d, %d layers, %d heads, d_ff %d, %s, vocab %d, "
             "seq %d)",
             mc.preset.c_str(), trainer->num_params() / 1e6, mc.d_model, mc.n_layers, mc.n_heads,
             mc.d_ff, mc.mlp.c_str(), mc.vocab_size, mc.seq_len));
  log(Printf("train: %s, %d replica(s) × batch %d × seq %d = %s tokens/step, %lld steps, "
             "lr %.2g, %d thread(s) → %s",
             mode.c_str(), tc.replicas, tc.batch_size, mc.seq_len,
             Grouped(trainer->tokens_per_step()).c_str(), static_cast<long long>(o.steps),
             tc.optim.lr, tc.threads, o.out_dir.c_str()));

  nlohmann::json config = {
      {"mode", mode},
      {"model", ModelConfigToJson(mc)},
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
  ATOLL_RETURN_IF_ERROR(
      WriteFileAtomic((fs::path(o.out_dir) / "config.json").string(), config.dump(2) + "\n"));
  JsonLines metrics((fs::path(o.out_dir) / "metrics.jsonl").string());
  if (!metrics.ok()) return InternalError("cannot write " + o.out_dir + "/metrics.jsonl");

  double eval_seconds = 0;
  EvalStats last_eval;
  auto evaluate = [&]() -> Status {
    const double t = RealClock::Default().NowSeconds();
    ATOLL_ASSIGN_OR_RETURN(last_eval, trainer->Evaluate(o.eval_batches));
    eval_seconds += RealClock::Default().NowSeconds() - t;
    metrics.Write({{"kind", "eval"},
                   {"step", trainer->step()},
                   {"tokens", trainer->tokens_trained()},
                   {"eval_loss", last_eval.loss},
                   {"perplexity", last_eval.perplexity},
                   {"eval_tokens", last_eval.tokens}});
    log(Printf("eval  step %lld: loss %.4f, perplexity %.2f (%s tokens)",
               static_cast<long long>(trainer->step()), last_eval.loss, last_eval.perplexity,
               Grouped(last_eval.tokens).c_str()));
    return Status::Ok();
  };
  std::string last_checkpoint;
  auto checkpoint = [&]() -> Status {
    std::string dir = (fs::path(o.out_dir) / "checkpoints" /
                       Printf("step_%06lld", static_cast<long long>(trainer->step())))
                          .string();
    ATOLL_RETURN_IF_ERROR(trainer->SaveCheckpoint(dir));
    last_checkpoint = dir;
    return Status::Ok();
  };

  ATOLL_RETURN_IF_ERROR(evaluate());
  const double eval_loss_start = last_eval.loss;
  const int64_t first_step = trainer->step();
  const int64_t tokens_start = trainer->tokens_trained();
  double train_seconds = 0, last_loss = 0;
  const double loop0 = RealClock::Default().NowSeconds();
  while (trainer->step() < o.steps) {
    ATOLL_ASSIGN_OR_RETURN(StepStats st, trainer->Step());
    train_seconds += st.seconds;
    last_loss = st.loss;
    const double tps = st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0;
    metrics.Write({{"kind", "train"},
                   {"step", st.step},
                   {"tokens", trainer->tokens_trained()},
                   {"loss", st.loss},
                   {"lr", st.lr},
                   {"grad_norm", st.grad_norm},
                   {"tokens_per_second", tps},
                   {"seconds", st.seconds},
                   {"elapsed", RealClock::Default().NowSeconds() - wall0}});
    const int64_t done = st.step - first_step;
    if (done == 1 || st.step % o.log_every == 0 || st.step == o.steps) {
      const double elapsed = RealClock::Default().NowSeconds() - loop0;
      const double avg_tps = static_cast<double>(trainer->tokens_trained() - tokens_start) /
                             std::max(1e-9, train_seconds);
      const double eta = elapsed / static_cast<double>(done) *
                         static_cast<double>(o.steps - st.step);
      log(Printf("step %lld/%lld | loss %.4f | lr %.2e | %s tok/s | %.0f ms/step | ETA %s",
                 static_cast<long long>(st.step), static_cast<long long>(o.steps), st.loss, st.lr,
                 Rate(avg_tps).c_str(), 1000 * train_seconds / static_cast<double>(done),
                 Duration(eta).c_str()));
    }
    if (o.eval_every > 0 && st.step % o.eval_every == 0 && st.step != o.steps) {
      ATOLL_RETURN_IF_ERROR(evaluate());
    }
    if (o.checkpoint_every > 0 && st.step % o.checkpoint_every == 0 && st.step != o.steps) {
      ATOLL_RETURN_IF_ERROR(checkpoint());
    }
  }
  if (trainer->step() > first_step || last_checkpoint.empty()) {
    ATOLL_RETURN_IF_ERROR(evaluate());
  }
  ATOLL_RETURN_IF_ERROR(checkpoint());

  const int64_t steps_run = trainer->step() - first_step;
  const int64_t tokens_run = trainer->tokens_trained() - tokens_start;
  const double wall = RealClock::Default().NowSeconds() - wall0;
  nlohmann::json summary = {
      {"mode", mode},
      {"learners", tc.replicas},
      {"replicas", tc.replicas},
      {"preset", mc.preset},
      {"params", trainer->num_params()},
      {"steps", trainer->step()},
      {"steps_this_run", steps_run},
      {"tokens_trained", trainer->tokens_trained()},
      {"tokens_per_step", trainer->tokens_per_step()},
      {"train_loss", last_loss},
      {"eval_loss_start", eval_loss_start},
      {"eval_loss", last_eval.loss},
      {"perplexity", last_eval.perplexity},
      {"wall_seconds", wall},
      {"train_seconds", train_seconds},
      {"eval_seconds", eval_seconds},
      {"tokens_per_second", train_seconds > 0 ? tokens_run / train_seconds : 0.0},
      {"ms_per_step", steps_run > 0 ? 1000 * train_seconds / steps_run : 0.0},
      {"threads", tc.threads},
      {"seed", tc.seed},
      {"checkpoint", last_checkpoint},
      {"data_dir", fs::absolute(tc.data_dir).string()},
      {"out_dir", o.out_dir}};
  ATOLL_RETURN_IF_ERROR(
      WriteFileAtomic((fs::path(o.out_dir) / "summary.json").string(), summary.dump(2) + "\n"));
  log(Printf("done: %lld steps, %s tokens in %s (%s tok/s); eval loss %.4f → %.4f; "
             "checkpoint %s",
             static_cast<long long>(steps_run), Grouped(tokens_run).c_str(),
             Duration(wall).c_str(), Rate(summary["tokens_per_second"].get<double>()).c_str(),
             eval_loss_start, last_eval.loss, last_checkpoint.c_str()));
  return TrainRunResult{o.out_dir, summary};
}

}  // namespace atl::model
