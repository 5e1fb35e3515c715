// LearnerReport: what a learner process tells about itself — the stages of its start-up (from the
// process's creation to its first contribution the syncer accepted, for the rejoin latency), the
// progress its heartbeats carry, metrics-learner-<m>.jsonl, a line on stdout every 25 steps, and
// learner-<m>.json at the end.
// Thread-safety: the training thread only.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/learner/learner_agent.h"
#include "atoll/model/trainer.h"
#include "jsonl.h"

namespace atl::runtime {

// One inner step as the process saw it.
struct StepRecord {
  model::StepStats stats;
  int64_t step = 0;          // inner steps completed
  int64_t tokens_total = 0;  // tokens trained by this learner so far
  double step_s = 0;         // wall time of the step, slowed to the learner's speed
  int applied = 0;           // fragments (or ddp steps) applied after it
  int64_t wire_up = 0, wire_down = 0;
  // Whether the learner's first contribution was accepted by now, and when (UnixSeconds).
  bool contributed = false;
  double contributed_at = 0;
  double first_contribution_s = -1;  // seconds from the agent's start (AgentCounters)
};

class LearnerReport {
 public:
  // Marks the stage "load" (exec, dynamic linking, static initialisers, flags) from the process's
  // creation to now.
  LearnerReport(int id, std::string out_dir, int64_t start_step, int64_t steps);

  // Records the seconds from the previous mark to `at` (default: now) as start-up stage `name`.
  void Mark(const char* name, double at = UnixSeconds());
  // Opens metrics-learner-<id>.jsonl (appended to: a restarted learner continues it).
  void OpenMetrics();
  // After each step: the progress for the heartbeats (the step time as an EMA), the metrics line,
  // the start-up marks first_step and first_push, and the line on stdout every 25 steps.
  learner::Progress Step(const StepRecord& r);
  double last_loss() const { return last_loss_; }
  // learner-<id>.json: `summary` with the start-up stages added.
  void WriteSummary(nlohmann::json summary) const;

 private:
  const int id_;
  const std::string out_;
  const int64_t start_step_, steps_;
  JsonlWriter metrics_;
  double ema_step_ = 0, last_loss_ = 0;
  bool contributed_ = false;
  double stage_mark_ = 0;
  nlohmann::json startup_ = nlohmann::json::object();  // stage → seconds, and "total"
};

}  // namespace atl::runtime
