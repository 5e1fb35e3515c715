// ModelHost: what a syncer (or `atoll export`) knows of the run's model, whichever way the run
// names it (docs/model.md, "Any model"):
//   a spec (run file `[model] spec`): a safetensors file of the initial weights, any architecture.
//     Θ⁰ is read from it per fragment and not kept. A spec written for an atoll preset
//     (`atoll init`, metadata "atoll.preset") can also be evaluated: the preset's Trainer is
//     built and loaded with those weights. Any other spec cannot: the syncer then evaluates
//     nothing, says so, and refuses ddp mode (its optimizer is an atoll Trainer's).
//   a preset: the preset's Trainer from the run's seed holds Θ⁰ and evaluates.
// It also writes Θ as a safetensors file of the model's own tensors (streaming, whatever the size).
// Private to src/runtime. Thread-safety: const methods may be called from any thread; the
// Trainer it hands out belongs to its caller.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/model/model_spec.h"
#include "atoll/model/trainer.h"
#include "atoll/runtime/run_config.h"

namespace atl::runtime {

class ModelHost {
 public:
  // The model of `c`. `evaluate`: build the evaluator when the model can have one (prepares the
  // data folder). Errors: the spec's (NotFound, DataLoss, InvalidArgument); FailedPrecondition for
  // an atoll-preset spec whose tensors are not that preset's (naming the first that differs).
  static StatusOr<std::unique_ptr<ModelHost>> Open(const RunConfig& c, bool evaluate);

  const std::vector<diloco::TensorSpec>& tensors() const { return tensors_; }
  int64_t num_params() const;
  // "spec model.safetensors (llama-like, 2,320 params)" or "preset tiny (1,315,968 params)".
  std::string Describe() const;
  bool is_spec() const { return spec_.has_value(); }
  // Θ⁰ of `fragment` (a fragment of a plan over tensors()) into `out`.
  Status Initial(const diloco::Fragment& fragment, std::span<float> out) const;
  // The evaluator built by Open (nullptr when there is none: see no_evaluation()). Holds Θ⁰.
  model::Trainer* evaluator() const { return evaluator_.get(); }
  // A second Trainer of the model (the live evaluation's). FailedPrecondition when none can exist.
  StatusOr<std::unique_ptr<model::Trainer>> NewTrainer() const;
  // Why the syncer does not evaluate ("" when it does).
  const std::string& no_evaluation() const { return no_evaluation_; }

  // Writes Θ (`theta(p)`: fragment p in plan layout) as a safetensors file of tensors(), with
  // `metadata` and the spec's own metadata (keys not starting with "atoll."), streaming (atomic).
  Status WriteModel(const std::string& path, const diloco::FragmentPlan& plan,
                    const std::function<std::span<const float>(int)>& theta, const nlohmann::json& metadata) const;

 private:
  ModelHost() = default;

  RunConfig c_;
  std::optional<model::ModelSpec> spec_;
  std::vector<diloco::TensorSpec> tensors_;
  std::unique_ptr<model::Trainer> evaluator_;
  std::string no_evaluation_;
};

}  // namespace atl::runtime
