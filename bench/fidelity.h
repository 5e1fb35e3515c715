// bench_fidelity's driver (docs/experiments.md): the flags, one finished run, and the Driver
// whose parts run `atoll train` / `atoll run` / `atoll simulate` side by side and write tables and
// curves. bench_fidelity.cc holds the 150-step parts and main, fidelity_budget.cc the parts at the
// compute-optimal budget (budget, outer, frontier). Single-threaded; one run at a time.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>

#include "atoll/core/enum_names.h"
#include "atoll/sim/svg.h"
#include "bench_util.h"

namespace bench::fidelity {

extern const char* kUsage;

// The corpora: the project's (its tokenizer) and the byte-level one (--bytes-data).
enum class CorpusKind { kProject, kBytes };
inline constexpr atl::EnumNames<CorpusKind, 2> kCorpusNames{
    "corpus", {{{CorpusKind::kProject, "project"}, {CorpusKind::kBytes, "bytes"}}}};
inline std::string NameOf(CorpusKind k) { return kCorpusNames.Name(k); }

struct Args {
  CommonArgs common;
  std::string bytes_data = "data-mhcc";
  int seeds = 2;
  int64_t steps = 0;
  bool steps_set = false;
  std::vector<CorpusKind> corpora = {CorpusKind::kProject, CorpusKind::kBytes};
  // The budget parts.
  double tokens_per_param = 20;  // quick: 0.25
  std::vector<double> dp_lrs = {2e-3, 3e-3, 4.5e-3};
  int confirm = 1;      // real `atoll run`s of decoupled per corpus (seeds 0..n-1)
  int sweep_seeds = 1;  // seeds of the quarter-budget outer sweep
  int finalists = 2;    // sweep configurations carried to the full budget
  std::vector<int> frontier_h = {6, 12, 24, 48};
  int frontier_seeds = 1;
  std::string wait_while;  // before each run, wait while this file exists
};

Args ParseArgs(int argc, char** argv);

// One finished run: its final eval loss and its loss-vs-tokens curve.
struct Run {
  std::string name;
  double eval_loss = NAN;
  std::vector<double> tokens, curve;  // eval loss at tokens merged / trained
  Json summary;
  std::string dir;
};

// The merged outer-gradient norm of the first and last quarter of a run's rounds (the outer loop
// must average, not amplify: the norm may not grow).
std::pair<double, double> NormTrend(const std::string& dir);

class Driver {
 public:
  explicit Driver(Args a) : a_(std::move(a)), run_("fidelity", a_.common.out) {
    run_.SetResume(true);
    run_.SetWaitWhile(a_.wait_while);
  }

  // Every part but the budget ones (hours each) runs when no --only is given.
  bool Want(const std::string& part) const {
    return a_.common.only == part ||
           (a_.common.only.empty() && part != "budget" && part != "outer" && part != "frontier");
  }
  int failures() const { return run_.failures(); }
  Json& out() { return out_; }

  void Parity();
  void Rda();
  void Codecs();
  void Alpha();
  void Weights();
  void Mixed();
  void Scavenging();
  // fidelity_budget.cc: the compute-optimal budget (20 tokens per parameter).
  void Budget();
  void Outer();
  void Frontier();

 private:
  std::string Shape() const {
    const bool q = a_.common.quick;
    return " --steps " + std::to_string(a_.steps) + " --seq " + (q ? "128" : "256") + " --batch " + (q ? "8" : "16") +
           " --lr 3e-3 --warmup " + (q ? "5" : "15") + " --eval-batches " + (q ? "8" : "16");
  }
  double Timeout() const { return a_.common.quick ? 1200 : 5400; }
  std::string DataOf(CorpusKind corpus) const { return corpus == CorpusKind::kBytes ? a_.bytes_data : a_.common.data; }

  // The byte-level corpus: Matthew Henry's Concise Commentary (public domain), extracted with
  // diatheke, verse prefixes stripped and the repeated entries of verse ranges dropped.
  bool EnsureBytesCorpus() {
    if (fs::exists(a_.bytes_data + "/data.json")) return true;
    const std::string text = a_.common.out + "/mhcc.txt";
    const std::string extract =
        "diatheke -b MHCC -f plain -k 'Genesis 1:1-Revelation 22:21' 2>/dev/null | "
        "sed -E 's/^[1-3]?[A-Za-z ]+ [0-9]+:[0-9]+: *//' | awk 'NF && !seen[$0]++' > " +
        Quote(text);
    run_.Log("extracting the byte-level corpus (sword-comm-mhcc) to " + text);
    if (RunAndWait("sh -c " + Quote(extract), a_.common.out + "/mhcc-extract.log", 600) != 0 || !fs::exists(text) ||
        fs::file_size(text) < 1'000'000) {
      std::fprintf(stderr, "bench_fidelity: could not extract MHCC (is sword-comm-mhcc installed? scripts/setup)\n");
      run_.CountFailure();
      return false;
    }
    const int rc = RunAndWait(
        Quote(AtollBin()) + " data prepare --tokenizer byte --input " + Quote(text) + " --out " + Quote(a_.bytes_data),
        a_.common.out + "/mhcc-prepare.log", 600);
    if (rc != 0) run_.CountFailure();
    return rc == 0;
  }

  Run Atoll(const std::string& name, const std::string& sub, const std::string& args, double timeout_s = 0) {
    Result r = run_.Atoll(name, sub, args, timeout_s > 0 ? timeout_s : Timeout());
    Run out{name, Num(r.summary, "eval_loss"), {}, {}, r.summary, r.dir};
    if (sub == "train") {
      for (const auto& l : ReadJsonl(r.dir + "/metrics.jsonl")) {
        if (l.value("kind", "") != "eval") continue;
        out.tokens.push_back(Num(l, "tokens"));
        out.curve.push_back(Num(l, "eval_loss"));
      }
    } else {
      out.tokens.push_back(0);
      out.curve.push_back(Num(r.summary, "eval_loss_start"));
      for (const auto& e : r.summary.value("global_eval_curve", Json::array())) {
        out.tokens.push_back(Num(e, "tokens_merged"));
        out.curve.push_back(Num(e, "eval_loss"));
      }
      out.tokens.push_back(Num(r.summary, "tokens_merged"));
      out.curve.push_back(out.eval_loss);
    }
    return out;
  }

  // Decoupled (or any `atoll run`) configurations over the seeds; returns runs[config][seed].
  std::map<std::string, std::vector<Run>> Sweep(const std::string& part, const std::string& data,
                                                const std::vector<std::pair<std::string, std::string>>& configs) {
    std::map<std::string, std::vector<Run>> runs;
    for (int seed = 0; seed < a_.seeds; ++seed) {
      for (const auto& [name, flags] : configs) {
        runs[name].push_back(Atoll(part + "-" + name + "-s" + std::to_string(seed), "run",
                                   flags + Shape() + " --seed " + std::to_string(seed) + " --data " + Quote(data)));
      }
    }
    return runs;
  }

  // Mean and half-range of the runs' eval losses ("2.345 ± 0.012").
  static std::pair<double, double> MeanSpread(const std::vector<Run>& runs) {
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    int n = 0;
    for (const auto& r : runs) {
      if (!std::isfinite(r.eval_loss)) continue;
      lo = std::min(lo, r.eval_loss), hi = std::max(hi, r.eval_loss), sum += r.eval_loss, ++n;
    }
    if (n == 0) return {NAN, NAN};
    return {sum / n, (hi - lo) / 2};
  }
  static std::string Cell(const std::vector<Run>& runs) {
    auto [m, s] = MeanSpread(runs);
    return Fmt(m, "%.4f") + (runs.size() > 1 ? " ± " + Fmt(s, "%.4f") : "");
  }

  // A markdown table; the first row is the header.
  static std::string Table(const std::vector<std::vector<std::string>>& rows) {
    std::string md;
    for (size_t k = 0; k < rows.size(); ++k) {
      md += "|";
      for (const auto& c : rows[k]) md += " " + c + " |";
      md += "\n";
      if (k == 0)
        md += "|" + [&] {
          std::string s;
          for (size_t i = 0; i < rows[0].size(); ++i) s += "---|";
          return s;
        }() + "\n";
    }
    return md;
  }
  // Writes <out>/<part>.md (title, body) and prints it.
  void WriteMd(const std::string& part, const std::string& title, const std::string& body) {
    const std::string md = "# " + title + "\n\n" + body;
    std::ofstream(a_.common.out + "/" + part + ".md") << md;
    std::printf("\n%s\n", md.c_str());
    std::fflush(stdout);
  }
  // Writes <out>/<part>.md (the table) and <out>/<part>.svg (loss vs tokens, first seed).
  void Write(const std::string& part, const std::string& title, const std::vector<std::vector<std::string>>& rows,
             const std::vector<atl::sim::Panel>& panels, const std::string& notes) {
    if (!panels.empty()) std::ofstream(a_.common.out + "/" + part + ".svg") << atl::sim::RenderSvg(title, panels);
    WriteMd(part, title, Table(rows) + "\n" + notes + "\n");
  }

  static atl::sim::Series SeriesOf(const std::string& name, const Run& r) {
    atl::sim::Series s{name, {}, {}, {}};
    for (size_t i = 0; i < r.tokens.size(); ++i) {
      if (std::isfinite(r.tokens[i]) && std::isfinite(r.curve[i]))
        s.x.push_back(r.tokens[i]), s.y.push_back(r.curve[i]);
    }
    return s;
  }
  static atl::sim::Panel PanelOf(const std::string& title,
                                 const std::vector<std::pair<std::string, const Run*>>& runs) {
    atl::sim::Panel p;
    p.title = title;
    p.x_label = "tokens";
    p.y_label = "eval loss";
    for (const auto& [name, r] : runs) {
      if (r != nullptr) p.series.push_back(SeriesOf(name, *r));
    }
    return p;
  }

  // fidelity_budget.cc
  struct Corpus;
  std::optional<Corpus> CorpusAt(CorpusKind kind);
  // Calls part on each of --corpora whose data is ready.
  void EachCorpus(const std::function<void(const Corpus&)>& part);
  std::string ShapeAt(int64_t steps) const;
  double TimeoutAt(int64_t steps) const;
  Run Dp(const Corpus& c, double lr, int64_t steps, int seed);
  Run Sim(const Corpus& c, const std::string& tag, const std::string& flags, int64_t steps, int seed);
  Run Real(const Corpus& c, const std::string& tag, const std::string& flags, int64_t steps, int seed);
  double TunedDpLr(const Corpus& c, std::vector<std::vector<std::string>>* grid_rows);
  void BudgetCorpus(const Corpus& c, std::string& md, Json& j);
  void OuterCorpus(const Corpus& c, std::string& md, Json& j);
  std::string ShortCheck(const std::string& tag, const std::string& flags, const std::string& name, Json& j);
  void FrontierCorpus(const Corpus& c, std::string& md, Json& j, std::vector<atl::sim::Panel>& panels);

  Args a_;
  Runner run_;
  Json out_ = Json::object();
};

}  // namespace bench::fidelity
