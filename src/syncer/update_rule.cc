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

// The merge of a round's contributions, decoded one at a time into one buffer.
Status Merge(const diloco::Fragment& fragment, diloco::MergeRule rule, const std::vector<double>& weights,
             std::vector<std::vector<double>> norms, const ContributionSource& source, std::span<float> merged,
             ThreadPool* pool) {
  auto merger = diloco::FragmentMerger::Create(fragment, rule, weights, std::move(norms), pool);
  if (!merger.ok()) return merger.status().WithContext("merge");
  std::vector<float> v(merged.size());
  for (size_t m = 0; m < weights.size(); ++m) {
    if (!merger->Reads(m)) continue;
    ATOLL_RETURN_IF_ERROR(source(m, v).WithContext("merge: decoding contribution " + std::to_string(m)));
    merger->Add(m, v);
  }
  merger->Finish(merged);
  return Status::Ok();
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
  bool NeedsBase() const override { return against_current_; }

  Status Vectorize(std::span<const std::byte> payload, std::span<const float> base, std::span<const float> reference,
                   std::span<const float> theta, std::span<float> out, ThreadPool* pool) const override {
    // kCurrent: v = Θ_ref − θ_m with θ_m = Φ_base − Δ̂; kBase: v = Δ̂.
    ATOLL_RETURN_IF_ERROR(diloco::Decode(uplink_, payload, out, pool));
    if (against_current_) {
      ForRanges(pool, out.size(), size_t{1} << 16, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) out[i] = reference[i] - (base[i] - out[i]);
      });
    }
    if (!exchange::AllFinite(out)) return InvalidArgumentError("outer gradient has non-finite values");
    return CheckOuterGradientBound(theta, out, /*against_current=*/false, max_gradient_ratio_);
  }

  std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState& sweep) const override {
    return step_ == OuterStepRule::kRunning && !sweep.start.empty() ? sweep.start : theta;
  }
  bool Quarantines() const override { return true; }
  bool SkipsMatchingJoinFetch() const override { return true; }

  Status Apply(const diloco::Fragment& fragment, const std::vector<RoundInput>& inputs,
               const ContributionSource& source, double token_share, FragmentMath s,
               RoundMath& math, ThreadPool* pool) const override {
    std::vector<std::vector<double>> norms;
    for (const RoundInput& in : inputs) {
      math.weights.push_back(std::min(in.max_weight, diloco::ContributionWeight(weights_, in.c_tokens, in.c_steps)));
      norms.push_back(in.slice_norms);
    }
    std::vector<float> merged(s.theta.size(), 0.0f);
    ATOLL_RETURN_IF_ERROR(Merge(fragment, merge_, math.weights, std::move(norms), source, merged, pool));
    math.merged_norm = diloco::L2Norm(merged);
    if (step_ == OuterStepRule::kRound) return diloco::OuterStep(outer_, merged, s.momentum, s.theta);
    math.token_share = token_share;
    auto r = diloco::SweepOuterStep(outer_, fragment, merged, token_share, s.sweep, s.momentum, s.theta,
                                    step_ == OuterStepRule::kRunning);
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
  bool NeedsBase() const override { return false; }

  Status Vectorize(std::span<const std::byte> payload, std::span<const float>, std::span<const float>,
                   std::span<const float>, std::span<float> out, ThreadPool* pool) const override {
    ATOLL_RETURN_IF_ERROR(diloco::Decode(uplink_, payload, out, pool));
    if (!exchange::AllFinite(out)) return InvalidArgumentError("gradient has non-finite values");
    return Status::Ok();
  }
  std::span<const float> Reference(const std::vector<float>& theta, const diloco::SweepState&) const override {
    return theta;
  }
  bool Quarantines() const override { return false; }
  // Θ moves every step and learners hold no copy across steps: always fetch.
  bool SkipsMatchingJoinFetch() const override { return false; }

  Status Apply(const diloco::Fragment& fragment, const std::vector<RoundInput>& inputs,
               const ContributionSource& source, double, FragmentMath s, RoundMath& math,
               ThreadPool* pool) const override {
    std::vector<std::vector<double>> norms;
    for (const RoundInput& in : inputs) {
      math.weights.push_back(1.0);  // one step of every learner, equal batches
      norms.push_back(in.slice_norms);
    }
    std::vector<float> merged(s.theta.size(), 0.0f);
    ATOLL_RETURN_IF_ERROR(Merge(fragment, diloco::MergeRule::kMean, math.weights, std::move(norms), source, merged, pool));
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
