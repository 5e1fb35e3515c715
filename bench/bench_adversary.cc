// bench_adversary: one compromised learner among four against the real syncer code, under each
// attack of learner/adversary.h, in `atoll simulate` (SyncerCore in SyncerLoop, real LearnerAgents
// and models on simulated time: deterministic, so the runs compare exactly). Every number is a
// ratio to runs made in the same invocation: the same run with four honest learners, and with the
// attacker absent (three learners).
//
// Usage: bench_adversary [--full] [--data DIR] [--attacks a,b,...] [--set option=value ...]
//   --full     a longer run (tiny model, 4 × 240 steps of 8 × 128 tokens, P = H = 8), minutes;
//              default: the CI test's shape (4 × 64 steps of 4 × 32 tokens, P = H = 4), seconds
//   --data     prepared data folder (default runs/bench-adversary-data: the default corpus, byte-level,
//              prepared there if absent, as the CI test does)
//   --attacks  a subset (default: every attack)
//   --set      a syncer option for every run (defences: influence_size_factor,
//              influence_min_cosine, max_step_rate_factor, max_weight_factor, quarantine_factor)
// Prints one row per attack and one final JSON line.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/learner/adversary.h"
#include "atoll/model/data.h"
#include "atoll/runtime/simulate.h"

namespace {

using namespace atl;

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "bench_adversary: %s\nusage: bench_adversary [--full] [--data DIR] [--attacks a,b,...] "
               "[--set option=value ...]\n",
               why.c_str());
  std::exit(2);
}

struct Args {
  bool full = false;
  std::string data = "runs/bench-adversary-data";
  std::vector<learner::Attack> attacks = learner::AllAttacks();
  std::map<std::string, double> set;
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = s.find(sep, start)) != std::string::npos; start = at + 1)
    out.push_back(s.substr(start, at - start));
  out.push_back(s.substr(start));
  return out;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--full") {
      a.full = true;
    } else if (k == "--data") {
      a.data = value();
    } else if (k == "--attacks") {
      a.attacks.clear();
      for (const auto& name : Split(value(), ',')) {
        auto attack = learner::ParseAttack(name);
        if (!attack.ok()) Usage(attack.status().ToString());
        if (*attack == learner::Attack::kNone) Usage("--attacks: 'none' is the honest run every table starts with");
        a.attacks.push_back(*attack);
      }
    } else if (k == "--set") {
      const auto kv = Split(value(), '=');
      if (kv.size() != 2) Usage("--set wants option=value");
      a.set[kv[0]] = std::atof(kv[1].c_str());
    } else {
      Usage("unknown argument " + k);
    }
  }
  return a;
}

void Apply(const std::map<std::string, double>& set, syncer::SyncerOptions& o) {
  const std::map<std::string, double*> fields = {{"influence_size_factor", &o.influence_size_factor},
                                                 {"influence_min_cosine", &o.influence_min_cosine},
                                                 {"max_step_rate_factor", &o.max_step_rate_factor},
                                                 {"max_weight_factor", &o.max_weight_factor},
                                                 {"quarantine_factor", &o.quarantine_factor}};
  for (const auto& [key, v] : set) {
    auto it = fields.find(key);
    if (it == fields.end()) Usage("--set: unknown option " + key);
    *it->second = v;
  }
}

runtime::RunConfig Shape(const Args& a) {
  runtime::RunConfig c;
  c.learners = 4;
  c.data = a.data;
  c.run_id = "adversary";
  c.eval_every = 0;
  c.tau = 1;
  if (a.full) {
    c.steps = 240, c.seq = 128, c.batch = 8, c.fragments = 8, c.H = 8, c.warmup = 16, c.eval_batches = 16;
  } else {
    c.steps = 64, c.seq = 32, c.batch = 4, c.fragments = 4, c.H = 4, c.warmup = 4, c.eval_batches = 8;
  }
  return c;
}

runtime::SimulateResult Run(const Args& a, learner::Attack attack, int learners) {
  runtime::SimulateOptions o;
  o.step_seconds = 1.0;
  o.spread = 0.1;
  o.jitter = 0.2;
  o.adjust_syncer = [&a](syncer::SyncerOptions& so) { Apply(a.set, so); };
  o.connect = [attack](int m, syncer::SyncerApi& api, Clock&) -> std::unique_ptr<syncer::SyncerApi> {
    if (m != 3 || attack == learner::Attack::kNone) return nullptr;
    return std::make_unique<learner::AdversarialSyncerApi>(api, attack);
  };
  runtime::RunConfig c = Shape(a);
  c.learners = learners;
  auto r = runtime::Simulate(c, o);
  if (!r.ok()) Usage(std::string(learner::AttackName(attack)) + ": " + r.status().ToString());
  return *r;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  model::DataOptions data;
  data.out_dir = a.data;
  data.tokenizer = model::TokenizerKind::kByte;  // a folder prepared otherwise is used as it is
  data.log = [](const std::string& m) { std::fprintf(stderr, "%s\n", m.c_str()); };
  if (!model::LoadDataManifest(a.data).ok()) {
    if (auto d = model::PrepareData(data); !d.ok()) Usage(d.status().ToString());
  }
  const auto clean = Run(a, learner::Attack::kNone, 4);
  const auto without = Run(a, learner::Attack::kNone, 3);
  std::printf("%-13s %10s %9s %11s %12s %14s\n", "attack", "eval loss", "÷ clean", "÷ without", "min version",
              "tokens ÷ clean");
  auto row = [&](const char* name, const runtime::SimulateResult& r) {
    int64_t min_version = r.fragment_versions.empty() ? 0 : r.fragment_versions.front();
    for (int64_t v : r.fragment_versions) min_version = std::min(min_version, v);
    std::printf("%-13s %10.4f %9.4f %11.4f %12lld %14.3g\n", name, r.eval_loss, r.eval_loss / clean.eval_loss,
                r.eval_loss / without.eval_loss, static_cast<long long>(min_version),
                r.tokens_merged / clean.tokens_merged);
    std::fflush(stdout);
    return nlohmann::json{{"attack", name},
                          {"eval_loss", r.eval_loss},
                          {"vs_clean", r.eval_loss / clean.eval_loss},
                          {"vs_without", r.eval_loss / without.eval_loss},
                          {"min_version", min_version},
                          {"tokens_merged", r.tokens_merged}};
  };
  nlohmann::json rows = nlohmann::json::array();
  rows.push_back(row("none", clean));
  rows.push_back(row("(3 learners)", without));
  for (learner::Attack attack : a.attacks) rows.push_back(row(learner::AttackName(attack), Run(a, attack, 4)));
  std::printf("%s\n", nlohmann::json{{"bench", "adversary"}, {"full", a.full}, {"rows", rows}}.dump().c_str());
  return 0;
}
