// Goodput and uptime of a run, as pure functions over event records (no files, no processes):
// what `atoll run` reports in summary.json, testable with hand-made fixtures.
//
// Goodput = useful learner-seconds ÷ allocated learner-seconds over the training window.
//   useful:    a learner's training seconds × min(1, tokens merged ÷ tokens computed) — the
//              compute time of the tokens that reached the global model;
//   allocated: each learner's hardware from the first inner step of the run until that learner
//              finished its share (dead and restarting time included; a learner that never
//              finished stays allocated to the end of the window). Time after a learner finished
//              is not allocated: it released its chips.
// Uptime = 1 − (downtime ÷ fragments ÷ window). A fragment is synchronised at least once per H
//   inner steps while any learner trains, so a gap between two of its rounds (or from its last
//   round to the end of training) longer than 2·H·t_step + 1 s counts as downtime beyond that
//   allowance (t_step: the median inner-step time); a fragment with no round is down throughout.
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <vector>

namespace atl::runtime {

// One inner step of a learner: when it ended (unix seconds), how long it took, its tokens.
struct StepRecord {
  double t = 0, seconds = 0, tokens = 0;
};

struct LearnerRecordOfRun {
  std::vector<StepRecord> steps;  // every incarnation's steps
  double tokens_merged = 0;       // as the syncer counted them
  bool finished = false;          // finished its share of the steps
};

struct LearnerAccounting {
  double tokens_computed = 0, tokens_lost = 0, seconds_training = 0, useful_seconds = 0, seconds_allocated = 0;
};

struct RunAccounting {
  std::vector<LearnerAccounting> learners;
  double window_start = 0, window_end = 0;  // first step's start, last step's end
  double tokens_computed = 0, useful_seconds = 0, allocated_seconds = 0;
  double goodput = 0;  // 0 when nothing was allocated
  double median_step_seconds = 0;
  double window_seconds() const { return window_end > window_start ? window_end - window_start : 0; }
};

RunAccounting AccountGoodput(const std::vector<LearnerRecordOfRun>& learners);

// `round_closes[p]`: the times rounds of fragment p closed (any order). Needs the window and
// median step time from AccountGoodput; 1 for an empty window.
double Uptime(const std::map<int, std::vector<double>>& round_closes, int fragments, int H, const RunAccounting& run);

}  // namespace atl::runtime
