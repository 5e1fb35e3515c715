#include "atoll/syncer/guards.h"

#include <cmath>
#include <fmt/format.h>

namespace atl::syncer {
namespace {

double Norm(std::span<const float> x) {
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

bool Finite(std::span<const float> x) {
  for (float v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

bool InRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

Status CheckOuterGradientBound(std::span<const float> theta, std::span<const float> values,
                               bool against_current, double max_ratio) {
  if (max_ratio <= 0 || theta.size() != values.size()) return Status::Ok();
  double v2 = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const double v = against_current ? static_cast<double>(theta[i]) - values[i] : values[i];
    v2 += v * v;
  }
  const double norm = std::sqrt(v2), theta_norm = Norm(theta);
  const double limit = max_ratio * (theta_norm + 1);
  if (std::isfinite(norm) && norm <= limit) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "outer gradient norm {:.4g} is absurd for a fragment of norm {:.4g} (limit {:.4g} = {:g} x (norm + 1))",
      norm, theta_norm, limit, max_ratio));
}

Status CheckRoundResult(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep, double max_ratio) {
  if (!Finite(theta_after)) return FailedPreconditionError("the outer step made the fragment non-finite");
  if (!Finite(momentum)) return FailedPreconditionError("the outer step made the momentum buffer non-finite");
  if (!Finite(sweep.accum) || !Finite(sweep.start) || !std::isfinite(sweep.share)) {
    return FailedPreconditionError("the outer step made the sweep accumulator non-finite");
  }
  if (max_ratio <= 0 || theta_before.size() != theta_after.size()) return Status::Ok();
  double step2 = 0;
  for (size_t i = 0; i < theta_after.size(); ++i) {
    const double d = static_cast<double>(theta_after[i]) - theta_before[i];
    step2 += d * d;
  }
  const double step = std::sqrt(step2), before = Norm(theta_before), mom = Norm(momentum);
  const double limit = max_ratio * (before + 1);
  if (!std::isfinite(step) || step > limit) {
    return FailedPreconditionError(fmt::format("step norm {:.4g} exceeds {:.4g} = {:g} x (|theta| {:.4g} + 1)",
                                               step, limit, max_ratio, before));
  }
  if (!std::isfinite(mom) || mom > limit) {
    return FailedPreconditionError(fmt::format("momentum norm {:.4g} exceeds {:.4g} = {:g} x (|theta| {:.4g} + 1)",
                                               mom, limit, max_ratio, before));
  }
  return Status::Ok();
}

int BoundTelemetry(LearnerProgress& p, const LearnerProgress& previous) {
  int out = 0;
  auto bound_d = [&out](double& v, double prev, double hi) {
    if (!InRange(v, 0, hi)) {
      v = prev;
      ++out;
    }
  };
  auto bound_i = [&out](int64_t& v, int64_t prev) {
    if (v < 0 || v > kMaxCounter) {
      v = prev;
      ++out;
    }
  };
  bound_d(p.step_seconds, previous.step_seconds, kMaxStepSeconds);
  bound_d(p.tokens_per_second, previous.tokens_per_second, kMaxTokensPerSecond);
  bound_d(p.loss, previous.loss, kMaxLoss);
  bound_i(p.step, previous.step);
  bound_i(p.tokens, previous.tokens);
  if (p.version_held < -1 || p.version_held > kMaxCounter) {
    p.version_held = previous.version_held;
    ++out;
  }
  return out;
}

}  // namespace atl::syncer
