// Guards of the syncer against hostile or broken input (docs/security.md): numeric bounds on
// what a push may carry and what a round may do to Θ_p, and the sane range of every telemetry
// value that feeds the round policy. Pure functions; no state.
// Thread-safety: pure functions.
#pragma once

#include <span>

#include "atoll/core/status.h"
#include "atoll/diloco/outer_optimizer.h"
#include "atoll/syncer/api.h"

namespace atl::syncer {

// Push time: refuses (InvalidArgument) an outer gradient whose norm exceeds
// max_ratio × (‖Θ_p‖ + 1). `values` holds θ_m (against_current: v = Θ_p − θ_m) or v itself.
// Holds from the first push, with no history. max_ratio ≤ 0 turns the check off.
Status CheckOuterGradientBound(std::span<const float> theta, std::span<const float> values,
                               bool against_current, double max_ratio);

// After a round's outer step, before anything is committed: Θ_p, the momentum buffer and the
// sweep accumulator must be finite, and ‖Θ_after − Θ_before‖ and ‖momentum‖ at most
// max_ratio × (‖Θ_before‖ + 1) (max_ratio ≤ 0: finiteness only). FailedPrecondition says which.
Status CheckRoundResult(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep, double max_ratio);

// Telemetry of a heartbeat, bounded before it feeds the learner table and RoundEstimates: a
// value out of its sane range (negative, non-finite, step_seconds > 1 h, loss > 1e6, tokens/s >
// 1e12, counters > 1e15) is replaced by the learner's previous value `previous`. Returns how many
// values were out of range.
int BoundTelemetry(LearnerProgress& progress, const LearnerProgress& previous);

inline constexpr double kMaxStepSeconds = 3600.0;
inline constexpr double kMaxLoss = 1e6;
inline constexpr double kMaxTokensPerSecond = 1e12;
inline constexpr int64_t kMaxCounter = 1'000'000'000'000'000;

}  // namespace atl::syncer
