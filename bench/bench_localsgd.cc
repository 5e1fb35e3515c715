// bench_localsgd: the outer loop's math without the runtime — M learners (real Trainers: the GPT,
// AdamW, the learners' own data shards) stepped one after another in one thread, their fragments
// merged on the staggered schedule by the same diloco functions the syncer uses, every round
// holding every learner. Deterministic: the same flags give the same losses bit for bit, so a
// change of the outer rule can be compared without the drift between processes that makes two
// `atoll run`s of one configuration differ. What it leaves out is exactly asynchrony (partial
// rounds, late pushes); bench_fidelity measures the real thing.
//
// Usage: bench_localsgd --data DIR [--dp] [-M 4] [--steps 150] [--seq 256] [--batch 16]
//          [--lr 3e-3] [--warmup 15] [--eval-batches 16] [--eval-every 25] [--seed 0]
//          [-P 24] [-H 24] [--tau 2] [--keep-progress 1] [--alpha 0] [--merge rda|rda-all|mean]
//          [--outer-lr 1] [--outer-momentum 0] [--precision fp32|bf16] [--preset tiny] [--label NAME]
//          [--warm-sync W] [--warm-h h]
//   --warm-sync W  every fragment is merged once every h steps (default h = 1: after every step;
//          fragment p when step mod h = p mod h) during the first W steps, applied before the
//          next step, then the staggered schedule: how much of the gap to data-parallel opens
//          while the learners leave their common initialisation.
//   --dp   data-parallel instead: one model, M micro-batches per step, gradients averaged
//          (`atoll train --replicas M`), the reference the ratios are taken against.
// Prints the eval curve and one JSON line {"label", "eval_loss", "curve": [[step, loss]...]}.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/platform.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/model/data.h"
#include "atoll/model/trainer.h"

namespace {

using atl::model::Trainer;
using atl::model::TrainerOptions;

[[noreturn]] void Die(const std::string& what, const atl::Status& st) {
  std::fprintf(stderr, "bench_localsgd: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

constexpr const char* kUsage =
    "usage: bench_localsgd --data DIR [--dp] [-M 4] [--steps 150] [--seq 256] [--batch 16]\n"
    "         [--lr 3e-3] [--warmup 15] [--eval-batches 16] [--eval-every 25] [--seed 0]\n"
    "         [-P 24] [-H 24] [--tau 2] [--keep-progress 1] [--alpha 0] [--merge rda|rda-all|mean]\n"
    "         [--outer-lr 1] [--outer-momentum 0] [--precision fp32|bf16] [--preset tiny] [--label NAME]\n"
    "         [--warm-sync W] [--warm-h h]\n"
    "  M learners stepped in one thread, fragments merged on the staggered schedule with every\n"
    "  learner in every round (deterministic; no asynchrony).\n"
    "  --dp         data-parallel instead (atoll train --replicas M): the reference\n"
    "  --warm-sync  merge every fragment once every h steps during the first W steps\n"
    "  --merge      as the syncer's: rda (the embedding by the mean) | rda-all (RDA for it too) | mean\n"
    "  Prints the eval curve and one JSON line {\"label\", \"eval_loss\", \"curve\"}.\n";

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr, "bench_localsgd: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

// A flag's enum value, or the usage with the parse error.
template <typename E>
E Parsed(const atl::StatusOr<E>& parsed) {
  if (!parsed.ok()) Usage(parsed.status().message());
  return *parsed;
}

struct Args {
  std::string data, preset = "tiny", label;
  atl::diloco::MergeRule merge = atl::diloco::MergeRule::kRda;
  atl::model::Precision precision = atl::model::Precision::kFp32;
  bool dp = false, keep_progress = true;
  int M = 4, seq = 256, batch = 16, eval_batches = 16, P = 24, H = 24, tau = 2;
  int64_t steps = 150, warmup = 15, eval_every = 25, warm_sync = 0, warm_h = 1;
  uint64_t seed = 0;
  double lr = 3e-3, outer_lr = 1.0, outer_momentum = 0.0, alpha = 0.0;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    auto v = [&]() -> std::string {
      if (i + 1 >= argc) Usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--data") a.data = v();
    else if (k == "--dp") a.dp = true;
    else if (k == "-M") a.M = std::atoi(v().c_str());
    else if (k == "--steps") a.steps = std::atoll(v().c_str());
    else if (k == "--seq") a.seq = std::atoi(v().c_str());
    else if (k == "--batch") a.batch = std::atoi(v().c_str());
    else if (k == "--lr") a.lr = std::atof(v().c_str());
    else if (k == "--warmup") a.warmup = std::atoll(v().c_str());
    else if (k == "--eval-batches") a.eval_batches = std::atoi(v().c_str());
    else if (k == "--eval-every") a.eval_every = std::atoll(v().c_str());
    else if (k == "--seed") a.seed = std::strtoull(v().c_str(), nullptr, 10);
    else if (k == "-P") a.P = std::atoi(v().c_str());
    else if (k == "-H") a.H = std::atoi(v().c_str());
    else if (k == "--tau") a.tau = std::atoi(v().c_str());
    else if (k == "--keep-progress") a.keep_progress = std::atoi(v().c_str()) != 0;
    else if (k == "--merge") a.merge = Parsed(atl::diloco::ParseMergeRule(v()));
    else if (k == "--alpha") a.alpha = std::atof(v().c_str());
    else if (k == "--outer-lr") a.outer_lr = std::atof(v().c_str());
    else if (k == "--outer-momentum") a.outer_momentum = std::atof(v().c_str());
    else if (k == "--preset") a.preset = v();
    else if (k == "--precision") a.precision = Parsed(atl::model::ParsePrecision(v()));
    else if (k == "--label") a.label = v();
    else if (k == "--warm-sync") a.warm_sync = std::atoll(v().c_str());
    else if (k == "--warm-h") a.warm_h = std::max<int64_t>(1, std::atoll(v().c_str()));
    else Usage("unknown flag '" + k + "'");
  }
  if (a.data.empty()) Usage("--data DIR is required");
  if (a.M < 1 || a.steps < 1 || a.P < 1 || a.H < a.P || a.tau < 0 || a.tau >= a.H) Usage("bad -M/--steps/-P/-H/--tau");
  if (a.label.empty()) a.label = a.dp ? "dp" : "localsgd";
  return a;
}

std::unique_ptr<Trainer> MakeTrainer(const Args& a, int learner, int learners, int replicas) {
  TrainerOptions o;
  auto manifest = atl::model::LoadDataManifest(a.data);
  if (!manifest.ok()) Die("data " + a.data, manifest.status());
  auto cfg = atl::model::PresetConfig(a.preset, manifest->vocab_size);
  if (!cfg.ok()) Die("preset", cfg.status());
  o.model = *cfg;
  o.model.seq_len = a.seq;
  o.optim.lr = a.lr;
  o.optim.warmup_steps = a.warmup;
  o.precision = a.precision;
  o.optim.total_steps = a.steps;
  o.data_dir = a.data;
  o.batch_size = a.batch;
  o.learner_id = learner;
  o.num_learners = learners;
  o.replicas = replicas;
  o.seed = a.seed;
  auto t = Trainer::Create(o);
  if (!t.ok()) Die("trainer", t.status());
  return std::move(t).value();
}

double Eval(Trainer& t, int batches) {
  auto ev = t.Evaluate(batches);
  if (!ev.ok()) Die("evaluate", ev.status());
  return ev->loss;
}

}  // namespace

int main(int argc, char** argv) {
  atl::EnsureBlasEnvironmentOrReexec(argc, argv);
  atl::KeepFreedMemory();
  const Args a = Parse(argc, argv);
  nlohmann::json curve = nlohmann::json::array();
  double final_loss = NAN;
  auto record = [&](int64_t step, double loss) {
    std::printf("%s step %lld eval %.4f\n", a.label.c_str(), static_cast<long long>(step), loss);
    std::fflush(stdout);
    curve.push_back({step, loss});
    final_loss = loss;
  };

  if (a.dp) {
    auto t = MakeTrainer(a, 0, 1, a.M);
    record(0, Eval(*t, a.eval_batches));
    for (int64_t s = 0; s < a.steps; ++s) {
      if (auto st = t->Step(); !st.ok()) Die("step", st.status());
      if ((s + 1) % a.eval_every == 0 || s + 1 == a.steps) record(s + 1, Eval(*t, a.eval_batches));
    }
  } else {
    std::vector<std::unique_ptr<Trainer>> learners;
    for (int m = 0; m < a.M; ++m) learners.push_back(MakeTrainer(a, m, a.M, 1));
    auto global = MakeTrainer(a, 0, a.M, 1);  // holds Θ for evaluation
    atl::diloco::PlanOptions po;
    po.num_fragments = a.P;
    auto plan = atl::diloco::MakeFragmentPlan(global->tensors(), po);
    if (!plan.ok()) Die("plan", plan.status());
    const atl::diloco::Schedule sched{a.H, a.P, a.tau, false};
    const auto rule = a.merge;
    atl::diloco::OuterOptimizerOptions oo;
    oo.lr = a.outer_lr;
    oo.momentum = a.outer_momentum;
    const size_t Pn = static_cast<size_t>(a.P);
    std::vector<std::vector<float>> theta(Pn), momentum(Pn);
    auto gviews = atl::model::ParameterViews(*global);
    for (size_t p = 0; p < Pn; ++p) {
      theta[p].resize(static_cast<size_t>(plan->fragments[p].numel));
      atl::exchange::GatherFragment(plan->fragments[p], gviews, theta[p]);
      momentum[p].assign(theta[p].size(), 0.0f);
    }
    // A round in flight: fragment p sent after step `sent_at`, applied before step due.
    struct Pending {
      int p;
      int64_t due;
      std::vector<std::vector<float>> sent;  // per learner, θ_{m,p} at the send
    };
    std::vector<Pending> pending;
    // One round of fragment p holding every learner: v_m = Θ_p − θ_{m,p}, merge, outer step.
    auto round = [&](int p, int64_t due) {
      const auto& frag = plan->fragments[static_cast<size_t>(p)];
      Pending pe{p, due, {}};
      std::vector<std::vector<float>> grads;
      std::vector<std::span<const float>> gv;
      std::vector<double> w;
      for (auto& l : learners) {
        std::vector<float> local(static_cast<size_t>(frag.numel));
        auto views = atl::model::ParameterViews(*l);
        atl::exchange::GatherFragment(frag, std::span<const std::span<float>>(views), local);
        std::vector<float> g(local.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = theta[static_cast<size_t>(p)][i] - local[i];
        grads.push_back(std::move(g));
        pe.sent.push_back(std::move(local));
        w.push_back(1.0);
      }
      for (const auto& g : grads) gv.emplace_back(g);
      std::vector<float> merged(static_cast<size_t>(frag.numel));
      if (auto st = atl::diloco::MergeFragment(frag, rule, gv, w, merged); !st.ok()) Die("merge", st);
      if (auto st = atl::diloco::OuterStep(oo, merged, momentum[static_cast<size_t>(p)], theta[static_cast<size_t>(p)]);
          !st.ok()) {
        Die("outer step", st);
      }
      return pe;
    };
    record(0, Eval(*global, a.eval_batches));
    for (int64_t s = 0; s < a.steps; ++s) {
      for (auto& l : learners) {
        if (auto st = l->Step(); !st.ok()) Die("step", st.status());
      }
      if (s < a.warm_sync) {
        for (int p = 0; p < a.P; ++p) {
          if (p % a.warm_h == s % a.warm_h) pending.push_back(round(p, s + 1));
        }
      } else {
        for (int p : sched.FragmentsAt(s)) pending.push_back(round(p, sched.DueStep(s)));
      }
      // Apply the rounds due before step s + 1.
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->due > s + 1) {
          ++it;
          continue;
        }
        const auto& frag = plan->fragments[static_cast<size_t>(it->p)];
        const auto& th = theta[static_cast<size_t>(it->p)];
        for (size_t m = 0; m < learners.size(); ++m) {
          auto views = atl::model::ParameterViews(*learners[m]);
          std::vector<float> now(static_cast<size_t>(frag.numel));
          atl::exchange::GatherFragment(frag, std::span<const std::span<float>>(views), now);
          for (size_t i = 0; i < now.size(); ++i) {
            const float merged_value = a.keep_progress ? th[i] + (now[i] - it->sent[m][i]) : th[i];
            now[i] = static_cast<float>(a.alpha * now[i] + (1.0 - a.alpha) * merged_value);
          }
          atl::exchange::ScatterFragment(frag, now, std::span<const std::span<float>>(views));
        }
        it = pending.erase(it);
      }
      if (s + 1 == a.steps) {
        // The end of training: every fragment's work since its last sync goes in (atoll's final sync).
        for (int p = 0; p < a.P; ++p) {
          bool in_flight = false;
          for (const auto& pe : pending) in_flight |= pe.p == p;
          if (!in_flight && sched.SendOffset(p) != static_cast<int>(s % a.H)) round(p, s + 1);
        }
      }
      if ((s + 1) % a.eval_every == 0 || s + 1 == a.steps) {
        for (size_t p = 0; p < Pn; ++p) atl::exchange::ScatterFragment(plan->fragments[p], theta[p], gviews);
        record(s + 1, Eval(*global, a.eval_batches));
      }
    }
  }
  nlohmann::json out{{"label", a.label}, {"eval_loss", final_loss}, {"curve", curve}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
