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
Status CheckOuterGradientBound(std::span<const float> theta, std::span<const float> values, bool against_current,
                               double max_ratio);
// The same bound on norms already measured (‖v‖ and ‖Θ_p‖).
Status CheckOuterGradientBound(double gradient_norm, double theta_norm, double max_ratio);

// After a round's outer step, before anything is committed: Θ_p, the momentum buffer and the
// sweep accumulator must be finite, and ‖Θ_after − Θ_before‖ and ‖momentum‖ at most
// max_ratio × (‖Θ_before‖ + 1) (max_ratio ≤ 0: finiteness only). FailedPrecondition says which.
Status CheckRoundResult(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep, double max_ratio);
// What that check reads of a round, as the round's tiled pass measures it (docs/decisions/018).
struct RoundNorms {
  bool theta_finite = true, momentum_finite = true, sweep_finite = true;
  double theta_before = 0;  // ‖Θ_before‖
  double step = 0;          // ‖Θ_after − Θ_before‖
  double momentum = 0;      // ‖momentum‖ after the step (0 when the round left it as it was)
};
Status CheckRoundResult(const RoundNorms& norms, double max_ratio);
// The norms of a round from whole buffers (reduce.h's chunked sums).
RoundNorms MeasureRound(std::span<const float> theta_before, std::span<const float> theta_after,
                        std::span<const float> momentum, const diloco::SweepState& sweep);

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
