// bench_fidelity: the paper's model-quality experiments, one driver (docs/experiments.md).
// Each part runs `atoll run` / `atoll train` side by side in this invocation, over several seeds,
// and writes a markdown table (<out>/<part>.md) and loss-vs-tokens curves (<out>/<part>.svg).
// Ratios come from runs made in the same invocation; nothing here is a timed test.
//
// Parts:
//   parity      data-parallel (atoll train --replicas 4) vs synchronous DiLoCo (--mode diloco,
//               P = 1, H = 50) vs decoupled with its defaults, at equal tokens, on the project
//               corpus (BPE) and a byte-level corpus the default corpus does not use
//   rda         RDA vs mean as the number of learners M = 2, 4, 8 grows
//   codecs      what goes on the wire: int4 (default) vs int4/int8 vs int2 vs bf16 vs fp32
//   alpha       mixing on receipt: α = 0 vs 0.5
//   mixed       learners at speeds 1, 1, 0.5, 0.5: K = M vs K = 1 vs K = 1 + grace
//   scavenging  two learners from the start and two added mid-run vs four from the start
//   budget      (--only) data-parallel with its lr tuned vs synchronous DiLoCo vs decoupled at 20
//               tokens per parameter; outer (--only): the outer-optimizer sweep at that horizon;
//               frontier (--only): eval loss against bytes on the wire for P = H in 6, 12, 24, 48
#include "fidelity.h"

namespace bench::fidelity {

const char* kUsage =
    "usage: bench_fidelity [--quick] [--only PART] [--out DIR] [--data DIR] [--bytes-data DIR] [--seeds N]\n"
    "                      [--steps N] [--corpora project,bytes] [--wait-while FILE] [budget flags]\n"
    "  PART: parity | rda | codecs | alpha | weights | mixed | scavenging (default: all of these)\n"
    "        | budget | outer | frontier (only when named: hours each)\n"
    "  budget    data-parallel (`atoll train --replicas 4`, lr tuned over --dp-lrs at the quarter\n"
    "            budget), synchronous DiLoCo (P = 1, H = 24) and decoupled (defaults), the last two\n"
    "            in `atoll simulate`, at --tokens-per-param, --seeds seeds, each of --corpora; then\n"
    "            --confirm real `atoll run`s of decoupled. Writes budget.md, budget-<corpus>.svg\n"
    "  outer     decoupled's outer optimizer: momentum {0, 0.5, 0.9} x outer lr {0.4, 0.7, 1} x\n"
    "            alpha {0, 0.5} at the quarter budget, the defaults and the --finalists best at the\n"
    "            full budget, a winner by 1 % checked at the 150-step shape. Writes outer.md\n"
    "  frontier  decoupled at P = H for each --frontier-h, with data-parallel and synchronous\n"
    "            DiLoCo: eval loss against bytes on the wire at the full budget. Writes frontier.md,\n"
    "            frontier.svg\n"
    "  --quick       small runs (seq 128, batch 8, 48 steps, 1 seed unless --seeds): a smoke check\n"
    "  --data        prepared project corpus (default data; prepared by atoll when missing)\n"
    "  --bytes-data  byte-level corpus folder (default data-mhcc; made from Debian's\n"
    "                sword-comm-mhcc, Matthew Henry's Concise Commentary, when missing)\n"
    "  --seeds N     seeds per configuration (default 2)\n"
    "  --steps N     inner steps per learner (default 150; quick 48; budget parts: the full budget,\n"
    "                default from --tokens-per-param)\n"
    "  --corpora     which corpora parity and the budget parts use (default project,bytes); the\n"
    "                other parts use bytes\n"
    "  --wait-while FILE  before each run, wait while FILE exists (checked every 2 minutes)\n"
    "  A run whose folder in --out holds a summary.json from the same command is not run again:\n"
    "  rerun the same command line with the same --out to resume an interrupted invocation.\n"
    "budget flags:\n"
    "  --tokens-per-param X  full budget = X tokens per model parameter, 4 learners (default 20;\n"
    "                quick 0.25); the quarter budget is a quarter of its steps\n"
    "  --dp-lrs a,b,c   data-parallel learning rates tried at the quarter budget (default\n"
    "                0.002,0.003,0.0045; extended by x1.5 past an edge that wins, twice at most)\n"
    "  --confirm N   real `atoll run`s of decoupled per corpus at the full budget (default 1)\n"
    "  --sweep-seeds N  seeds of the quarter-budget outer sweep (default 1)\n"
    "  --finalists N sweep configurations carried to the full budget (default 2)\n"
    "  --frontier-h a,b,..  P = H values of the frontier (default 6,12,24,48)\n"
    "  --frontier-seeds N  seeds per frontier point (default 1)\n";

// A comma-separated list of numbers; exits 2 on anything else.
template <typename T>
std::vector<T> ParseList(const std::string& flag, const std::string& text) {
  std::vector<T> out;
  std::stringstream ss(text);
  for (std::string v; std::getline(ss, v, ',');) {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(x > 0)) {
      std::fprintf(stderr, "bench_fidelity: %s: '%s' is not a positive number\n%s", flag.c_str(), v.c_str(), kUsage);
      std::exit(2);
    }
    out.push_back(static_cast<T>(x));
  }
  return out;
}

// A count flag in [lo, hi]; exits 2 outside it.
int Count(const std::string& flag, const std::string& text, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < lo || v > hi) {
    std::fprintf(stderr, "bench_fidelity: %s must be an integer in [%d, %d], got '%s'\n", flag.c_str(), lo, hi,
                 text.c_str());
    std::exit(2);
  }
  return static_cast<int>(v);
}

// Splits our own flags off argv and hands the rest to ParseCommon.
Args ParseArgs(int argc, char** argv) {
  Args a;
  std::vector<char*> rest = {argv[0]};
  bool seeds_set = false, tpp_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_fidelity: %s needs a value\n%s", k.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--bytes-data") a.bytes_data = next();
    else if (k == "--seeds") a.seeds = std::atoi(next().c_str()), seeds_set = true;
    else if (k == "--steps") a.steps = std::atoll(next().c_str()), a.steps_set = a.steps > 0;
    else if (k == "--wait-while") a.wait_while = next();
    else if (k == "--tokens-per-param") a.tokens_per_param = ParseList<double>(k, next()).at(0), tpp_set = true;
    else if (k == "--dp-lrs") a.dp_lrs = ParseList<double>(k, next());
    else if (k == "--confirm") a.confirm = Count(k, next(), 0, 8);
    else if (k == "--sweep-seeds") a.sweep_seeds = Count(k, next(), 1, 8);
    else if (k == "--finalists") a.finalists = Count(k, next(), 0, 17);
    else if (k == "--frontier-h") a.frontier_h = ParseList<int>(k, next());
    else if (k == "--frontier-seeds") a.frontier_seeds = Count(k, next(), 1, 8);
    else if (k == "--corpora") {
      a.corpora.clear();
      std::stringstream ss(next());
      for (std::string c; std::getline(ss, c, ',');) {
        auto kind = kCorpusNames.Parse(c);
        if (!kind.ok()) {
          std::fprintf(stderr, "bench_fidelity: --corpora: %s\n", std::string(kind.status().message()).c_str());
          std::exit(2);
        }
        a.corpora.push_back(*kind);
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  a.common = ParseCommon(
      static_cast<int>(rest.size()), rest.data(), "fidelity",
      {"parity", "rda", "codecs", "alpha", "weights", "mixed", "scavenging", "budget", "outer", "frontier"}, kUsage);
  if (a.common.quick && !seeds_set) a.seeds = 1;
  if (a.common.quick && !tpp_set) a.tokens_per_param = 0.25;
  if (a.steps <= 0) a.steps = a.common.quick ? 48 : 150;
  if (a.seeds < 1 || a.seeds > 8) {
    std::fprintf(stderr, "bench_fidelity: --seeds must be in [1, 8]\n");
    std::exit(2);
  }
  a.bytes_data = fs::absolute(a.bytes_data).lexically_normal().string();
  return a;
}

// The merged outer-gradient norm of the first and last quarter of a run's rounds (the outer loop
// must average, not amplify: the norm may not grow).
std::pair<double, double> NormTrend(const std::string& dir) {
  std::vector<double> norms;
  for (const auto& l : ReadJsonl(dir + "/metrics-syncer.jsonl")) {
    if (l.value("kind", "") == "round") norms.push_back(Num(l, "merged_norm"));
  }
  if (norms.size() < 8) return {NAN, NAN};
  const size_t q = norms.size() / 4;
  double first = 0, last = 0;
  for (size_t i = 0; i < q; ++i) first += norms[i], last += norms[norms.size() - 1 - i];
  return {first / static_cast<double>(q), last / static_cast<double>(q)};
}

void Driver::Parity() {
  std::vector<std::vector<std::string>> rows = {{"corpus", "data-parallel", "sync DiLoCo", "decoupled", "dec ÷ DP",
                                                 "dec ÷ DiLoCo", "seed spread (dec)",
                                                 "merged norm first→last quarter"}};
  std::vector<atl::sim::Panel> panels;
  Json j = Json::array();
  for (const CorpusKind kind : a_.corpora) {
    if (kind == CorpusKind::kBytes && !EnsureBytesCorpus()) continue;
    const std::string corpus = NameOf(kind);
    const std::string data = " --data " + Quote(DataOf(kind));
    std::vector<Run> dp, dil, dec;
    for (int seed = 0; seed < a_.seeds; ++seed) {
      const std::string s = " --seed " + std::to_string(seed);
      const std::string tag = corpus + "-s" + std::to_string(seed);
      // One process with 2 torch threads: both cores, as the 4 learner processes of the other runs use them.
      dp.push_back(Atoll("parity-dp-" + tag, "train",
                         " --replicas 4 --threads 2" + Shape() + s + data + " --eval-every 25 --log-every 25"));
      dil.push_back(Atoll("parity-diloco-" + tag, "run", " -M 4 --mode diloco -P 1 -H 50" + Shape() + s + data));
      dec.push_back(Atoll("parity-decoupled-" + tag, "run", " -M 4" + Shape() + s + data));
    }
    std::vector<double> r_dp, r_dil;
    for (int i = 0; i < a_.seeds; ++i) {
      r_dp.push_back(Ratio(dec[i].eval_loss, dp[i].eval_loss));
      r_dil.push_back(Ratio(dec[i].eval_loss, dil[i].eval_loss));
    }
    const auto [dec_mean, dec_half] = MeanSpread(dec);
    const auto trend = NormTrend(dec[0].dir);
    rows.push_back({corpus, Cell(dp), Cell(dil), Cell(dec),
                    Fmt(*std::max_element(r_dp.begin(), r_dp.end()), "%.3f") + " (worst seed)",
                    Fmt(*std::max_element(r_dil.begin(), r_dil.end()), "%.3f") + " (worst seed)",
                    Fmt(100 * 2 * dec_half / dec_mean, "%.1f") + " %",
                    Fmt(trend.first, "%.3f") + " → " + Fmt(trend.second, "%.3f")});
    panels.push_back(PanelOf(corpus + " corpus (seed 0)",
                             {{"data-parallel", &dp[0]}, {"sync DiLoCo H=50", &dil[0]}, {"decoupled", &dec[0]}}));
    j.push_back({{"corpus", corpus},
                 {"dp", MeanSpread(dp).first},
                 {"diloco", MeanSpread(dil).first},
                 {"decoupled", dec_mean},
                 {"dec_over_dp", r_dp},
                 {"dec_over_diloco", r_dil},
                 {"decoupled_seed_spread", J(2 * dec_half / dec_mean)},
                 {"norm_first", J(trend.first)},
                 {"norm_last", J(trend.second)}});
  }
  out_["parity"] = j;
  Write("parity", "Parity: eval loss at equal tokens (" + std::to_string(a_.steps) + " steps × 4 learners)", rows,
        panels,
        "Targets: decoupled ÷ data-parallel ≤ 1.02 and ÷ synchronous DiLoCo ≤ 1.02 on every corpus and seed; "
        "two seeds within 2 %; the merged outer-gradient norm does not grow. The paper's own parity numbers "
        "(benchmark average, not loss): data-parallel 64.4, Decoupled DiLoCo 64.1.");
}

void Driver::Rda() {
  if (!EnsureBytesCorpus()) return;
  std::vector<std::vector<std::string>> rows = {{"M", "RDA", "mean", "RDA ÷ mean"}};
  std::vector<atl::sim::Panel> panels;
  for (int m : {2, 4, 8}) {
    const std::string M = " -M " + std::to_string(m);
    auto runs =
        Sweep("rda-M" + std::to_string(m), a_.bytes_data, {{"rda", M + " --merge rda"}, {"mean", M + " --merge mean"}});
    rows.push_back({std::to_string(m), Cell(runs["rda"]), Cell(runs["mean"]),
                    Fmt(Ratio(MeanSpread(runs["rda"]).first, MeanSpread(runs["mean"]).first), "%.3f")});
    panels.push_back(PanelOf("M = " + std::to_string(m), {{"RDA", &runs["rda"][0]}, {"mean", &runs["mean"][0]}}));
  }
  Write("rda", "RDA vs mean as M grows (byte-level corpus)", rows, panels,
        "Each learner trains the same steps, so larger M means more tokens. The paper: RDA keeps the outer step "
        "size independent of M.");
}

void Driver::Codecs() {
  if (!EnsureBytesCorpus()) return;
  // Both ways, plus int4 outer gradients with an int8 downlink (the paper quantises the outer
  // gradients; what learners receive is a separate choice).
  auto runs = Sweep("codecs", a_.bytes_data,
                    {{"int4", " --uplink int4 --downlink int4"},
                     {"int4-int8", " --uplink int4 --downlink int8"},
                     {"int2", " --uplink int2 --downlink int4"},
                     {"bf16", " --uplink bf16 --downlink bf16"},
                     {"fp32", " --uplink fp32 --downlink fp32"}});
  std::vector<std::vector<std::string>> rows = {
      {"on the wire (both ways, or uplink / downlink)", "eval loss", "÷ fp32"}};
  for (const char* c : {"int4", "int4-int8", "int2", "bf16", "fp32"}) {
    const std::string name = c;
    rows.push_back({name == "int4-int8" ? "int4 / int8"
                    : name == "int2"    ? "int2 / int4"
                                        : name,
                    Cell(runs[c]), Fmt(Ratio(MeanSpread(runs[c]).first, MeanSpread(runs["fp32"]).first), "%.3f")});
  }
  Write("codecs", "Codecs on the wire (byte-level corpus)", rows,
        {PanelOf("codecs (seed 0)", {{"int4", &runs["int4"][0]},
                                     {"int2", &runs["int2"][0]},
                                     {"bf16", &runs["bf16"][0]},
                                     {"fp32", &runs["fp32"][0]}})},
        "int2 quantises the outer gradients to three levels per block of 256 (−s, 0, s with s the block's "
        "absmax); its downlink stays int4. The paper: int4 costs almost nothing; 2-bit and 1-bit collapse quality.");
}

void Driver::Alpha() {
  if (!EnsureBytesCorpus()) return;
  auto runs = Sweep("alpha", a_.bytes_data, {{"0", " --alpha 0"}, {"0.5", " --alpha 0.5"}});
  Write("alpha", "Mixing on receipt: alpha = 0 vs 0.5 (byte-level corpus)",
        {{"alpha", "eval loss"}, {"0 (overwrite)", Cell(runs["0"])}, {"0.5 (Streaming DiLoCo)", Cell(runs["0.5"])}},
        {PanelOf("alpha (seed 0)", {{"alpha 0", &runs["0"][0]}, {"alpha 0.5", &runs["0.5"][0]}})},
        "Both keep the steps trained since the send (keep_progress). The paper: overwrite (0) is better as M grows.");
}

void Driver::Weights() {
  if (!EnsureBytesCorpus()) return;
  // Learners of different batch sizes (the same 64 sequences a step in all as the other parts'
  // 4 × 16): each round's contributions weighted by tokens (c_tokens²/c_steps) or equally.
  const std::string b = " -M 4 --batches 24 24 8 8";
  auto runs =
      Sweep("weights", a_.bytes_data, {{"tokens", b + " --weights tokens"}, {"uniform", b + " --weights uniform"}});
  Write("weights", "Token weights vs uniform, learners with batches 24, 24, 8, 8 (byte-level corpus)",
        {{"merge weights", "eval loss", "÷ tokens"},
         {"tokens (c_tokens²/c_steps)", Cell(runs["tokens"]), "1.000"},
         {"uniform", Cell(runs["uniform"]),
          Fmt(Ratio(MeanSpread(runs["uniform"]).first, MeanSpread(runs["tokens"]).first), "%.3f")}},
        {PanelOf("weights (seed 0)", {{"tokens", &runs["tokens"][0]}, {"uniform", &runs["uniform"][0]}})},
        "The paper weights each learner's outer gradient by c_tokens²/c_steps (quantity × quality): a "
        "learner that processed more tokens since it last received the fragment counts more.");
}

void Driver::Mixed() {
  if (!EnsureBytesCorpus()) return;
  const std::string sp = " -M 4 --speeds 1 1 0.5 0.5";
  auto runs =
      Sweep("mixed", a_.bytes_data,
            {{"K=M", sp + " -K 4"}, {"K=1", sp + " -K 1 --grace false"}, {"K=1+grace", sp + " -K 1 --grace true"}});
  std::vector<std::vector<std::string>> rows = {{"quorum", "eval loss", "÷ K=M", "goodput"}};
  for (const char* k : {"K=M", "K=1", "K=1+grace"}) {
    std::vector<double> g;
    for (const auto& r : runs[k]) g.push_back(Num(r.summary, "goodput"));
    rows.push_back({k, Cell(runs[k]), Fmt(Ratio(MeanSpread(runs[k]).first, MeanSpread(runs["K=M"]).first), "%.3f"),
                    Fmt(Median(g), "%.3f")});
  }
  Write("mixed", "Mixed hardware: speeds 1, 1, 0.5, 0.5 (byte-level corpus)", rows,
        {PanelOf("mixed (seed 0)",
                 {{"K=M", &runs["K=M"][0]}, {"K=1", &runs["K=1"][0]}, {"K=1+grace", &runs["K=1+grace"][0]}})},
        "Target: K = 1 + grace eval loss ≤ 1.01 × K = M with goodput ≥ 0.97. The paper: K = all 84 % goodput; "
        "K = 1 100 % but worse quality; K = 1 + grace both.");
}

void Driver::Scavenging() {
  if (!EnsureBytesCorpus()) return;
  // Learners 2 and 3 "arrive" a third of the way in: killed after their first step and started
  // again later (a rejoin from the global model, fresh moments) — the scavenging pattern.
  const std::string runfile = a_.common.out + "/scavenging.toml";
  const double late = a_.common.quick ? 10 : 60;
  std::ofstream(runfile)
      << "[chaos]\nmode = \"events\"\nevents = [ { kind = \"kill\", learner = 2, at_step = 1, duration_s = " << late
      << " }, { kind = \"kill\", learner = 3, at_step = 1, duration_s = " << late << " } ]\n";
  auto runs = Sweep("scavenging", a_.bytes_data,
                    {{"2 learners", " -M 2"}, {"2 + 2 added", " -M 4 -c " + Quote(runfile)}, {"4 learners", " -M 4"}});
  std::vector<std::vector<std::string>> rows = {{"fleet", "eval loss", "tokens merged"}};
  for (const char* k : {"2 learners", "2 + 2 added", "4 learners"}) {
    std::vector<double> t;
    for (const auto& r : runs[k]) t.push_back(Num(r.summary, "tokens_merged"));
    rows.push_back({k, Cell(runs[k]), Fmt(Median(t), "%.0f")});
  }
  Write("scavenging", "Learners added mid-run (byte-level corpus)", rows,
        {PanelOf("scavenging (seed 0)", {{"2 learners", &runs["2 learners"][0]},
                                         {"2 + 2 added", &runs["2 + 2 added"][0]},
                                         {"4 learners", &runs["4 learners"][0]}})},
        "Learners that join late start from the global model and add their tokens; the curve is vs tokens merged.");
}

}  // namespace bench::fidelity

int main(int argc, char** argv) {
  using namespace bench;
  using namespace bench::fidelity;
  Args a = ParseArgs(argc, argv);
  const double t0 = Now();
  CommonArgs common = a.common;
  Driver d(std::move(a));
  if (d.Want("parity")) d.Parity();
  if (d.Want("rda")) d.Rda();
  if (d.Want("codecs")) d.Codecs();
  if (d.Want("alpha")) d.Alpha();
  if (d.Want("weights")) d.Weights();
  if (d.Want("mixed")) d.Mixed();
  if (d.Want("scavenging")) d.Scavenging();
  if (d.Want("budget")) d.Budget();
  if (d.Want("outer")) d.Outer();
  if (d.Want("frontier")) d.Frontier();
  return Finish("fidelity", common, t0, d.failures(), d.out());
}
