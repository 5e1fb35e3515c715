// UpdateRule: what a mode does with the pushes of a round, apart from everything the syncer core
// keeps for every mode (learners, the public copy, open rounds, versions, persistence, numeric
// safety, and the tiled pass that merges and applies a round: docs/decisions/018).
//
//   Outer rule (decoupled, diloco): a push is an outer gradient against the learner's copy Φ; a
//     round merges the outer gradients (RDA or token-weighted mean) and takes an outer step
//     (sweep, round or running; docs/decisions/007), value range by value range.
//   Parameter-server rule (ddp): a push is a learner's raw gradient of the current step; a round
//     averages them and the inner optimizer hook (SyncerOptions::ddp_step) moves Θ, whole.
//
// Rules hold no state of their own (the ddp optimizer state lives in its hook). Thread-safety:
// const methods.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"

namespace atl::syncer {

struct SyncerOptions;

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // A push's base version, beyond the range check every mode makes (ddp: must be current).
  virtual Status CheckBase(int64_t base_version, int64_t current_version) const = 0;
  // Whether the push decodes against the public copy Φ at its base version (Aborted when the
  // syncer no longer holds that version: the learner must fetch in full): the vector a round
  // merges is then the outer gradient v = Θ_ref − (Φ_base − Δ̂) (Θ_ref: Reference;
  // diloco::EncodedGradients), else Δ̂ itself (kBase, and ddp's gradients).
  virtual bool NeedsBase() const = 0;
  // Whether a round reads every push's norms (RDA's radius, the outer-gradient bound), so that
  // they are worth forming when the push arrives (SyncerCore::JoinNorms).
  virtual bool ReadsNorms() const = 0;
  // The value outer gradients are taken against: Θ_p, or the running sweep's start.
  virtual std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState& sweep) const = 0;
  // Whether outliers by size (‖Δ̂‖/√c_steps) are quarantined.
  virtual bool Quarantines() const = 0;
  // Whether a joining learner whose fragment checksum matches a version of Φ_p may skip fetching.
  virtual bool SkipsMatchingJoinFetch() const = 0;
  // How the round's contributions are merged, and with which weight (before the robust bound).
  virtual diloco::MergeRule merge_rule() const = 0;
  virtual double Weight(int64_t c_tokens, int64_t c_steps) const = 0;
  // The outer step of a round of token share ρ, applied value range by value range (fused with
  // the merge); nullopt for a rule that moves Θ whole (ddp: Step).
  virtual std::optional<StatusOr<diloco::OuterStepKernel>> Kernel(double token_share, const diloco::SweepState& sweep,
                                                                  bool keeps_momentum) const = 0;
  // ddp: moves Θ (the whole fragment) by the merged gradient.
  virtual Status Step(std::span<const float> merged, std::span<float> theta) const = 0;
};

// The rule of options.mode.
std::shared_ptr<const UpdateRule> MakeUpdateRule(const SyncerOptions& options);

}  // namespace atl::syncer
