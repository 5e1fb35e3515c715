#include "report.h"

#include <algorithm>
#include <map>
#include <cstdio>
#include <fstream>
#include <fmt/format.h>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/runtime/export.h"
#include "atoll/runtime/accounting.h"
#include "atoll/core/format.h"
#include "atoll/observe/run_report.h"
#include "cluster.h"

namespace atl::runtime {
namespace {

std::string Bytes(double b) { return HumanBytes(b); }

double Num(const nlohmann::json& j, const char* key, double fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

// [4.47105884552, null] → "4.5 s, none (no contribution after that restart)".
// "5.3 s (process load 4.2 s, then join 0.16 s, first step 0.39 s, first push 0.35 s)" per
// restart; `stages` (same length, objects or null) may be empty.
std::string SecondsList(const nlohmann::json& list, const nlohmann::json& stages) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!out.empty()) out += ", ";
    if (!list[i].is_number()) {
      out += "none (no contribution after that restart)";
      continue;
    }
    out += fmt::format("{:.1f} s", list[i].get<double>());
    const nlohmann::json st = i < stages.size() ? stages[i] : nlohmann::json();
    if (!st.is_object() || !st.contains("load")) continue;
    out += fmt::format(" (process load {:.1f} s, then", Num(st, "load"));
    const char* sep = " ";
    for (const char* k : {"join", "first_step", "first_push"}) {
      std::string label(k);
      std::replace(label.begin(), label.end(), '_', ' ');
      out += fmt::format("{}{} {:.2f} s", sep, label, Num(st, k));
      sep = ", ";
    }
    out += ")";
  }
  return out;
}

}  // namespace

void ProgressView::Draw(const nlohmann::json& st, double t) {
  std::string out;
  const auto& ls = st.value("learners", nlohmann::json::array());
  int64_t params_hint = 0;
  (void)params_hint;
  double steps = 0;
  for (const auto& l : ls) steps += Num(l, "step");
  // What synchronous data-parallel would have moved by now: bf16 gradient up and down per step.
  const double dp = steps * Num(st, "params") * 4.0;
  out += fmt::format(
      "t={:5.0f}s  rounds {:6}  on the wire up {:>9} down {:>9} (data-parallel: {:>9})  t_step {:.2f}s  live {}\n", t,
      st.value("rounds", 0), Bytes(Num(st, "bytes_up")), Bytes(Num(st, "bytes_down")), Bytes(dp), Num(st, "t_step_s"),
      st.value("live", nlohmann::json::array()).size());
  // The global model beside the learners' own training losses: does it keep up?
  if (st.contains("global_eval_loss")) {
    double sum = 0;
    int n = 0;
    for (const auto& l : ls) {
      if (Num(l, "loss") > 0) sum += Num(l, "loss"), ++n;
    }
    out += fmt::format("  global model: eval loss {:7.4f} (round {})   learners' mean training loss {:7.4f}\n",
                       Num(st, "global_eval_loss"), st.value("global_eval_rounds", int64_t{0}), n ? sum / n : 0.0);
  }
  for (const auto& l : ls) {
    const bool silent = Num(l, "seconds_since_seen") > config_.learner_timeout &&
                        l.value("state", "") != syncer::LearnerStateName(syncer::LearnerState::kDone);
    out += fmt::format(
        "  learner {:2}  {:9}  step {:5}/{:<5}  {:7.0f} tok/s  loss {:7.4f}  rounds {:5}  version {:5}  joins {}\n",
        l.value("id", -1), silent ? "silent" : l.value("state", "?"), l.value("step", 0), config_.steps,
        Num(l, "tokens_per_second"), Num(l, "loss"), l.value("rounds_joined", 0), l.value("version_held", int64_t{-1}),
        l.value("joins", 0));
  }
  if (redraw_) {
    if (lines_drawn_ > 0) std::printf("\033[%dA", lines_drawn_);
    std::string cleared;
    for (char ch : out) {
      if (ch == '\n') cleared += "\033[K";
      cleared += ch;
    }
    std::fputs(cleared.c_str(), stdout);
    lines_drawn_ = static_cast<int>(std::count(out.begin(), out.end(), '\n'));
  } else if (t - last_line_ >= 10.0) {
    std::fputs(out.c_str(), stdout);
    last_line_ = t;
  }
  std::fflush(stdout);
}

void ProgressView::DrawLine(double t, const std::string& line) {
  if (redraw_) {
    std::printf("\r\033[Kt=%5.0fs  %s\n", t, line.c_str());
    lines_drawn_ = 0;
  } else if (t - last_line_ >= 10.0) {
    std::printf("t=%5.0fs  %s\n", t, line.c_str());
    last_line_ = t;
  }
  std::fflush(stdout);
}

namespace {

// What the learners' own summaries add up to.
struct LearnerTotals {
  int64_t tokens = 0, steps = 0;
  double merged = 0, up = 0, down = 0, payload_up = 0, payload_down = 0;
};

// Learner i's row of the summary: its own summary file (if it finished) and the syncer's view
// of it (if it joined), both added to the totals.
nlohmann::json LearnerRow(const RunConfig& c, int i, const nlohmann::json* syncer_row, LearnerTotals& t) {
  nlohmann::json row = {{"learner", i}};
  auto text = ReadFile(c.out + "/learner-" + std::to_string(i) + ".json");
  const auto l = text.ok() ? nlohmann::json::parse(*text, nullptr, false) : nlohmann::json();
  if (!text.ok()) {
    row["error"] = "no learner summary (the learner did not finish)";
  } else if (!l.is_discarded()) {
    for (const char* key : {"tokens", "steps", "pushes", "checksum_mismatches"}) row[key] = l.value(key, 0);
    for (const char* key : {"payload_bytes_up", "payload_bytes_down"}) row[key] = l.value(key, 0);
    row["bytes_up"] = l.value("wire_bytes_up", 0);
    row["bytes_down"] = l.value("wire_bytes_down", 0);
    row["tokens_per_second"] = Num(l, "tokens_per_second");
    row["first_contribution_s"] = Num(l, "first_contribution_s", -1);
    row["barrier_wait_seconds"] = Num(l, "barrier_wait_seconds");
    row["speed"] = Num(l, "speed", 1);
    t.tokens += l.value("tokens", int64_t{0});
    t.steps += l.value("steps", int64_t{0});
    t.up += Num(l, "wire_bytes_up");
    t.down += Num(l, "wire_bytes_down");
    t.payload_up += Num(l, "payload_bytes_up");
    t.payload_down += Num(l, "payload_bytes_down");
  }
  if (syncer_row != nullptr) {
    row["rounds_joined"] = syncer_row->value("rounds_joined", 0);
    row["tokens_merged"] = Num(*syncer_row, "tokens_merged");
    row["late_folded"] = syncer_row->value("late_folded", 0);
    row["joins"] = syncer_row->value("joins", 0);
    t.merged += Num(*syncer_row, "tokens_merged");
  }
  return row;
}

}  // namespace

nlohmann::json BuildRunSummary(const RunConfig& c, const nlohmann::json& syncer, double wall) {
  nlohmann::json s;
  s["mode"] = diloco::ModeName(c.mode);
  s["learners"] = c.learners;
  s["fragments"] = c.fragments;
  s["H"] = c.H;
  s["tau"] = c.tau;
  s["quorum"] = c.quorum;
  s["grace"] = c.grace;
  s["uplink"] = diloco::EncodingName(c.uplink);
  s["downlink"] = diloco::EncodingName(c.downlink);
  s["preset"] = c.preset;
  s["wall_seconds"] = wall;
  const double params = Num(syncer, "params");
  s["params"] = params;
  s["rounds"] = syncer.value("rounds", 0);
  s["eval_loss"] = syncer.contains("eval_loss") ? syncer["eval_loss"] : nlohmann::json(nullptr);
  s["eval_loss_start"] = syncer.contains("eval_loss_start") ? syncer["eval_loss_start"] : nlohmann::json(nullptr);
  s["global_eval_curve"] = syncer.value("global_eval_curve", nlohmann::json::array());
  s["theta_checksum"] = syncer.value("theta_checksum", "");
  if (syncer.contains("shards")) {  // a sharded syncer: the versions its shards' states combine to
    s["syncer_shards"] = syncer["shards"];
    s["versions"] = syncer.value("versions", nlohmann::json::array());
  }
  std::map<int, nlohmann::json> syncer_rows;
  for (const auto& l : syncer.value("learners", nlohmann::json::array())) syncer_rows[l.value("id", -1)] = l;
  LearnerTotals t;
  nlohmann::json per = nlohmann::json::array();
  for (int i = 0; i < c.learners; ++i) {
    auto it = syncer_rows.find(i);
    per.push_back(LearnerRow(c, i, it == syncer_rows.end() ? nullptr : &it->second, t));
  }
  s["tokens_trained"] = t.tokens;
  s["tokens_merged"] = t.merged;
  s["tokens_per_second"] = wall > 0 ? static_cast<double>(t.tokens) / wall : 0.0;
  s["bytes_up"] = t.up;
  s["bytes_down"] = t.down;
  s["payload_bytes_up"] = t.payload_up;
  s["payload_bytes_down"] = t.payload_down;
  // What synchronous data-parallel would have moved for the same learner-steps: every step each
  // learner sends its full gradient and receives the average, bf16 both ways.
  s["dp_equivalent_bytes"] = static_cast<double>(t.steps) * params * 2.0 * 2.0;
  s["per_learner"] = per;
  return s;
}

void MergeMetrics(const RunConfig& c) {
  std::vector<std::pair<double, std::string>> lines;
  auto slurp = [&](const std::string& path) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;  // a line cut by a kill
      lines.emplace_back(Num(j, "t"), line);
    }
  };
  slurp(c.out + "/metrics-syncer.jsonl");
  for (int k = 0; c.syncer_shards > 1 && k < c.syncer_shards; ++k) {  // a sharded syncer: each shard's folder
    slurp(c.out + "/syncer-" + std::to_string(k) + "/metrics-syncer.jsonl");
  }
  for (int i = 0; i < c.learners; ++i) slurp(c.out + "/metrics-learner-" + std::to_string(i) + ".jsonl");
  std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string text;
  for (const auto& [t, line] : lines) text += line + "\n";
  (void)WriteFileAtomic(c.out + "/metrics.jsonl", text);
}

namespace {

// The event records of a run folder: every learner's steps and contributions, the syncer's rounds.
// A learner process's first accepted contribution: when, and its start-up in stages.
struct Contributed {
  double t;
  nlohmann::json startup_s;
};

std::vector<LearnerRecordOfRun> ReadLearnerRecords(const RunConfig& c, Cluster& cluster, const nlohmann::json& per,
                                                   std::vector<std::vector<Contributed>>& contributed) {
  std::vector<LearnerRecordOfRun> records(static_cast<size_t>(c.learners));
  contributed.assign(static_cast<size_t>(c.learners), {});
  for (int i = 0; i < c.learners; ++i) {
    auto& r = records[static_cast<size_t>(i)];
    for (const auto& l : observe::ReadJsonLines(c.out + "/metrics-learner-" + std::to_string(i) + ".jsonl")) {
      if (l.value("kind", "") == "contributed") {
        contributed[static_cast<size_t>(i)].push_back({Num(l, "t"), l.value("startup_s", nlohmann::json())});
      } else {
        r.steps.push_back({Num(l, "t"), Num(l, "step_s"), Num(l, "step_tokens")});
      }
    }
    r.tokens_merged = Num(per[static_cast<size_t>(i)], "tokens_merged");
    r.finished = cluster.learners()[static_cast<size_t>(i)].state == ProcessState::kDone;
  }
  return records;
}

std::map<int, std::vector<double>> ReadRoundCloses(const RunConfig& c) {
  std::map<int, std::vector<double>> closes;
  for (const auto& l : observe::ReadJsonLines(c.out + "/metrics-syncer.jsonl")) {
    if (l.value("kind", "") == "round") closes[l.value("fragment", -1)].push_back(Num(l, "t"));
  }
  return closes;
}

// Restart → first accepted contribution after it, per restart (null: none followed), into
// row["restart_to_first_contribution_s"], and that process's start-up stages into
// row["restart_startup_s"] (load, data, model, connect, join, first_step, first_push, total).
void AddRejoinLatencies(const LearnerSlot& slot, const std::vector<Contributed>& contributed, double t0,
                        nlohmann::json& row) {
  nlohmann::json rejoin = nlohmann::json::array(), stages = nlohmann::json::array();
  for (double r : slot.restarted_at) {
    const double abs_r = t0 + r;
    auto it = std::find_if(contributed.begin(), contributed.end(), [&](const Contributed& x) { return x.t >= abs_r; });
    rejoin.push_back(it == contributed.end() ? nlohmann::json(nullptr) : nlohmann::json(it->t - abs_r));
    stages.push_back(it == contributed.end() ? nlohmann::json(nullptr) : it->startup_s);
  }
  row["restart_to_first_contribution_s"] = rejoin;
  row["restart_startup_s"] = stages;
}

}  // namespace

void AddAccounting(const RunConfig& c, Cluster& cluster, double t0, double wall, nlohmann::json& s) {
  nlohmann::json& per = s["per_learner"];
  std::vector<std::vector<Contributed>> contributed;
  const RunAccounting run = AccountGoodput(ReadLearnerRecords(c, cluster, per, contributed));
  for (int i = 0; i < c.learners; ++i) {
    const LearnerAccounting& a = run.learners[static_cast<size_t>(i)];
    const LearnerSlot& slot = cluster.learners()[static_cast<size_t>(i)];
    nlohmann::json& row = per[static_cast<size_t>(i)];
    row["tokens_computed"] = a.tokens_computed;
    row["tokens_lost"] = a.tokens_lost;
    row["seconds_training"] = a.seconds_training;
    row["seconds_dead"] = slot.dead_seconds + (slot.state == ProcessState::kDown ? (wall - slot.down_since) : 0.0);
    row["seconds_paused"] = slot.paused_seconds;
    row["seconds_alive"] = wall - Num(row, "seconds_dead") - slot.paused_seconds;
    row["useful_seconds"] = a.useful_seconds;
    row["seconds_allocated"] = a.seconds_allocated;
    row["incarnations"] = slot.incarnations;
    AddRejoinLatencies(slot, contributed[static_cast<size_t>(i)], t0, row);
  }
  s["training_window_seconds"] = std::max(1e-9, run.window_seconds());
  s["allocated_learner_seconds"] = run.allocated_seconds;
  // Every incarnation's tokens (a killed learner's summary file is never written).
  s["tokens_trained"] = run.tokens_computed;
  s["tokens_per_second"] = wall > 0 ? run.tokens_computed / wall : 0.0;
  s["goodput"] = run.goodput;
  s["uptime"] = Uptime(ReadRoundCloses(c), c.fragments, c.H, run);
  s["faults"] = cluster.fault_log();
  s["chaos"] = chaos::ToJson(c.chaos);
}

std::string FormatReport(const nlohmann::json& s) {
  std::string r = "\n== atoll run report ==\n";
  r += fmt::format("mode {}  learners {}  fragments {}  rounds {}  wall {:.1f}s\n", s.value("mode", "?"),
                   s.value("learners", 0), s.value("fragments", 0), s.value("rounds", 0), Num(s, "wall_seconds"));
  if (s["eval_loss"].is_number()) {
    r += fmt::format("eval loss of the global model: {:.4f} (started at {:.4f})\n", s["eval_loss"].get<double>(),
                     Num(s, "eval_loss_start"));
    const auto& curve = s.value("global_eval_curve", nlohmann::json::array());
    if (!curve.empty()) {
      std::string points;
      for (const auto& e : curve) points += fmt::format(" {:.3f}", Num(e, "eval_loss"));
      r += fmt::format("eval loss of the global model during the run:{}\n", points);
    }
  }
  r += fmt::format("tokens trained {}  merged into the global model {}  ({} tokens/s across learners)\n",
                   GroupedRound(Num(s, "tokens_trained")), GroupedRound(Num(s, "tokens_merged")),
                   GroupedRound(Num(s, "tokens_per_second")));
  const double wire = Num(s, "bytes_up") + Num(s, "bytes_down");
  const double dp = Num(s, "dp_equivalent_bytes");
  r += fmt::format("bytes on the wire {} (up {}, down {}); data-parallel would have moved {} ({:.1f}x more)\n",
                   Bytes(wire), Bytes(Num(s, "bytes_up")), Bytes(Num(s, "bytes_down")), Bytes(dp),
                   wire > 0 ? dp / wire : 0.0);
  if (s.contains("goodput")) {
    r += fmt::format("goodput {:.3f} (useful / allocated learner-seconds)  uptime {:.3f}  faults injected {}\n",
                     Num(s, "goodput"), Num(s, "uptime"), s.value("faults", nlohmann::json::array()).size());
  }
  for (const auto& l : s.value("per_learner", nlohmann::json::array())) {
    r += fmt::format(
        "  learner {}: computed {} merged {} lost {} tokens, alive {:.0f}s dead {:.0f}s, {} rounds joined, up {} down {}",
        l.value("learner", -1), GroupedRound(Num(l, "tokens_computed")), GroupedRound(Num(l, "tokens_merged")),
        GroupedRound(Num(l, "tokens_lost")), Num(l, "seconds_alive"), Num(l, "seconds_dead"),
        l.value("rounds_joined", 0), Bytes(Num(l, "bytes_up")), Bytes(Num(l, "bytes_down")));
    const auto& rj = l.value("restart_to_first_contribution_s", nlohmann::json::array());
    if (!rj.empty()) {
      r += ", rejoin→contribution " + SecondsList(rj, l.value("restart_startup_s", nlohmann::json::array()));
    }
    r += "\n";
  }
  return r;
}

// A sharded run's summary: global.safetensors exported from the shards' committed states and
// evaluated; rounds, versions and each learner's merged tokens, rounds and bytes added up over
// the shards (each counts only its own fragments).
StatusOr<nlohmann::json> CombineShardSummaries(const RunConfig& c, const std::vector<nlohmann::json>& shards,
                                               const std::vector<std::string>& states) {
  std::string state_list;
  for (const std::string& st : states) state_list += (state_list.empty() ? "" : ",") + st;
  ExportOptions eo{c.out + "/config.json", state_list, c.out + "/global.safetensors", /*force=*/true,
                   /*evaluate=*/true};
  ATOLL_ASSIGN_OR_RETURN(ExportResult global, ExportState(eo));
  nlohmann::json s = shards.front();
  s.erase("shard");
  s.erase("owned_fragments");
  double up = 0, down = 0;
  for (const auto& shard : shards) {
    up += shard.value("bytes_up", 0.0);
    down += shard.value("bytes_down", 0.0);
  }
  s["bytes_up"] = up;
  s["bytes_down"] = down;
  s["rounds"] = global.rounds;
  s["versions"] = global.versions;
  s["shards"] = static_cast<int>(shards.size());
  s["theta_checksum"] = ChecksumHex(global.theta_checksum);
  s["eval_loss"] = global.eval_loss;
  s["eval_perplexity"] = global.eval_perplexity;
  s["checkpoint"] = global.out;
  std::map<int, nlohmann::json> rows;
  for (const auto& shard : shards) {
    for (const auto& l : shard.value("learners", nlohmann::json::array())) {
      nlohmann::json& row = rows[l.value("id", -1)];
      if (row.is_null()) {
        row = l;
        continue;
      }
      for (const char* key : {"tokens_merged", "rounds_joined", "late_folded", "bytes_up", "bytes_down", "pushes"}) {
        row[key] = row.value(key, 0.0) + l.value(key, 0.0);
      }
    }
  }
  s["learners"] = nlohmann::json::array();
  for (auto& [id, row] : rows) s["learners"].push_back(row);
  return s;
}

}  // namespace atl::runtime
