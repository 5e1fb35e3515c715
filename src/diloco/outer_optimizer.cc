#include "atoll/diloco/outer_optimizer.h"

#include <cmath>
#include <string>

namespace atl::diloco {

Status OuterStep(const OuterOptimizerOptions& options, std::span<const float> delta,
                 std::span<float> momentum_buffer, std::span<float> theta) {
  if (delta.size() != theta.size() || momentum_buffer.size() != theta.size()) {
    return InvalidArgumentError("outer step: lengths differ (delta " + std::to_string(delta.size()) +
                                ", momentum " + std::to_string(momentum_buffer.size()) +
                                ", theta " + std::to_string(theta.size()) + ")");
  }
  if (!std::isfinite(options.lr) || options.lr < 0) {
    return InvalidArgumentError("outer step: lr must be finite and ≥ 0, got " +
                                std::to_string(options.lr));
  }
  if (!std::isfinite(options.momentum) || options.momentum < 0 || options.momentum >= 1) {
    return InvalidArgumentError("outer step: momentum must be in [0, 1), got " +
                                std::to_string(options.momentum));
  }
  // Intermediates in double; the stored state is fp32. The Nesterov update uses the new momentum
  // before it is rounded, so plain SGD (μ = 0) is exactly θ − lr·Δ rounded once.
  const double lr = options.lr;
  const double mu = options.momentum;
  const size_t n = theta.size();
  const float* d = delta.data();
  float* b = momentum_buffer.data();
  float* t = theta.data();
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

}  // namespace atl::diloco
