#include "atoll/diloco/outer_optimizer.h"

#include "atoll/core/simd.h"
#include "atoll/diloco/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

Status CheckOptions(const OuterOptimizerOptions& options) {
  if (!std::isfinite(options.lr) || options.lr < 0) {
    return InvalidArgumentError("outer step: lr must be finite and ≥ 0, got " + std::to_string(options.lr));
  }
  if (!std::isfinite(options.momentum) || options.momentum < 0 || options.momentum >= 1) {
    return InvalidArgumentError("outer step: momentum must be in [0, 1), got " + std::to_string(options.momentum));
  }
  return Status::Ok();
}

constexpr size_t kLanes = 8;

// Runs step(i) — which moves value i and returns (Θ_after − Θ_before)² — over [begin, end) and
// sums the squares in 8 lanes, as SumSquares does (reduce.h).
template <typename Step>
double LaneSum(size_t begin, size_t end, Step step) {
  double acc[kLanes] = {};
  size_t i = begin;
  for (; i + kLanes <= end; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) acc[k] += step(i + k);
  }
  double tail = 0;
  for (; i < end; ++i) tail += step(i);
  double sum = 0;
  for (double x : acc) sum += x;
  return sum + tail;
}

inline double Moved(float after, float before) {
  const double d = static_cast<double>(after) - static_cast<double>(before);
  return d * d;
}

// θ − lr·(ρ·m) in place, the stateless step of both kinds (ρ = 1: θ − lr·m exactly, as 1·m is m):
// the default decoupled step, in one loop that vectorises. Returns Σ (Θ_after − Θ_before)² in
// LaneSum's lanes.
ATOLL_SIMD_CLONES double StatelessInPlace(float* theta, const float* __restrict m, double lr, double rho, size_t n) {
  double acc[kLanes] = {};
  size_t i = 0;
  const auto step = [&](size_t j) {
    const float before = theta[j];
    const float t = static_cast<float>(static_cast<double>(before) - lr * (rho * static_cast<double>(m[j])));
    theta[j] = t;
    return Moved(t, before);
  };
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) acc[k] += step(i + k);
  }
  double tail = 0;
  for (; i < n; ++i) tail += step(i);
  double sum = 0;
  for (double x : acc) sum += x;
  return sum + tail;
}

// StatelessInPlace that also measures the range (ApplyMeasured), in one loop instead of the step,
// two sums of squares and a finiteness scan: Θ_after into `out`, which is `in` itself with Θ_before
// saved into `saved` (kSave), or another buffer (Θ_before stays in `in`).
template <bool kSave>
[[gnu::always_inline]] inline OuterStepKernel::Measures StatelessMeasuredBody(const float* in, float* out,
                                                                              const float* __restrict m, float* saved,
                                                                              double lr, double rho, size_t n) {
  double b2[kLanes] = {}, a2[kLanes] = {}, s2[kLanes] = {};
  uint32_t bad[kLanes] = {};
  const auto step = [&](size_t j, double& bl, double& al, double& sl, uint32_t& badl) {
    const float before = in[j];
    const float t = static_cast<float>(static_cast<double>(before) - lr * (rho * static_cast<double>(m[j])));
    if constexpr (kSave) saved[j] = before;
    out[j] = t;
    bl += static_cast<double>(before) * static_cast<double>(before);
    al += static_cast<double>(t) * static_cast<double>(t);
    sl += Moved(t, before);
    badl |= static_cast<uint32_t>((std::bit_cast<uint32_t>(t) & 0x7f800000u) == 0x7f800000u);
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) step(i + k, b2[k], a2[k], s2[k], bad[k]);
  }
  double tb = 0, ta = 0, ts = 0;
  uint32_t tbad = 0;
  for (; i < n; ++i) step(i, tb, ta, ts, tbad);
  OuterStepKernel::Measures out_measures;
  for (size_t k = 0; k < kLanes; ++k) {
    out_measures.before2 += b2[k];
    out_measures.after2 += a2[k];
    out_measures.step2 += s2[k];
    tbad |= bad[k];
  }
  out_measures.before2 += tb;
  out_measures.after2 += ta;
  out_measures.step2 += ts;
  out_measures.finite = tbad == 0;
  return out_measures;
}

ATOLL_SIMD_CLONES OuterStepKernel::Measures StatelessMeasured(float* theta, const float* __restrict m,
                                                              float* __restrict saved, double lr, double rho,
                                                              size_t n) {
  return StatelessMeasuredBody<true>(theta, theta, m, saved, lr, rho, n);
}

ATOLL_SIMD_CLONES OuterStepKernel::Measures StatelessMeasuredTo(const float* __restrict in, float* __restrict out,
                                                                const float* __restrict m, double lr, double rho,
                                                                size_t n) {
  return StatelessMeasuredBody<false>(in, out, m, nullptr, lr, rho, n);
}

}  // namespace

StatusOr<OuterStepKernel> OuterStepKernel::Create(const OuterOptimizerOptions& options, OuterStepKind kind, double rho,
                                                  double share, bool momentum) {
  ATOLL_RETURN_IF_ERROR(CheckOptions(options));
  if (kind != OuterStepKind::kRound && !(rho > 0 && rho <= 1)) {
    return InvalidArgumentError("sweep outer step: token share must be in (0, 1], got " + std::to_string(rho));
  }
  OuterStepKernel k;
  k.kind_ = kind;
  k.lr_ = options.lr;
  k.mu_ = options.momentum;
  k.nesterov_ = options.nesterov;
  k.momentum_ = momentum;
  k.rho_ = rho;
  // μ = 0 without extrapolation needs no state: no momentum, and a sweep's completing step is 0.
  k.stateless_ = options.momentum == 0 && !momentum && kind != OuterStepKind::kRunning;
  if (!k.stateless_ && !momentum) return InvalidArgumentError("outer step: this step needs a momentum buffer");
  if (kind != OuterStepKind::kRound) {
    k.share_after_ = share + rho;
    k.complete_ = k.share_after_ >= 1.0 - 1e-9;
  }
  return k;
}

double OuterStepKernel::Apply(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const {
  switch (kind_) {
    case OuterStepKind::kRound: return RoundStep(begin, end, merged, s);
    case OuterStepKind::kSweep: return SweepStep(begin, end, merged, s);
    case OuterStepKind::kRunning: return RunningStep(begin, end, merged, s);
  }
  return 0;
}

// Intermediates in double; the stored state is fp32. The Nesterov update uses the new momentum
// before it is rounded, so plain SGD (μ = 0) is exactly θ − lr·Δ rounded once.
double OuterStepKernel::RoundStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const {
  const float* d = merged - begin;
  const double lr = lr_, mu = mu_;
  if (stateless_ && s.theta_out == s.theta) return StatelessInPlace(s.theta_out + begin, merged, lr, 1.0, end - begin);
  if (stateless_) {  // θ − lr·Δ: what both updates below compute at μ = 0
    return LaneSum(begin, end, [&](size_t i) {
      const float before = s.theta[i];
      s.theta_out[i] = static_cast<float>(static_cast<double>(before) - lr * static_cast<double>(d[i]));
      return Moved(s.theta_out[i], before);
    });
  }
  return LaneSum(begin, end, [&](size_t i) {
    const float before = s.theta[i];
    const double di = static_cast<double>(d[i]);
    const double bi = mu * static_cast<double>(s.momentum[i]) + di;
    s.momentum_out[i] = static_cast<float>(bi);
    s.theta_out[i] = static_cast<float>(static_cast<double>(before) - lr * (nesterov_ ? di + mu * bi : bi));
    return Moved(s.theta_out[i], before);
  });
}

// The round's own share at once; at a sweep's end the momentum takes the sweep's sum (S·ĝ = a) and
// adds its Nesterov look-ahead (none at μ = 0, decoupled mode's default).
double OuterStepKernel::SweepStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const {
  const float* m = merged - begin;
  const double lr = lr_, mu = mu_, rho = rho_;
  if (stateless_ && s.theta_out == s.theta) return StatelessInPlace(s.theta_out + begin, merged, lr, rho, end - begin);
  return LaneSum(begin, end, [&](size_t i) {
    const double g = rho * static_cast<double>(m[i]);
    const float before = s.theta[i];
    float t = static_cast<float>(static_cast<double>(before) - lr * g);
    if (!stateless_) {
      const float a = static_cast<float>(static_cast<double>(s.accum != nullptr ? s.accum[i] : 0.0f) + g);
      if (complete_) {
        const double bi = mu * static_cast<double>(s.momentum[i]) + static_cast<double>(a);
        s.momentum_out[i] = static_cast<float>(bi);
        t = static_cast<float>(static_cast<double>(t) - lr * mu * bi);
        s.accum_out[i] = 0.0f;
      } else {
        s.accum_out[i] = a;
        if (s.momentum_out != s.momentum) s.momentum_out[i] = s.momentum[i];
      }
    }
    s.theta_out[i] = t;
    return Moved(t, before);
  });
}

// Θ = Θ_s − lr·(ĝ + μ·(μ·b + ĝ)) between rounds, ĝ = a/S; at S ≥ 1 b ← μ·b + a and
// Θ = Θ_s − lr·(a + μ·b), then Θ_s ← Θ.
double OuterStepKernel::RunningStep(size_t begin, size_t end, const float* merged, const OuterStepSpans& s) const {
  const float* m = merged - begin;
  const double lr = lr_, mu = mu_, rho = rho_, S = share_after_;
  return LaneSum(begin, end, [&](size_t i) {
    const float a = static_cast<float>(static_cast<double>(s.accum != nullptr ? s.accum[i] : 0.0f) +
                                       rho * static_cast<double>(m[i]));
    const double g = static_cast<double>(a) / S;
    const float before = s.theta[i];
    const float t0 = s.start != nullptr ? s.start[i] : before;
    float t;
    if (complete_) {
      const double bi = mu * static_cast<double>(s.momentum[i]) + S * g;
      s.momentum_out[i] = static_cast<float>(bi);
      t = static_cast<float>(static_cast<double>(t0) - lr * (S * g + mu * bi));
      s.accum_out[i] = 0.0f;
      s.start_out[i] = t;
    } else {
      const double bi = mu * static_cast<double>(s.momentum[i]) + g;  // not stored: the estimate only
      t = static_cast<float>(static_cast<double>(t0) - lr * (g + mu * bi));
      if (s.momentum_out != s.momentum) s.momentum_out[i] = s.momentum[i];
      s.accum_out[i] = a;
      s.start_out[i] = t0;
    }
    s.theta_out[i] = t;
    return Moved(t, before);
  });
}

OuterStepKernel::Measures OuterStepKernel::ApplyMeasured(size_t begin, size_t end, const float* merged,
                                                         const OuterStepSpans& s, float* saved) const {
  const size_t n = end - begin;
  const double rho = kind_ == OuterStepKind::kRound ? 1.0 : rho_;
  const bool in_place = s.theta_out == s.theta;
  ATOLL_CHECK(!in_place || saved != nullptr);
  if (stateless_ && in_place) return StatelessMeasured(s.theta_out + begin, merged, saved, lr_, rho, n);
  if (stateless_ && saved == nullptr) {  // stateless_: never kRunning
    return StatelessMeasuredTo(s.theta + begin, s.theta_out + begin, merged, lr_, rho, n);
  }
  if (saved != nullptr) std::copy(s.theta + begin, s.theta + end, saved);
  Measures out;
  out.before2 = SumSquares(saved != nullptr ? saved : s.theta + begin, n);
  out.step2 = Apply(begin, end, merged, s);
  out.after2 = SumSquares(s.theta_out + begin, n);
  for (size_t i = begin; i < end; ++i) out.finite &= std::isfinite(s.theta_out[i]);
  return out;
}

void OuterStepKernel::Finish(SweepState& state) const {
  if (kind_ == OuterStepKind::kRound) return;
  if (complete_) {
    state.share = 0;
    state.sweeps += 1;
  } else {
    state.share = share_after_;
  }
}

Status OuterStep(const OuterOptimizerOptions& options, std::span<const float> delta, std::span<float> momentum_buffer,
                 std::span<float> theta) {
  // μ = 0 needs no momentum: the buffer may then be empty (the syncer allocates none).
  const bool no_momentum = options.momentum == 0 && momentum_buffer.empty();
  if (delta.size() != theta.size() || (!no_momentum && momentum_buffer.size() != theta.size())) {
    return InvalidArgumentError("outer step: lengths differ (delta " + std::to_string(delta.size()) + ", momentum " +
                                std::to_string(momentum_buffer.size()) + ", theta " + std::to_string(theta.size()) +
                                ")");
  }
  ATOLL_ASSIGN_OR_RETURN(OuterStepKernel k,
                         OuterStepKernel::Create(options, OuterStepKind::kRound, 1.0, 0.0, !momentum_buffer.empty()));
  OuterStepSpans s{.theta = theta.data(),
                   .theta_out = theta.data(),
                   .momentum = momentum_buffer.data(),
                   .momentum_out = momentum_buffer.data()};
  for (size_t b = 0; b < theta.size(); b += kReduceChunk) {
    k.Apply(b, std::min(theta.size(), b + kReduceChunk), delta.data() + b, s);
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
  const OuterStepKind kind = extrapolate ? OuterStepKind::kRunning : OuterStepKind::kSweep;
  const bool sized = stateless || state.accum.size() == n;
  ATOLL_ASSIGN_OR_RETURN(OuterStepKernel k, OuterStepKernel::Create(options, kind, rho, sized ? state.share : 0.0,
                                                                    !momentum_buffer.empty()));
  if (!sized) {
    state.accum.assign(n, 0.0f);
    state.share = 0;
  }
  const bool first_use = extrapolate && state.start.size() != n;
  if (first_use) state.start.assign(theta.begin(), theta.end());
  OuterStepSpans s{.theta = theta.data(),
                   .theta_out = theta.data(),
                   .momentum = momentum_buffer.data(),
                   .momentum_out = momentum_buffer.data(),
                   .accum = stateless ? nullptr : state.accum.data(),
                   .accum_out = stateless ? nullptr : state.accum.data(),
                   .start = extrapolate ? state.start.data() : nullptr,
                   .start_out = extrapolate ? state.start.data() : nullptr};
  double moved2 = 0;
  for (size_t b = 0; b < n; b += kReduceChunk)
    moved2 += k.Apply(b, std::min(n, b + kReduceChunk), merged.data() + b, s);
  k.Finish(state);
  SweepResult result;
  result.sweep_completed = k.completes_sweep();
  result.step_norm = std::sqrt(moved2);
  return result;
}

}  // namespace atl::diloco
