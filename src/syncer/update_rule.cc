#include "atoll/syncer/update_rule.h"

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "atoll/diloco/merge.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/guards.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {
namespace {

double SizeOf(std::span<const float> theta, std::span<const float> values, int64_t c_steps, bool against_current) {
  double norm2 = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = against_current ? static_cast<double>(theta[i]) - values[i] : values[i];
    norm2 += v * v;
  }
  return std::sqrt(norm2) / std::sqrt(static_cast<double>(std::max<int64_t>(1, c_steps)));
}

// Decoupled and synchronous DiLoCo: outer gradients, a merge, an outer step.
class OuterRule final : public UpdateRule {
 public:
  explicit OuterRule(const SyncerOptions& o)
      : uplink_(o.uplink),
        outer_(o.outer),
        merge_(o.merge_rule),
        weights_(o.weight_rule),
        step_(o.outer_step),
        against_current_(o.outer_gradient == OuterGradientRule::kCurrent),
        max_gradient_ratio_(o.max_gradient_ratio) {}

  Status CheckBase(int64_t, int64_t) const override { return Status::Ok(); }
  bool NeedsBaseCopy() const override { return true; }

  Status Decode(std::span<const std::byte> payload, const std::vector<float>* base, std::span<const float> theta,
                std::span<float> values) const override {
    // kCurrent keeps θ_m = Φ_base − Δ̂; kBase keeps Δ̂ itself.
    Status st = against_current_ ? exchange::DecodeLocal(uplink_, payload, *base, values)
                                 : diloco::Decode(uplink_, payload, values);
    if (!st.ok()) return st;
    if (!exchange::AllFinite(values)) return InvalidArgumentError("outer gradient has non-finite values");
    return CheckOuterGradientBound(theta, values, against_current_, max_gradient_ratio_);
  }

  double Size(std::span<const float> theta, std::span<const float> values, int64_t c_steps) const override {
    return SizeOf(theta, values, c_steps, against_current_);
  }
  bool Quarantines() const override { return true; }
  bool SkipsMatchingJoinFetch() const override { return true; }

  Status Apply(const diloco::Fragment& fragment, const std::vector<RoundInput>& inputs, double token_share,
               FragmentMath s, RoundMath& math) const override {
    const size_t n = s.theta.size();
    const bool running = step_ == OuterStepRule::kRunning;
    // The value outer gradients are taken against: Θ_p now, or at the running sweep's start.
    const std::vector<float>& reference = running && !s.sweep.start.empty() ? s.sweep.start : s.theta;
    std::vector<std::vector<float>> grads(inputs.size(), std::vector<float>(n));
    std::vector<std::span<const float>> views;
    for (size_t m = 0; m < inputs.size(); ++m) {
      const RoundInput& in = inputs[m];
      if (against_current_) {
        for (size_t i = 0; i < n; ++i) grads[m][i] = reference[i] - in.values[i];  // v_m = Θ_p − θ_m
      } else {
        grads[m].assign(in.values.begin(), in.values.end());  // Δ̂_m (kBase)
      }
      views.emplace_back(grads[m]);
      math.weights.push_back(diloco::ContributionWeight(weights_, in.c_tokens, in.c_steps));
    }
    std::vector<float> merged(n, 0.0f);
    if (Status st = diloco::MergeFragment(fragment, merge_, views, math.weights, merged); !st.ok()) {
      return st.WithContext("merge");
    }
    math.merged_norm = diloco::L2Norm(merged);
    if (step_ == OuterStepRule::kRound) return diloco::OuterStep(outer_, merged, s.momentum, s.theta);
    math.token_share = token_share;
    auto r = diloco::SweepOuterStep(outer_, fragment, merged, token_share,
                                    s.sweep, s.momentum, s.theta, running);
    if (!r.ok()) return r.status();
    math.sweep_completed = r->sweep_completed;
    math.step_norm = r->step_norm;
    return Status::Ok();
  }

 private:
  diloco::CodecOptions uplink_;
  diloco::OuterOptimizerOptions outer_;
  diloco::MergeRule merge_;
  diloco::WeightRule weights_;
  OuterStepRule step_;
  bool against_current_;
  double max_gradient_ratio_;
};

// ddp: a parameter server. Gradients of the current step, averaged; the optimizer hook steps Θ.
class ParameterServerRule final : public UpdateRule {
 public:
  explicit ParameterServerRule(const SyncerOptions& o) : uplink_(o.uplink), step_(o.ddp_step) {}

  Status CheckBase(int64_t base_version, int64_t current_version) const override {
    if (base_version == current_version) return Status::Ok();
    return AbortedError(fmt::format("ddp: gradient of step {} but the model is at step {}: pull first",
                                    base_version, current_version));
  }
  bool NeedsBaseCopy() const override { return false; }

  Status Decode(std::span<const std::byte> payload, const std::vector<float>*, std::span<const float>,
                std::span<float> values) const override {
    if (Status st = diloco::Decode(uplink_, payload, values); !st.ok()) return st;
    if (!exchange::AllFinite(values)) return InvalidArgumentError("gradient has non-finite values");
    return Status::Ok();
  }

  double Size(std::span<const float> theta, std::span<const float> values, int64_t c_steps) const override {
    return SizeOf(theta, values, c_steps, /*against_current=*/false);
  }
  bool Quarantines() const override { return false; }
  // Θ moves every step and learners hold no copy across steps: always fetch.
  bool SkipsMatchingJoinFetch() const override { return false; }

  Status Apply(const diloco::Fragment&, const std::vector<RoundInput>& inputs, double, FragmentMath s,
               RoundMath& math) const override {
    std::vector<std::span<const float>> views;
    for (const RoundInput& in : inputs) {
      views.push_back(in.values);
      math.weights.push_back(1.0);  // one step of every learner, equal batches
    }
    std::vector<float> merged(s.theta.size(), 0.0f);
    if (Status st = diloco::WeightedMean(views, math.weights, merged); !st.ok()) return st.WithContext("merge");
    math.merged_norm = diloco::L2Norm(merged);
    return step_(merged, s.theta);
  }

 private:
  diloco::CodecOptions uplink_;
  DdpStep step_;
};

}  // namespace

std::shared_ptr<const UpdateRule> MakeUpdateRule(const SyncerOptions& options) {
  if (options.mode == diloco::Mode::kDdp) return std::make_shared<ParameterServerRule>(options);
  return std::make_shared<OuterRule>(options);
}

}  // namespace atl::syncer
