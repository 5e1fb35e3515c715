// UpdateRule: what a mode does with the pushes of a round, apart from everything the syncer core
// keeps for every mode (learners, the public copy, open rounds, versions, persistence, numeric
// safety).
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
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "atoll/core/parallel.h"
#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/outer_optimizer.h"

namespace atl::syncer {

struct SyncerOptions;

// One contribution of a round, as the rule sees it: its counters and the norms of its vector's
// slices (measured when it arrived); the values themselves come from a ContributionSource.
struct RoundInput {
  int64_t c_tokens = 0, c_steps = 0;
  std::vector<double> slice_norms;
  double max_weight = std::numeric_limits<double>::infinity();  // its merge weight's bound (robust references)
};
// Writes contribution m's vector (Vectorize of its payload) into `out` (fragment-sized).
using ContributionSource = std::function<Status(size_t m, std::span<float> out)>;

// What a round's update did, for its report.
struct RoundMath {
  std::vector<double> weights;
  double merged_norm = 0;
  double token_share = 1;       // ρ (sweep rules only)
  bool sweep_completed = true;
  double step_norm = 0;
};

// The fragment state a rule moves (momentum may be empty: see SyncerCore::KeepsMomentum).
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
  // Whether the push decodes against the public copy Φ at its base version (Aborted when the
  // syncer no longer holds that version: the learner must fetch in full).
  virtual bool NeedsBase() const = 0;
  // Decodes a payload into the vector the round merges and vets it (finite, within the gradient
  // bound against Θ_p): the outer gradient v = Θ_ref − (Φ_base − Δ̂) under kCurrent (Θ_ref: the
  // value outer gradients are taken against, Reference), Δ̂ under kBase, the gradient in ddp.
  // `base` is Φ at the push's base version (empty when NeedsBase() is false).
  virtual Status Vectorize(std::span<const std::byte> payload, std::span<const float> base,
                           std::span<const float> reference, std::span<const float> theta,
                           std::span<float> out, ThreadPool* pool) const = 0;
  // The value outer gradients are taken against: Θ_p, or the running sweep's start.
  virtual std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState& sweep) const = 0;
  // Whether outliers by size (‖v‖/√c_steps) are quarantined.
  virtual bool Quarantines() const = 0;
  // Whether a joining learner whose fragment checksum matches a version of Φ_p may skip fetching.
  virtual bool SkipsMatchingJoinFetch() const = 0;
  // Merges a round's contributions and moves the fragment, filling `math` as it goes (also when
  // it fails part-way, for the refused round's report). `token_share` is ρ of the round (read
  // only by the sweep rules). A merge error carries the context "merge".
  // `pool` (may be null) spreads the merge over threads; the result is the same bits.
  virtual Status Apply(const diloco::Fragment& fragment, const std::vector<RoundInput>& inputs,
                       const ContributionSource& source, double token_share, FragmentMath state,
                       RoundMath& math, ThreadPool* pool) const = 0;
};

// The rule of options.mode.
std::shared_ptr<const UpdateRule> MakeUpdateRule(const SyncerOptions& options);

}  // namespace atl::syncer
