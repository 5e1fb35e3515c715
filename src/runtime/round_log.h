// RoundLog: what the syncer records of its rounds and evaluations — metrics-syncer.jsonl (one
// line per round, refused round, evaluation, resume), the round histograms /metrics renders, the
// global model's eval curve, and the one-line log of each round.
// Private to src/runtime. Thread-safety: every method may be called from any thread (the loop
// thread logs rounds, the evaluator thread evaluations, the HTTP threads read).
#pragma once

#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "atoll/observe/prometheus.h"
#include "atoll/syncer/syncer_core.h"
#include "global_eval.h"
#include "jsonl.h"

namespace atl::runtime {

class RoundLog {
 public:
  explicit RoundLog(const std::string& metrics_path);

  // A committed round (with Θ_p's checksum), or one numeric safety refused.
  void Round(const syncer::SyncerCore& core, const syncer::RoundReport& r);
  void Evaluation(const GlobalEvalPoint& e);
  void Line(const nlohmann::json& line) { metrics_.Write(line); }

  nlohmann::json Curve() const;
  std::string Prometheus(const nlohmann::json& status) const;

 private:
  JsonlWriter metrics_;
  mutable std::mutex mu_;
  observe::RoundStats stats_;                       // guarded by mu_
  nlohmann::json curve_ = nlohmann::json::array();  // guarded by mu_
};

}  // namespace atl::runtime
