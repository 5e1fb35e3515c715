#include "atoll/syncer/guards.h"

#include "atoll/diloco/reduce.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace atl::syncer {
namespace {

bool Finite(std::span<const float> x) {
  for (float v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

bool InRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

Status CheckOuterGradientBound(double norm, double theta_norm, double max_ratio) {
  if (max_ratio <= 0) return Status::Ok();
  const double limit = max_ratio * (theta_norm + 1);
  if (std::isfinite(norm) && norm <= limit) return Status::Ok();
  return InvalidArgumentError(fmt::format(
      "outer gradient norm {:.4g} is absurd for a fragment of norm {:.4g} (limit {:.4g} = {:g} x (norm + 1))", norm,
      theta_norm, limit, max_ratio));
}

Status CheckOuterGradientBound(std::span<const float> theta, std::span<const float> values, bool against_current,
                               double max_ratio) {
  if (max_ratio <= 0 || theta.size() != values.size()) return Status::Ok();
  double v2 = 0;
  if (against_current) {
    for (size_t b = 0; b < values.size(); b += diloco::kReduceChunk) {
      v2 += diloco::SumSquaredDifferences(theta.data() + b, values.data() + b,
                                          std::min(diloco::kReduceChunk, values.size() - b));
    }
  } else {
    v2 = diloco::ChunkedSumSquares(values);
  }
  return CheckOuterGradientBound(std::sqrt(v2), std::sqrt(diloco::ChunkedSumSquares(theta)), max_ratio);
}

RoundNorms MeasureRound(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep) {
  RoundNorms n;
  n.theta_finite = Finite(theta_after);
  n.momentum_finite = Finite(momentum);
  n.sweep_finite = Finite(sweep.accum) && Finite(sweep.start) && std::isfinite(sweep.share);
  n.theta_before = std::sqrt(diloco::ChunkedSumSquares(theta_before));
  double step2 = 0;
  if (theta_before.size() == theta_after.size()) {
    for (size_t b = 0; b < theta_after.size(); b += diloco::kReduceChunk) {
      step2 += diloco::SumSquaredDifferences(theta_after.data() + b, theta_before.data() + b,
                                             std::min(diloco::kReduceChunk, theta_after.size() - b));
    }
  }
  n.step = std::sqrt(step2);
  n.momentum = std::sqrt(diloco::ChunkedSumSquares(momentum));
  return n;
}

Status CheckRoundResult(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep, double max_ratio) {
  return CheckRoundResult(MeasureRound(theta_before, theta_after, momentum, sweep), max_ratio);
}

Status CheckRoundResult(const RoundNorms& n, double max_ratio) {
  if (!n.theta_finite) return FailedPreconditionError("the outer step made the fragment non-finite");
  if (!n.momentum_finite) return FailedPreconditionError("the outer step made the momentum buffer non-finite");
  if (!n.sweep_finite) return FailedPreconditionError("the outer step made the sweep accumulator non-finite");
  if (max_ratio <= 0) return Status::Ok();
  const double limit = max_ratio * (n.theta_before + 1);
  if (!std::isfinite(n.step) || n.step > limit) {
    return FailedPreconditionError(fmt::format("step norm {:.4g} exceeds {:.4g} = {:g} x (|theta| {:.4g} + 1)", n.step,
                                               limit, max_ratio, n.theta_before));
  }
  if (!std::isfinite(n.momentum) || n.momentum > limit) {
    return FailedPreconditionError(fmt::format("momentum norm {:.4g} exceeds {:.4g} = {:g} x (|theta| {:.4g} + 1)",
                                               n.momentum, limit, max_ratio, n.theta_before));
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
