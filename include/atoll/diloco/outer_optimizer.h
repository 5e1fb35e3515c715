// The outer optimizer the syncer applies to each fragment after a merge: SGD with Nesterov
// momentum on fp32 state (DiLoCo: lr 0.7, momentum 0.9).
//   b ← μ·b + Δ
//   θ ← θ − lr·(Δ + μ·b)      (Nesterov)
//   θ ← θ − lr·b              (classic momentum, nesterov = false)
// μ = 0 is plain SGD: θ ← θ − lr·Δ. Δ is the merged outer gradient (global − local, so a
// positive step moves Θ toward the learners).
// Thread-safety: pure function over caller-owned buffers.
#pragma once

#include <span>

#include "atoll/core/status.h"

namespace atl::diloco {

struct OuterOptimizerOptions {
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
};

// Applies one outer step in place. InvalidArgument when lengths differ or options are not finite
// or lr < 0 or momentum ∉ [0, 1).
Status OuterStep(const OuterOptimizerOptions& options, std::span<const float> delta,
                 std::span<float> momentum_buffer, std::span<float> theta);

}  // namespace atl::diloco
