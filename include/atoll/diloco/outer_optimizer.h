// The outer optimizer the syncer applies to each fragment after a merge: SGD with Nesterov
// momentum on fp32 state (DiLoCo: lr 0.7, momentum 0.9).
//   b ← μ·b + Δ
//   θ ← θ − lr·(Δ + μ·b)      (Nesterov)
//   θ ← θ − lr·b              (classic momentum, nesterov = false)
// μ = 0 is plain SGD: θ ← θ − lr·Δ. Δ is the merged outer gradient (global − local, so a
// positive step moves Θ toward the learners).
// Thread-safety: pure function over caller-owned buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"

namespace atl::diloco {

struct OuterOptimizerOptions {
  double lr = 0.7;
  double momentum = 0.9;
  bool nesterov = true;
};

// Applies one outer step in place. InvalidArgument when lengths differ or options are not finite
// or lr < 0 or momentum ∉ [0, 1). At momentum 0 the buffer may be empty (none is kept).
Status OuterStep(const OuterOptimizerOptions& options, std::span<const float> delta, std::span<float> momentum_buffer,
                 std::span<float> theta);

}  // namespace atl::diloco

namespace atl::diloco {

// The sweep outer step: Nesterov on partial rounds without amplifying them (docs/decisions/007).
//
// In synchronous DiLoCo every outer step merges all M learners. In Decoupled DiLoCo with K = 1 a
// round of a fragment may hold one learner's outer gradient; a full Nesterov step per such round
// moves Θ about M times as far per token and feeds momentum with partial, noisy gradients (the
// outer loop amplifies instead of averaging). The sweep step scales each round by the share of a
// full round's tokens it holds and updates momentum once per full round's worth of tokens:
//
//   round r with merged outer gradient g_r (token-weighted RDA/mean over its contributors) and
//   token share ρ_r = Σ_contributors c_tokens / (H · Σ_live learners tokens-per-step), ρ_r ∈ (0,1]:
//     Θ ← Θ − lr·ρ_r·g_r              (applied at once: every contribution reaches Θ now)
//     a ← a + ρ_r·g_r,  S ← S + ρ_r
//   when S ≥ 1 (a sweep: one full round's worth of tokens has arrived):
//     b ← μ·b + a
//     Θ ← Θ − lr·μ·b                  (completes the sweep to the synchronous Nesterov step)
//     a ← 0, S ← 0
//
// Over a sweep Θ moves by lr·(a + μ·b): the synchronous Nesterov step on the sweep's
// contributions, whether they came in one round or in many. One round with ρ = 1 is one
// synchronous DiLoCo step (up to fp32 rounding); μ = 0, lr = 1 is asynchronous model averaging
// (each round moves Θ by its share). This is delayed Nesterov (Liu et al. 2024) with the delay
// counted in tokens rather than arrivals.
//
// RDA (merge.h) acts inside a round, on the outer gradients of the learners merged together —
// all taken against the same Θ_p. It is not applied again across the rounds of a sweep (it was,
// until the eighth session): a sweep's rounds are not independent, each later outer gradient is
// taken against a Θ the earlier rounds moved and partly undoes them, so restoring the norm of
// their cancelled sum threw Θ past every learner along a direction none of them moved in (the
// last rounds of a 2-learner run — one learner's final push, then the other's alone — left a
// global model worse than its initial one; decision 007's amendment has the measurements).
//
// The running sweep (extrapolate = true) keeps Θ at the sweep's start, Θ_s, and between rounds
// holds Θ at the synchronous step *estimated* from what has arrived so far:
//     Θ = Θ_s − lr·(ĝ + μ·(μ·b + ĝ)),  ĝ = a/S  (momentum b not yet updated)
// so the first learner of a sweep gets back its own progress (× the outer step), not a 1/M share
// of it, and the sweep ends at the same synchronous step. Under it an outer gradient taken
// "against the current value" is taken against Θ_s (`start`).
struct SweepState {
  std::vector<float> start;  // Θ_s (running sweep only; empty until first used)
  std::vector<float> accum;  // a: Σ ρ_r·g_r since the last sweep (fragment layout)
  double share = 0;          // S: Σ ρ_r since the last sweep
  int64_t sweeps = 0;        // sweeps completed (momentum updates)
};

struct SweepResult {
  bool sweep_completed = false;
  double step_norm = 0;  // ‖Θ_after − Θ_before‖ of this call
};

// Applies round r to Θ_p per the formulas above. `state` is sized on first use; at μ = 0 without
// extrapolation an empty momentum buffer means no state at all (a, b would never move Θ). InvalidArgument
// when lengths differ (`fragment.numel` included), ρ ∉ (0, 1], or the optimizer options are
// invalid; on error nothing changes.
StatusOr<SweepResult> SweepOuterStep(const OuterOptimizerOptions& options, const Fragment& fragment,
                                     std::span<const float> merged, double rho, SweepState& state,
                                     std::span<float> momentum_buffer, std::span<float> theta,
                                     bool extrapolate = false);

// The outer step one range of values at a time, for a caller that fuses it into a pass over
// tiles (the syncer merges, steps and advances the public copy in one pass). OuterStep and
// SweepOuterStep are this kernel over the whole fragment, so both give the same bits.
enum class OuterStepKind { kRound, kSweep, kRunning };

// Whole-fragment buffers, read at [begin, end) of Apply; each *_out is written there and may be
// its input. Null when the step keeps no such state (see the kernel's keeps_*).
struct OuterStepSpans {
  const float* theta = nullptr;
  float* theta_out = nullptr;
  const float* momentum = nullptr;
  float* momentum_out = nullptr;
  const float* accum = nullptr;  // the sweep's a (null while it has not been sized: zeros)
  float* accum_out = nullptr;
  const float* start = nullptr;  // the running sweep's Θ_s (null on first use: Θ itself)
  float* start_out = nullptr;
};

class OuterStepKernel {
 public:
  // `kind` kRound is OuterStep (ρ, share unused); kSweep/kRunning are SweepOuterStep without and
  // with extrapolation, `share` being the sweep's S before this round (0 when its accumulator is
  // still unsized). `momentum`: whether a momentum buffer is kept (at μ = 0 it may not be).
  // InvalidArgument for invalid options, a missing momentum buffer that the step needs, or (sweeps)
  // ρ ∉ (0, 1].
  static StatusOr<OuterStepKernel> Create(const OuterOptimizerOptions& options, OuterStepKind kind, double rho,
                                          double share, bool momentum);
  bool keeps_momentum() const { return momentum_; }
  bool keeps_accum() const { return kind_ != OuterStepKind::kRound && !stateless_; }
  bool keeps_start() const { return kind_ == OuterStepKind::kRunning; }
  bool completes_sweep() const { return complete_; }
  // Moves values [begin, end); merged[i − begin] is value i's merged outer gradient. Returns
  // Σ (Θ_after − Θ_before)² over the range, with SumSquares' 8 lanes.
  double Apply(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const;
  // What numeric safety reads of a range the step moved, each sum with SumSquares' lanes over the
  // range: Σ Θ_before², Σ Θ_after², Σ (Θ_after − Θ_before)², and whether every Θ_after is finite.
  struct Measures {
    double before2 = 0, after2 = 0, step2 = 0;
    bool finite = true;
  };
  // Apply, with the range measured: the same bits as Apply and SumSquares, in one loop for the
  // stateless step. In place (s.theta_out == s.theta) Θ_before is saved into saved[0, end − begin)
  // first (for a roll-back); out of place `saved` may be null (Θ_before stays in s.theta).
  Measures ApplyMeasured(size_t begin, size_t end, const float* merged, const OuterStepSpans& s, float* saved) const;
  // The sweep's S and count after this round (kRound: nothing).
  void Finish(SweepState& state) const;

 private:
  double RoundStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const;
  double SweepStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const;
  double RunningStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const;

  OuterStepKind kind_ = OuterStepKind::kRound;
  double lr_ = 0, mu_ = 0, rho_ = 1, share_after_ = 0;
  bool nesterov_ = true, momentum_ = false, stateless_ = false, complete_ = false;
};

}  // namespace atl::diloco
