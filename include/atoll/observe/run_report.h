// `atoll report RUN`: report.html in a run folder — the run's numbers for people and SVG plots
// drawn from its metrics files with sim/svg.h (no scripts, no external resources):
//   atoll run / hand-started syncer folder (metrics-syncer.jsonl, metrics-learner-<m>.jsonl,
//   faults.jsonl, summary.json or syncer-summary.json):
//     loss vs tokens and vs time (each learner's training loss, the global model's eval loss),
//     fault markers on the time axes; tokens trained vs merged over time (goodput); cumulative
//     bytes on the wire vs what data-parallel would have moved; contributors and grace per round
//   atoll train folder (metrics.jsonl of kind train/eval, summary.json):
//     training and eval loss vs tokens and vs time
// Long series are averaged down to at most 300 points per line.
// Thread-safety: functions of the file system; one call per folder at a time.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"

namespace atl::observe {

// The JSON objects of a JSON-lines file, in order; lines that do not parse (one cut by a kill) are
// skipped; a missing file gives none.
std::vector<nlohmann::json> ReadJsonLines(const std::string& path);

struct ReportResult {
  std::string path;  // <run folder>/report.html
  std::string kind;  // "atoll run" or "atoll train"
  int figures = 0;   // SVG documents in it
};

// Writes report.html (atomically). NotFound when the folder holds neither layout's metrics.
StatusOr<ReportResult> WriteRunReport(const std::string& run_dir);

}  // namespace atl::observe
