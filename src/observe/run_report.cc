#include "atoll/observe/run_report.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "atoll/core/file.h"
#include "atoll/core/format.h"
#include "atoll/observe/prometheus.h"
#include "atoll/sim/svg.h"

namespace atl::observe {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

double Num(const json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

sim::Panel MakePanel(std::string title, std::string x_label, std::string y_label) {
  sim::Panel p;
  p.title = std::move(title);
  p.x_label = std::move(x_label);
  p.y_label = std::move(y_label);
  return p;
}

// A line averaged down to at most `max_points` (consecutive points in equal groups).
sim::Series Line(std::string name, const std::vector<double>& x, const std::vector<double>& y,
                 size_t max_points = 300) {
  sim::Series s;
  s.name = std::move(name);
  const size_t n = std::min(x.size(), y.size());
  const size_t group = std::max<size_t>(1, (n + max_points - 1) / max_points);
  for (size_t i = 0; i < n; i += group) {
    const size_t end = std::min(n, i + group);
    double sx = 0, sy = 0;
    for (size_t k = i; k < end; ++k) sx += x[k], sy += y[k];
    s.x.push_back(sx / static_cast<double>(end - i));
    s.y.push_back(sy / static_cast<double>(end - i));
  }
  return s;
}

// One learner's step records (all incarnations), times relative to the run's start.
struct LearnerTrace {
  std::vector<double> t, loss;
};

// The cumulative totals across learners after each step record, in time order.
struct Totals {
  std::vector<double> t, trained, wire, dp;
};

struct ClusterRun {
  double t0 = 0;
  std::map<int, LearnerTrace> learners;
  std::vector<json> rounds, evals, faults;
  Totals totals;
  json summary = json::object();
};

// Learner ids with a metrics-learner-<m>.jsonl in the folder.
std::vector<int> LearnerFiles(const std::string& dir) {
  std::vector<int> ids;
  const std::regex name("metrics-learner-([0-9]+)\\.jsonl");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string f = e.path().filename().string();
    if (std::regex_match(f, m, name)) ids.push_back(std::stoi(m[1]));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// Sweeps every learner's step records in time order: tokens trained (Σ step tokens), bytes on the
// wire (each incarnation's counter starts at 0 again) and what data-parallel would have moved
// for the steps taken (Σ latest step × params × 4 bytes).
Totals SweepTotals(const std::map<int, std::vector<json>>& steps, double t0, double params) {
  std::vector<std::pair<double, std::pair<int, const json*>>> events;
  for (const auto& [id, lines] : steps) {
    for (const auto& l : lines) events.push_back({Num(l, "t"), {id, &l}});
  }
  std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::map<int, double> wire_raw, step_of;
  Totals out;
  double trained = 0, wire = 0, steps_total = 0;
  for (const auto& [t, e] : events) {
    const auto& [id, l] = e;
    trained += Num(*l, "step_tokens");
    const double raw = Num(*l, "wire_bytes_up") + Num(*l, "wire_bytes_down");
    wire += raw >= wire_raw[id] ? raw - wire_raw[id] : raw;  // smaller: a new incarnation's counter
    wire_raw[id] = raw;
    steps_total += std::max(0.0, Num(*l, "step") - step_of[id]);
    step_of[id] = Num(*l, "step");
    out.t.push_back(t - t0);
    out.trained.push_back(trained);
    out.wire.push_back(wire);
    out.dp.push_back(steps_total * params * 4.0);
  }
  return out;
}

json ReadSummary(const std::string& dir) {
  auto text = ReadFile(dir + "/summary.json");
  json s = text.ok() ? json::parse(*text, nullptr, false) : json();
  if (s.is_object()) return s;
  text = ReadFile(dir + "/syncer-summary.json");
  s = text.ok() ? json::parse(*text, nullptr, false) : json();
  if (!s.is_object()) return json::object();
  AddDerived(s);  // tokens, goodput and data-parallel bytes as the live views show them
  s["learners"] = s.value("learners", json::array()).size();
  return s;
}

ClusterRun ReadCluster(const std::string& dir) {
  ClusterRun r;
  r.summary = ReadSummary(dir);
  double t0 = 1e300;
  for (auto& l : ReadJsonLines(dir + "/metrics-syncer.jsonl")) {
    t0 = std::min(t0, Num(l, "t", t0));
    const std::string kind = l.value("kind", "");
    if (kind == "round") r.rounds.push_back(std::move(l));
    if (kind == "global_eval") r.evals.push_back(std::move(l));
  }
  std::map<int, std::vector<json>> steps;
  for (int id : LearnerFiles(dir)) {
    for (auto& l : ReadJsonLines(dir + "/metrics-learner-" + std::to_string(id) + ".jsonl")) {
      if (l.contains("kind")) continue;  // "contributed" events
      t0 = std::min(t0, Num(l, "t", t0));
      steps[id].push_back(std::move(l));
    }
  }
  r.faults = ReadJsonLines(dir + "/faults.jsonl");
  r.t0 = t0 < 1e300 ? t0 : 0;
  for (const auto& [id, lines] : steps) {
    LearnerTrace& tr = r.learners[id];
    for (const auto& l : lines) {
      tr.t.push_back(Num(l, "t") - r.t0);
      tr.loss.push_back(Num(l, "loss"));
    }
  }
  r.totals = SweepTotals(steps, r.t0, Num(r.summary, "params"));
  return r;
}

std::vector<sim::Marker> FaultMarkers(const ClusterRun& r) {
  std::vector<sim::Marker> out;
  for (const auto& f : r.faults) {
    std::string label = f.value("kind", "fault");
    if (f.contains("learner")) label += " " + std::to_string(f.value("learner", -1));
    out.push_back({Num(f, "t") - r.t0, label});
  }
  return out;
}

// The global model's eval loss: at the start (0 tokens merged, t = 0), during the run, and the
// final one (at the end of the time axis).
sim::Series GlobalEval(const ClusterRun& r, bool by_tokens) {
  std::vector<double> x, y;
  if (r.summary.contains("eval_loss_start")) x.push_back(0), y.push_back(Num(r.summary, "eval_loss_start"));
  for (const auto& e : r.evals) {
    x.push_back(by_tokens ? Num(e, "tokens_merged") : Num(e, "t") - r.t0);
    y.push_back(Num(e, "eval_loss"));
  }
  if (r.summary.contains("eval_loss") && r.summary["eval_loss"].is_number() && !r.totals.t.empty()) {
    x.push_back(by_tokens ? Num(r.summary, "tokens_merged") : r.totals.t.back());
    y.push_back(Num(r.summary, "eval_loss"));
  }
  sim::Series s = Line("global model (eval)", x, y);
  return s;
}

// Tokens trained by all learners together up to time t (relative to the run's start).
double TrainedAt(const Totals& totals, double t) {
  const auto it = std::upper_bound(totals.t.begin(), totals.t.end(), t);
  return it == totals.t.begin() ? 0.0 : totals.trained[static_cast<size_t>(it - totals.t.begin()) - 1];
}

std::vector<sim::Panel> LossPanels(const ClusterRun& r) {
  sim::Panel by_tokens =
      MakePanel("Loss vs tokens", "tokens (learners: all trained so far; global: merged)", "loss (nats/token)");
  sim::Panel by_time = MakePanel("Loss vs time (dashed: faults)", "seconds since the run started", "loss (nats/token)");
  for (const auto& [id, tr] : r.learners) {
    std::vector<double> run_tokens;
    for (double t : tr.t) run_tokens.push_back(TrainedAt(r.totals, t));
    by_tokens.series.push_back(Line("learner " + std::to_string(id) + " (train)", run_tokens, tr.loss));
    by_time.series.push_back(Line("learner " + std::to_string(id) + " (train)", tr.t, tr.loss));
  }
  by_tokens.series.push_back(GlobalEval(r, true));
  by_time.series.push_back(GlobalEval(r, false));
  by_time.markers = FaultMarkers(r);
  return {by_tokens, by_time};
}

std::vector<sim::Panel> ProgressPanels(const ClusterRun& r) {
  sim::Panel tokens = MakePanel("Tokens trained vs merged (goodput)", "seconds since the run started", "tokens");
  tokens.series.push_back(Line("trained (all learners)", r.totals.t, r.totals.trained));
  std::vector<double> t, merged;
  double m = 0;
  for (const auto& round : r.rounds) {
    m += Num(round, "tokens_merged");
    t.push_back(Num(round, "t") - r.t0);
    merged.push_back(m);
  }
  tokens.series.push_back(Line("merged into the global model", t, merged));
  tokens.markers = FaultMarkers(r);
  sim::Panel bytes =
      MakePanel("Bytes on the wire vs data-parallel", "seconds since the run started", "bytes (cumulative)");
  bytes.series.push_back(Line("atoll (up + down)", r.totals.t, r.totals.wire));
  bytes.series.push_back(Line("data-parallel, same steps (bf16)", r.totals.t, r.totals.dp));
  return {tokens, bytes};
}

std::vector<sim::Panel> RoundPanels(const ClusterRun& r) {
  std::vector<double> n, contributors, grace;
  for (const auto& round : r.rounds) {
    n.push_back(static_cast<double>(n.size() + 1));
    contributors.push_back(static_cast<double>(round.value("contributors", json::array()).size()));
    grace.push_back(Num(round, "grace_s"));
  }
  sim::Panel c = MakePanel("Contributors per round", "round (in commit order)", "learners merged");
  c.series.push_back(Line("contributors", n, contributors));
  sim::Panel g = MakePanel("Grace window per round", "round (in commit order)", "seconds");
  g.series.push_back(Line("grace", n, grace));
  return {c, g};
}

// The run's numbers for people, from the summary (only what it holds).
std::string FactsTable(const json& s) {
  std::vector<std::pair<std::string, std::string>> rows;
  auto add = [&](const char* key, const std::string& label, const std::function<std::string(double)>& fmt) {
    if (s.contains(key) && s[key].is_number()) rows.push_back({label, fmt(s[key].get<double>())});
  };
  const auto count = [](double v) { return GroupedRound(v); };
  const auto fixed3 = [](double v) { return fmt::format("{:.3f}", v); };
  const auto fixed4 = [](double v) { return fmt::format("{:.4f}", v); };
  if (s.contains("mode")) rows.push_back({"mode", s.value("mode", "")});
  add("learners", "learners", count);
  add("rounds", "rounds committed", count);
  add("wall_seconds", "wall time", [](double v) { return fmt::format("{:.1f} s", v); });
  add("eval_loss_start", "eval loss of the initial model", fixed4);
  add("eval_loss", "eval loss of the final model", fixed4);
  add("tokens_trained", "tokens trained", count);
  add("tokens_merged", "tokens merged into the global model", count);
  add("goodput", "goodput", fixed3);
  add("uptime", "uptime", fixed3);
  const double wire = Num(s, "bytes_up") + Num(s, "bytes_down");
  if (wire > 0) rows.push_back({"bytes on the wire", HumanBytes(wire)});
  if (Num(s, "dp_equivalent_bytes") > 0 && wire > 0) {
    rows.push_back(
        {"data-parallel would have moved", fmt::format("{} ({:.1f}x more)", HumanBytes(Num(s, "dp_equivalent_bytes")),
                                                       Num(s, "dp_equivalent_bytes") / wire)});
  }
  if (s.contains("faults") && s["faults"].is_array())
    rows.push_back({"faults injected", std::to_string(s["faults"].size())});
  std::string html = "<table>\n";
  for (const auto& [k, v] : rows)
    html += "<tr><th>" + sim::EscapeXml(k) + "</th><td>" + sim::EscapeXml(v) + "</td></tr>\n";
  return html + "</table>\n";
}

// An SVG document inline in HTML: without its XML declaration.
std::string Inline(const std::string& svg) {
  const auto at = svg.find("<svg");
  return "<figure>" + (at == std::string::npos ? svg : svg.substr(at)) + "</figure>\n";
}

std::string Page(const std::string& title, const json& summary, const std::vector<std::string>& svgs) {
  std::string html = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" +
                     sim::EscapeXml(title) +
                     "</title>\n<style>body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#111}"
                     "table{border-collapse:collapse}th,td{border:1px solid #ddd;padding:.25em .7em;text-align:left}"
                     "th{background:#f4f4f4;font-weight:normal}figure{margin:1.5em 0}</style></head><body>\n<h1>" +
                     sim::EscapeXml(title) + "</h1>\n" + FactsTable(summary);
  for (const auto& svg : svgs) html += Inline(svg);
  return html + "</body></html>\n";
}

StatusOr<ReportResult> ClusterReport(const std::string& dir) {
  const ClusterRun r = ReadCluster(dir);
  const std::string name = fs::path(dir).lexically_normal().filename().string();
  std::vector<std::string> svgs = {sim::RenderSvg("run " + name + ": loss", LossPanels(r)),
                                   sim::RenderSvg("run " + name + ": progress and bytes", ProgressPanels(r)),
                                   sim::RenderSvg("run " + name + ": rounds", RoundPanels(r))};
  ReportResult out{dir + "/report.html", "atoll run", static_cast<int>(svgs.size())};
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out.path, Page("atoll run " + name, r.summary, svgs)));
  return out;
}

StatusOr<ReportResult> TrainReport(const std::string& dir, const std::vector<json>& lines) {
  std::vector<double> tokens, loss, elapsed, eval_tokens, eval_loss, eval_t;
  std::map<int64_t, double> elapsed_at_step;
  for (const auto& l : lines) {
    if (l.value("kind", "") == "train") {
      tokens.push_back(Num(l, "tokens"));
      loss.push_back(Num(l, "loss"));
      elapsed.push_back(Num(l, "elapsed"));
      elapsed_at_step[l.value("step", int64_t{0})] = Num(l, "elapsed");
    } else if (l.value("kind", "") == "eval") {
      eval_tokens.push_back(Num(l, "tokens"));
      eval_loss.push_back(Num(l, "eval_loss"));
      auto it = elapsed_at_step.upper_bound(l.value("step", int64_t{0}));
      eval_t.push_back(it == elapsed_at_step.begin() ? 0.0 : std::prev(it)->second);
    }
  }
  sim::Panel by_tokens = MakePanel("Loss vs tokens", "tokens trained", "loss (nats/token)");
  by_tokens.series = {Line("train", tokens, loss), Line("eval", eval_tokens, eval_loss)};
  sim::Panel by_time = MakePanel("Loss vs time", "seconds since the run started", "loss (nats/token)");
  by_time.series = {Line("train", elapsed, loss), Line("eval", eval_t, eval_loss)};
  const std::string name = fs::path(dir).lexically_normal().filename().string();
  const std::vector<std::string> svgs = {sim::RenderSvg("atoll train " + name, {by_tokens, by_time})};
  ReportResult out{dir + "/report.html", "atoll train", 1};
  auto text = ReadFile(dir + "/summary.json");
  const json summary = text.ok() ? json::parse(*text, nullptr, false) : json::object();
  ATOLL_RETURN_IF_ERROR(
      WriteFileAtomic(out.path, Page("atoll train " + name, summary.is_object() ? summary : json::object(), svgs)));
  return out;
}

}  // namespace

std::vector<json> ReadJsonLines(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

StatusOr<ReportResult> WriteRunReport(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return NotFoundError("no run folder at " + run_dir);
  if (FileExists(run_dir + "/metrics-syncer.jsonl") || !LearnerFiles(run_dir).empty()) return ClusterReport(run_dir);
  const auto lines = ReadJsonLines(run_dir + "/metrics.jsonl");
  const bool train =
      std::any_of(lines.begin(), lines.end(), [](const json& l) { return l.value("kind", "") == "train"; });
  if (train) return TrainReport(run_dir, lines);
  return NotFoundError("no metrics in " + run_dir +
                       " (expected an atoll run folder with metrics-syncer.jsonl / metrics-learner-<m>.jsonl, "
                       "or an atoll train folder with metrics.jsonl)");
}

}  // namespace atl::observe
