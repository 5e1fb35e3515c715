// UpdateRule: what a mode does with the pushes of a round, apart from everything the syncer core
// keeps for every mode (learners, copies, open rounds, versions, persistence, numeric safety).
//
//   Outer rule (decoupled, diloco): a push is an outer gradient against the learner's copy Φ; a
//     round merges the outer gradients (RDA or token-weighted mean) and takes an outer step
//     (sweep, round or running; docs/decisions/007).
//   Parameter-server rule (ddp): a push is a learner's raw gradient of the current step; a round
//     averages them and the inner optimizer hook (SyncerOptions::ddp_step) moves Θ.
//
// Rules hold no state of their own (the ddp optimizer state lives in its hook). Thread-safety:
// const methods, called from the syncer loop thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/outer_optimizer.h"

namespace atl::syncer {

struct SyncerOptions;

// One contribution of a round, as the rule sees it.
struct RoundInput {
  std::span<const float> values;  // what Decode produced
  int64_t c_tokens = 0, c_steps = 0;
};

// What a round's update did, for its report.
struct RoundMath {
  std::vector<double> weights;
  double merged_norm = 0;
  double token_share = 1;       // ρ (sweep rules only)
  bool sweep_completed = true;
  double step_norm = 0;
};

// The fragment state a rule moves.
struct FragmentMath {
  std::vector<float>& theta;
  std::vector<float>& momentum;
  diloco::SweepState& sweep;
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // A push's base version, beyond the range check every mode makes (ddp: must be current).
  virtual Status CheckBase(int64_t base_version, int64_t current_version) const = 0;
  // Whether the push decodes against the learner's copy Φ at its base version (Aborted when the
  // syncer holds none: the learner must fetch in full).
  virtual bool NeedsBaseCopy() const = 0;
  // Decodes and vets a payload into `values` (size of Θ_p): finite, and within the gradient bound.
  // `base` is the learner's copy (nullptr when NeedsBaseCopy() is false).
  virtual Status Decode(std::span<const std::byte> payload, const std::vector<float>* base,
                        std::span<const float> theta, std::span<float> values) const = 0;
  // ‖v‖/√c_steps of a decoded push (an outer gradient grows with the inner steps behind it).
  virtual double Size(std::span<const float> theta, std::span<const float> values, int64_t c_steps) const = 0;
  // Whether outliers by Size are quarantined.
  virtual bool Quarantines() const = 0;
  // Whether a joining learner whose fragment checksum equals Θ_p's may skip fetching it.
  virtual bool SkipsMatchingJoinFetch() const = 0;
  // Merges a round's contributions and moves the fragment, filling `math` as it goes (also when
  // it fails part-way, for the refused round's report). `token_share` is ρ of the round (read
  // only by the sweep rules). A merge error carries the context "merge".
  virtual Status Apply(const diloco::Fragment& fragment, const std::vector<RoundInput>& inputs,
                       double token_share, FragmentMath state, RoundMath& math) const = 0;
};

// The rule of options.mode.
std::shared_ptr<const UpdateRule> MakeUpdateRule(const SyncerOptions& options);

}  // namespace atl::syncer
