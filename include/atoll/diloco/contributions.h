// Where a merge's contributions come from (FragmentMerger reads them through this), and the one
// source the syncer uses: pushes kept in the quantiser's layout, each read as an outer gradient.
//
// A source hands out contribution m's values of any range of fragment positions, and two fused
// forms the merger's passes need — the squares of a range added into LaneSquares, and the
// contributions' weighted sum over a range in double — which by default go through Values and a
// buffer. EncodedGradients fuses decoding, the outer gradient and the pass's arithmetic into one
// loop for int4 payloads (AVX-512 where the CPU has it; the weighted sum held in registers across
// all contributions), with the same bits as the default forms.
// Thread-safety: const methods, called concurrently from the merger's pool threads for disjoint
// ranges; the buffers a source reads must not change while the merger runs.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "atoll/diloco/codec.h"
#include "atoll/diloco/reduce.h"

namespace atl::diloco {

class ContributionSource {
 public:
  virtual ~ContributionSource() = default;
  // Contribution m's values at fragment positions [begin, end) into out[0, end − begin).
  virtual void Values(size_t m, size_t begin, size_t end, float* out) const = 0;
  // sums.Add(those values) (a whole number of lanes unless the range ends a segment).
  // `scratch` holds at least end − begin floats.
  virtual void AddSquares(size_t m, size_t begin, size_t end, float* scratch, LaneSquares& sums) const;
  // acc[i − begin] = Σ_m coefs[m] · (contribution m's value i), in double, the contributions
  // added in order m = 0, 1, … (the first product written, the others added; a zero coefficient
  // skips its contribution, which is not read; none left: zeros). `coefs` has one entry per
  // contribution.
  virtual void Accumulate(std::span<const double> coefs, size_t begin, size_t end, float* scratch, double* acc) const;
};

// acc[i] += c · x[i] in double (the merge's accumulation; vectorised, no fused multiply-add);
// `first`: acc[i] = c · x[i].
void AddScaledValues(double* acc, const float* x, double c, size_t n, bool first);

// Pushes of one fragment of n values, each the raw bytes InflatePayload accepted (not checked
// again). Contribution m's value i is its decoded Δ̂_i, or — with a base — the outer gradient
// against a reference: reference_i − (base_i − Δ̂_i), in fp32 (θ_m = Φ_base − Δ̂ is what the
// learner held; v = Θ_ref − θ_m).
class EncodedGradients final : public ContributionSource {
 public:
  struct Push {
    std::span<const std::byte> raw;
    const float* base = nullptr;  // the fragment's Φ at the push's base version; null: v = Δ̂
  };
  // `reference`: the fragment's Θ_ref (n values), read where a push has a base.
  EncodedGradients(const CodecOptions& codec, size_t n, const float* reference, std::vector<Push> pushes);

  void Values(size_t m, size_t begin, size_t end, float* out) const override;
  void AddSquares(size_t m, size_t begin, size_t end, float* scratch, LaneSquares& sums) const override;
  void Accumulate(std::span<const double> coefs, size_t begin, size_t end, float* scratch, double* acc) const override;

 private:
  // Whether [begin, end) is whole int4 blocks the fused kernels take (and the CPU has them).
  bool Fused(size_t begin, size_t end) const;

  CodecOptions codec_;
  size_t n_;
  const float* reference_;
  std::vector<Push> pushes_;
  bool fused_ = false;
};

}  // namespace atl::diloco
