#include "atoll/diloco/outer_optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

Status CheckOptions(const OuterOptimizerOptions& options) {
  if (!std::isfinite(options.lr) || options.lr < 0) {
    return InvalidArgumentError("outer step: lr must be finite and ≥ 0, got " + std::to_string(options.lr));
  }
  if (!std::isfinite(options.momentum) || options.momentum < 0 || options.momentum >= 1) {
    return InvalidArgumentError("outer step: momentum must be in [0, 1), got " +
                                std::to_string(options.momentum));
  }
  return Status::Ok();
}

// The running sweep (see the header): Θ = Θ_s − lr·(ĝ + μ·(μ·b + ĝ)) between rounds, ĝ = a/S; at
// S ≥ 1 b ← μ·b + a and Θ = Θ_s − lr·(a + μ·b), then Θ_s ← Θ.
SweepResult RunningSweepStep(double lr, double mu, std::span<const float> merged, double rho, SweepState& state,
                             std::span<float> momentum_buffer, std::span<float> theta) {
  const size_t n = theta.size();
  if (state.start.size() != n) state.start.assign(theta.begin(), theta.end());
  for (size_t i = 0; i < n; ++i) {
    state.accum[i] = static_cast<float>(static_cast<double>(state.accum[i]) + rho * static_cast<double>(merged[i]));
  }
  state.share += rho;
  const double S = state.share;
  const bool complete = S >= 1.0 - 1e-9;
  double moved2 = 0;
  float* b = momentum_buffer.data();
  float* t = theta.data();
  const float* t0 = state.start.data();
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(state.accum[i]) / S;
    const float before = t[i];
    if (complete) {
      const double bi = mu * static_cast<double>(b[i]) + S * g;
      b[i] = static_cast<float>(bi);
      t[i] = static_cast<float>(static_cast<double>(t0[i]) - lr * (S * g + mu * bi));
    } else {
      const double bi = mu * static_cast<double>(b[i]) + g;  // not stored: the estimate only
      t[i] = static_cast<float>(static_cast<double>(t0[i]) - lr * (g + mu * bi));
    }
    const double d = static_cast<double>(t[i]) - before;
    moved2 += d * d;
  }
  SweepResult result;
  result.step_norm = std::sqrt(moved2);
  if (complete) {
    std::fill(state.accum.begin(), state.accum.end(), 0.0f);
    state.share = 0;
    state.sweeps += 1;
    state.start.assign(theta.begin(), theta.end());
    result.sweep_completed = true;
  }
  return result;
}

}  // namespace


Status OuterStep(const OuterOptimizerOptions& options, std::span<const float> delta,
                 std::span<float> momentum_buffer, std::span<float> theta) {
  // μ = 0 needs no momentum: the buffer may then be empty (the syncer allocates none).
  const bool no_momentum = options.momentum == 0 && momentum_buffer.empty();
  if (delta.size() != theta.size() || (!no_momentum && momentum_buffer.size() != theta.size())) {
    return InvalidArgumentError("outer step: lengths differ (delta " + std::to_string(delta.size()) +
                                ", momentum " + std::to_string(momentum_buffer.size()) +
                                ", theta " + std::to_string(theta.size()) + ")");
  }
  ATOLL_RETURN_IF_ERROR(CheckOptions(options));
  // Intermediates in double; the stored state is fp32. The Nesterov update uses the new momentum
  // before it is rounded, so plain SGD (μ = 0) is exactly θ − lr·Δ rounded once.
  const double lr = options.lr;
  const double mu = options.momentum;
  const size_t n = theta.size();
  const float* d = delta.data();
  float* b = momentum_buffer.data();
  float* t = theta.data();
  if (no_momentum) {  // θ − lr·Δ: what both updates below compute at μ = 0
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<float>(static_cast<double>(t[i]) - lr * static_cast<double>(d[i]));
    return Status::Ok();
  }
  if (options.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const double di = static_cast<double>(d[i]);
      const double bi = mu * static_cast<double>(b[i]) + di;
      b[i] = static_cast<float>(bi);
      t[i] = static_cast<float>(static_cast<double>(t[i]) - lr * (di + mu * bi));
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const double bi = mu * static_cast<double>(b[i]) + static_cast<double>(d[i]);
      b[i] = static_cast<float>(bi);
      t[i] = static_cast<float>(static_cast<double>(t[i]) - lr * bi);
    }
  }
  return Status::Ok();
}


StatusOr<SweepResult> SweepOuterStep(const OuterOptimizerOptions& options, const Fragment& fragment,
                                     std::span<const float> merged, double rho, SweepState& state,
                                     std::span<float> momentum_buffer, std::span<float> theta, bool extrapolate) {
  const size_t n = theta.size();
  // μ = 0 without extrapolation keeps no momentum and no accumulator (the completing step is 0).
  const bool stateless = options.momentum == 0 && !extrapolate && momentum_buffer.empty();
  if (merged.size() != n || (!stateless && momentum_buffer.size() != n) || static_cast<int64_t>(n) != fragment.numel) {
    return InvalidArgumentError("sweep outer step: lengths differ (merged " + std::to_string(merged.size()) +
                                ", momentum " + std::to_string(momentum_buffer.size()) + ", theta " +
                                std::to_string(n) + ", fragment " + std::to_string(fragment.numel) + ")");
  }
  ATOLL_RETURN_IF_ERROR(CheckOptions(options));
  if (!(rho > 0 && rho <= 1)) {
    return InvalidArgumentError("sweep outer step: token share must be in (0, 1], got " + std::to_string(rho));
  }
  if (!stateless && state.accum.size() != n) {
    state.accum.assign(n, 0.0f);
    state.share = 0;
  }
  const double lr = options.lr;
  const double mu = options.momentum;
  if (extrapolate) return RunningSweepStep(lr, mu, merged, rho, state, momentum_buffer, theta);
  double moved2 = 0;
  // The round's own share, applied at once.
  for (size_t i = 0; i < n; ++i) {
    const double g = rho * static_cast<double>(merged[i]);
    const float before = theta[i];
    theta[i] = static_cast<float>(static_cast<double>(theta[i]) - lr * g);
    if (!stateless) state.accum[i] = static_cast<float>(static_cast<double>(state.accum[i]) + g);
    const double d = static_cast<double>(theta[i]) - before;
    moved2 += d * d;
  }
  state.share += rho;
  SweepResult result;
  if (state.share < 1.0 - 1e-9) {
    result.step_norm = std::sqrt(moved2);
    return result;
  }
  // A sweep: the rounds moved Θ by lr·a already; the momentum takes the sweep's sum (S·ĝ = a) and
  // adds its Nesterov look-ahead (none at μ = 0, decoupled mode's default).
  for (size_t i = 0; i < n && !stateless; ++i) {
    const double bi = mu * static_cast<double>(momentum_buffer[i]) + static_cast<double>(state.accum[i]);
    momentum_buffer[i] = static_cast<float>(bi);
    const float before = theta[i];
    theta[i] = static_cast<float>(static_cast<double>(theta[i]) - lr * mu * bi);
    const double d = static_cast<double>(theta[i]) - before;
    moved2 += d * d;
  }
  std::fill(state.accum.begin(), state.accum.end(), 0.0f);
  state.share = 0;
  state.sweeps += 1;
  result.sweep_completed = true;
  result.step_norm = std::sqrt(moved2);
  return result;
}

}  // namespace atl::diloco
