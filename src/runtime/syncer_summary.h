// SyncerSummary: the summary document of a syncer's run so far — its status document plus the
// start evaluation, the global model's eval curve, the model's size and Θ's checksum — written in
// syncer-summary.json, answered to Finish and served on the status page; and ThetaOf, Θ copied
// out of the core per fragment.
// Private to src/runtime. Thread-safety: Of and ThetaOf are called by the thread that holds the
// core (the loop thread); AddEvaluation from any thread (the start evaluation is set once, before
// the syncer serves).
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/clock.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/syncer/syncer_core.h"
#include "model_host.h"
#include "round_log.h"

namespace atl::runtime {

// Θ per fragment (another shard's fragments empty).
std::vector<std::vector<float>> ThetaOf(const syncer::SyncerCore& core);

class SyncerSummary {
 public:
  SyncerSummary(const ModelHost& model, const diloco::FragmentPlan& plan, const RoundLog& log)
      : model_(model), plan_(plan), log_(log) {}

  // The initial model's eval loss, once measured (none without an evaluator).
  void set_start_eval_loss(double loss) { start_eval_loss_ = loss; }
  // The summary of the run so far.
  nlohmann::json Of(const syncer::SyncerCore& core, TimePoint now) const;
  // Adds "replication" (a leader's replicated commits, docs/decisions/023) to every summary.
  void set_replication(std::function<nlohmann::json()> stats) { replication_ = std::move(stats); }
  // The start evaluation and the curve, or why there is none.
  void AddEvaluation(nlohmann::json& doc) const;

 private:
  const ModelHost& model_;
  const diloco::FragmentPlan& plan_;
  const RoundLog& log_;
  std::optional<double> start_eval_loss_;
  std::function<nlohmann::json()> replication_;
};

}  // namespace atl::runtime
