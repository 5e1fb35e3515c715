// What `atoll run` shows and writes: the live progress view, summary.json, the merged
// metrics.jsonl and the closing report.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/runtime/run_config.h"

namespace atl::runtime {

class ProgressView {
 public:
  // `redraw`: a terminal that can redraw the table in place; otherwise a line every 10 s.
  ProgressView(const RunConfig& config, bool redraw) : config_(config), redraw_(redraw) {}
  void Draw(const nlohmann::json& status, double elapsed_s);
  void DrawLine(double elapsed_s, const std::string& line);

 private:
  const RunConfig& config_;
  bool redraw_;
  int lines_drawn_ = 0;
  double last_line_ = -1e9;
};

// Combines the syncer's summary with each learner's learner-<i>.json in the run folder.
nlohmann::json BuildRunSummary(const RunConfig& config, const nlohmann::json& syncer_summary, double wall_seconds);
// Merges metrics-syncer.jsonl and metrics-learner-*.jsonl into metrics.jsonl, ordered by time.
void MergeMetrics(const RunConfig& config);
std::string FormatReport(const nlohmann::json& summary);
// A sharded run's summary from its shards' final summaries and their state folders (in shard
// order): global.safetensors exported from the committed states and evaluated; rounds, versions
// and each learner's merged tokens, rounds and bytes added up over the shards (each counts only
// its own fragments). The export's errors.
StatusOr<nlohmann::json> CombineShardSummaries(const RunConfig& config, const std::vector<nlohmann::json>& shards,
                                               const std::vector<std::string>& states);

class Cluster;
// Goodput accounting from the metrics and the fault log: per learner tokens computed / merged /
// lost, seconds alive / dead / paused, time from each restart to its first contribution; run-level
// goodput (useful learner-seconds ÷ allocated learner-seconds) and uptime (share of the run in
// which the global model kept advancing), and the list of injected faults.
void AddAccounting(const RunConfig& config, Cluster& cluster, double t0, double wall_seconds, nlohmann::json& summary);

}  // namespace atl::runtime
