// Simulated cluster: the cluster of `atoll run` in one process on simulated time (`atoll
// simulate`). The real SyncerCore and SyncerLoop, M real LearnerAgents and M real Trainers (the
// GPT, AdamW, each learner's own data shard), with no processes, sockets or codecs beyond the
// ones the agent and core use themselves. Each learner's inner step takes a *simulated* time —
// `step_seconds` × its speed factor × a persistent per-learner factor × a per-step jitter, all
// drawn from a seeded RNG — so the drift between learners, the rounds it produces and therefore
// the losses are the same on every run with the same flags, whatever else the machine does.
// `atoll run` cannot offer that: its learners drift with the load of the machine, and two runs of
// one configuration end up to ±4 % apart at 150 steps (docs/experiments.md). Use this to compare
// configurations; use `atoll run` for what a deployment does (processes, gRPC, faults, time).
//
// The learners' compute is real and runs one step at a time (simulated time stands still while a
// learner computes), so a run costs about M × steps training steps of one core. Evaluations of
// the global model every `eval_every` rounds run on the syncer's loop thread, also outside
// simulated time (the learners never wait for them).
//
// Thread-safety: Simulate is a blocking call; it runs its threads and joins them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"
#include "atoll/runtime/run_config.h"

namespace atl::runtime {

struct SimulateOptions {
  double step_seconds = 1.7;  // simulated time of one inner step at speed 1
  double spread = 0.05;       // each learner's persistent speed factor: 1 ± spread (uniform)
  double jitter = 0.05;       // each step's time: × (1 ± jitter) (uniform)
  // Called with progress lines (one per evaluation of the global model); may be empty.
  std::function<void(const std::string&)> progress;
};

struct SimulateResult {
  double eval_loss = 0;  // the global model after the final sync
  double eval_loss_start = 0;
  double simulated_seconds = 0;
  int64_t rounds = 0;
  int64_t tokens_trained = 0;
  double tokens_merged = 0;
  int64_t params = 0;  // values in the model (every fragment's)
  // What the learners' pushes and pulls carried, encoded and compressed as on the wire of
  // `atoll run` (its payload_bytes_up/down: the same payloads, without gRPC framing).
  int64_t payload_bytes_up = 0, payload_bytes_down = 0;
  std::vector<int64_t> contributors_histogram;  // [k] = rounds that held k learners
  std::vector<double> merged_norm_quarters;     // mean merged outer-gradient norm per quarter of the rounds
  nlohmann::json global_eval_curve = nlohmann::json::array();  // {rounds, tokens_merged, t, eval_loss}
  nlohmann::json learners = nlohmann::json::array();           // per learner: steps, pushes, payload bytes, final loss
  // Every closed round in order, the fields of metrics-syncer.jsonl's round lines (round_json.h)
  // with `t` in simulated seconds and `eval_loss` where the global model was evaluated after it.
  std::vector<nlohmann::json> round_log;
};

// Validates the config (decoupled or diloco mode, no chaos, no WAN emulation, one syncer shard:
// InvalidArgument naming what is not simulated) and the options, then runs it.
StatusOr<SimulateResult> Simulate(const RunConfig& config, const SimulateOptions& options);

// The summary.json of a simulated run (the result and the config).
nlohmann::json SimulateSummary(const RunConfig& config, const SimulateOptions& options, const SimulateResult& r);

}  // namespace atl::runtime
