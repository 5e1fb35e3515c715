#include "atoll/diloco/contributions.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "atoll/core/simd.h"
#include "codec_layout.h"

namespace atl::diloco {

using namespace layout;

namespace {

// out = r − (b − out): the outer gradient against the reference from the learner's Δ̂.
ATOLL_SIMD_CLONES void AgainstReference(const float* __restrict r, const float* __restrict b, float* __restrict out,
                                        size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = r[i] - (b[i] - out[i]);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define ATOLL_FUSED_INT4 1
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized inside their own set1/undefined helpers.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The 16 values an int4 code can stand for in a block of scale s: float(code − 8)·s, code 0..15
// (exactly the products the decoder forms), for a permute to look them up.
__attribute__((target("avx512f"), always_inline)) inline __m512 Int4Table(__m512 s) {
  return _mm512_mul_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), s);
}

// The 64 values of 32 int4 code bytes (low nibble first), as codec_range.cc's Int4PairsAvx512
// decodes them: float(code − 8)·scale, looked up in the block's Int4Table; then the outer gradient
// v = r − (b − x̂) (b null: v = x̂), into v[0..3], 16 values each, in order.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void Int4Gradients64(const uint8_t* c, __m512 table,
                                                                                       const float* r, const float* b,
                                                                                       __m512* v) {
  const __m512i low = _mm512_set1_epi16(0x0F), high = _mm512_set1_epi16(0xF0);
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
  const __m512i nibbles = _mm512_or_si512(_mm512_and_si512(w, low), _mm512_slli_epi16(_mm512_and_si512(w, high), 4));
  const __m128i parts[4] = {_mm512_extracti32x4_epi32(nibbles, 0), _mm512_extracti32x4_epi32(nibbles, 1),
                            _mm512_extracti32x4_epi32(nibbles, 2), _mm512_extracti32x4_epi32(nibbles, 3)};
  for (int q = 0; q < 4; ++q) {
    v[q] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(parts[q]), table);
    if (b != nullptr) {
      const __m512 t = _mm512_sub_ps(_mm512_loadu_ps(b + 16 * q), v[q]);
      v[q] = _mm512_sub_ps(_mm512_loadu_ps(r + 16 * q), t);
    }
  }
}

// The two halves of 16 floats as doubles, in value order.
__attribute__((target("avx512f"), always_inline)) inline __m512d Low8(__m512 v) {
  return _mm512_cvtps_pd(_mm512_castps512_ps256(v));
}
__attribute__((target("avx512f"), always_inline)) inline __m512d High8(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// Whole int4 blocks of `block` values (a multiple of 64) from `blocks`: v² into lanes[i % 8].
__attribute__((target("avx512f,avx512bw"))) void Int4SquaresAvx512(const std::byte* blocks, size_t block, size_t count,
                                                                   const float* r, const float* b, double* lanes) {
  __m512d acc = _mm512_loadu_pd(lanes);
  const size_t bytes = kScaleBytes + block / 2;
  __m512 v[4];
  for (size_t k = 0; k < count; ++k) {
    const std::byte* in = blocks + k * bytes;
    const __m512 table = Int4Table(_mm512_set1_ps(Load<float>(in)));
    const auto* c = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
    for (size_t j = 0; j < block; j += 64) {
      const size_t at = k * block + j;
      Int4Gradients64(c + j / 2, table, b == nullptr ? nullptr : r + at, b == nullptr ? nullptr : b + at, v);
      for (int q = 0; q < 4; ++q) {
        const __m512d lo = Low8(v[q]), hi = High8(v[q]);
        acc = _mm512_add_pd(acc, _mm512_mul_pd(lo, lo));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(hi, hi));
      }
    }
  }
  _mm512_storeu_pd(lanes, acc);
}

// acc[i − begin] = Σ_m coefs[m]·v_{m,i} over [begin, end) (whole blocks of a multiple of 64), 64
// values at a time with the sum in registers across every contribution: each contribution's
// codes are read once and the accumulator is written once.
__attribute__((target("avx512f,avx512bw"))) void Int4AccumulateAvx512(const EncodedGradients::Push* pushes,
                                                                      const double* coefs, size_t count, size_t block,
                                                                      size_t begin, size_t end, const float* reference,
                                                                      double* acc) {
  const size_t bytes = kScaleBytes + block / 2;
  __m512 v[4];
  __m512d a[8];
  for (size_t i = begin; i < end; i += 64) {
    const size_t blk = i / block, within = i % block;
    bool started = false;
    for (size_t m = 0; m < count; ++m) {
      if (coefs[m] == 0) continue;
      const std::byte* in = pushes[m].raw.data() + blk * bytes;
      const float* b = pushes[m].base;
      Int4Gradients64(reinterpret_cast<const uint8_t*>(in + kScaleBytes) + within / 2,
                      Int4Table(_mm512_set1_ps(Load<float>(in))), b == nullptr ? nullptr : reference + i,
                      b == nullptr ? nullptr : b + i, v);
      const __m512d cc = _mm512_set1_pd(coefs[m]);
      for (int q = 0; q < 4; ++q) {
        const __m512d lo = _mm512_mul_pd(cc, Low8(v[q])), hi = _mm512_mul_pd(cc, High8(v[q]));
        a[2 * q] = started ? _mm512_add_pd(a[2 * q], lo) : lo;
        a[2 * q + 1] = started ? _mm512_add_pd(a[2 * q + 1], hi) : hi;
      }
      started = true;
    }
    if (!started) {
      for (auto& x : a) x = _mm512_setzero_pd();
    }
    for (int q = 0; q < 8; ++q) _mm512_storeu_pd(acc + (i - begin) + 8 * static_cast<size_t>(q), a[q]);
  }
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool CpuHasFusedInt4() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}
#else
bool CpuHasFusedInt4() { return false; }
#endif

}  // namespace

ATOLL_SIMD_CLONES void AddScaledValues(double* __restrict acc, const float* __restrict x, double c, size_t n,
                                       bool first) {
  if (first) {
    for (size_t j = 0; j < n; ++j) acc[j] = c * static_cast<double>(x[j]);
  } else {
    for (size_t j = 0; j < n; ++j) acc[j] += c * static_cast<double>(x[j]);
  }
}

void ContributionSource::AddSquares(size_t m, size_t begin, size_t end, float* scratch, LaneSquares& sums) const {
  Values(m, begin, end, scratch);
  sums.Add(scratch, end - begin);
}

void ContributionSource::Accumulate(std::span<const double> coefs, size_t begin, size_t end, float* scratch,
                                    double* acc) const {
  bool written = false;
  for (size_t m = 0; m < coefs.size(); ++m) {
    if (coefs[m] == 0) continue;
    Values(m, begin, end, scratch);
    AddScaledValues(acc, scratch, coefs[m], end - begin, !written);
    written = true;
  }
  if (!written) std::fill(acc, acc + (end - begin), 0.0);
}

EncodedGradients::EncodedGradients(const CodecOptions& codec, size_t n, const float* reference,
                                   std::vector<Push> pushes)
    : codec_(codec), n_(n), reference_(reference), pushes_(std::move(pushes)) {
  static const bool cpu = CpuHasFusedInt4();
  fused_ = cpu && codec.encoding == Encoding::kInt4 && codec.block_size % 64 == 0;
}

bool EncodedGradients::Fused(size_t begin, size_t end) const {
  const size_t block = static_cast<size_t>(codec_.block_size);
  return fused_ && begin % block == 0 && end % block == 0;
}

void EncodedGradients::Values(size_t m, size_t begin, size_t end, float* out) const {
  const Push& p = pushes_[m];
  DecodeRawRange(codec_, p.raw, n_, begin, end, out);
  if (p.base != nullptr) AgainstReference(reference_ + begin, p.base + begin, out, end - begin);
}

void EncodedGradients::AddSquares(size_t m, size_t begin, size_t end, float* scratch, LaneSquares& sums) const {
#if defined(ATOLL_FUSED_INT4)
  if (Fused(begin, end)) {
    const Push& p = pushes_[m];
    const size_t block = static_cast<size_t>(codec_.block_size);
    const bool based = p.base != nullptr;
    Int4SquaresAvx512(p.raw.data() + (begin / block) * (kScaleBytes + block / 2), block, (end - begin) / block,
                      based ? reference_ + begin : nullptr, based ? p.base + begin : nullptr, sums.lanes());
    return;
  }
#endif
  ContributionSource::AddSquares(m, begin, end, scratch, sums);
}

void EncodedGradients::Accumulate(std::span<const double> coefs, size_t begin, size_t end, float* scratch,
                                  double* acc) const {
#if defined(ATOLL_FUSED_INT4)
  if (Fused(begin, end)) {
    Int4AccumulateAvx512(pushes_.data(), coefs.data(), pushes_.size(), static_cast<size_t>(codec_.block_size), begin,
                         end, reference_, acc);
    return;
  }
#endif
  ContributionSource::Accumulate(coefs, begin, end, scratch, acc);
}

}  // namespace atl::diloco
