#include "atoll/syncer/update_rule.h"

#include <string>

#include <fmt/format.h>

#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {
namespace {

// Decoupled and synchronous DiLoCo: outer gradients, a merge, an outer step.
class OuterRule final : public UpdateRule {
 public:
  explicit OuterRule(const SyncerOptions& o)
      : outer_(o.outer),
        merge_(o.merge_rule),
        weights_(o.weight_rule),
        step_(o.outer_step),
        against_current_(o.outer_gradient == OuterGradientRule::kCurrent) {}

  Status CheckBase(int64_t, int64_t) const override { return Status::Ok(); }
  bool NeedsBase() const override { return against_current_; }
  bool ReadsNorms() const override { return true; }

  std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState& sweep) const override {
    return step_ == OuterStepRule::kRunning && !sweep.start.empty() ? sweep.start : theta;
  }
  bool Quarantines() const override { return true; }
  bool SkipsMatchingJoinFetch() const override { return true; }
  diloco::MergeRule merge_rule() const override { return merge_; }
  double Weight(int64_t c_tokens, int64_t c_steps) const override {
    return diloco::ContributionWeight(weights_, c_tokens, c_steps);
  }

  std::optional<StatusOr<diloco::OuterStepKernel>> Kernel(double token_share, const diloco::SweepState& sweep,
                                                          bool keeps_momentum) const override {
    const diloco::OuterStepKind kind = step_ == OuterStepRule::kRound     ? diloco::OuterStepKind::kRound
                                       : step_ == OuterStepRule::kRunning ? diloco::OuterStepKind::kRunning
                                                                          : diloco::OuterStepKind::kSweep;
    return diloco::OuterStepKernel::Create(outer_, kind, token_share, sweep.share, keeps_momentum);
  }
  Status Step(std::span<const float>, std::span<float>) const override {
    return InternalError("the outer rule steps value range by value range (Kernel)");
  }

 private:
  diloco::OuterOptimizerOptions outer_;
  diloco::MergeRule merge_;
  diloco::WeightRule weights_;
  OuterStepRule step_;
  bool against_current_;
};

// ddp: a parameter server. Gradients of the current step, averaged; the optimizer hook steps Θ.
class ParameterServerRule final : public UpdateRule {
 public:
  explicit ParameterServerRule(const SyncerOptions& o) : step_(o.ddp_step) {}

  Status CheckBase(int64_t base_version, int64_t current_version) const override {
    if (base_version == current_version) return Status::Ok();
    return AbortedError(
        fmt::format("ddp: gradient of step {} but the model is at step {}: pull first", base_version, current_version));
  }
  bool NeedsBase() const override { return false; }
  bool ReadsNorms() const override { return false; }  // a mean, and no outer-gradient bound
  std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState&) const override {
    return theta;
  }
  bool Quarantines() const override { return false; }
  // Θ moves every step and learners hold no copy across steps: always fetch.
  bool SkipsMatchingJoinFetch() const override { return false; }
  diloco::MergeRule merge_rule() const override { return diloco::MergeRule::kMean; }
  double Weight(int64_t, int64_t) const override { return 1.0; }  // one step of every learner, equal batches
  std::optional<StatusOr<diloco::OuterStepKernel>> Kernel(double, const diloco::SweepState&, bool) const override {
    return std::nullopt;
  }
  Status Step(std::span<const float> merged, std::span<float> theta) const override { return step_(merged, theta); }

 private:
  DdpStep step_;
};

}  // namespace

std::shared_ptr<const UpdateRule> MakeUpdateRule(const SyncerOptions& options) {
  if (options.mode == diloco::Mode::kDdp) return std::make_shared<ParameterServerRule>(options);
  return std::make_shared<OuterRule>(options);
}

}  // namespace atl::syncer
