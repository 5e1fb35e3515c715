#include "atoll/diloco/contributions.h"

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

// The 64 values of 32 int4 code bytes (low nibble first), as codec_range.cc's Int4PairsAvx512
// decodes them: float(code − 8)·scale; then the outer gradient v = r − (b − x̂) (b null: v = x̂),
// into v[0..3], 16 values each, in order.
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void Int4Gradients64(const uint8_t* c, __m512 s,
                                                                                        const float* r, const float* b,
                                                                                        __m512* v) {
  const __m512i low = _mm512_set1_epi16(0x0F), high = _mm512_set1_epi16(0xF0);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c)));
  const __m512i nibbles = _mm512_or_si512(_mm512_and_si512(w, low), _mm512_slli_epi16(_mm512_and_si512(w, high), 4));
  const __m128i parts[4] = {_mm512_extracti32x4_epi32(nibbles, 0), _mm512_extracti32x4_epi32(nibbles, 1),
                            _mm512_extracti32x4_epi32(nibbles, 2), _mm512_extracti32x4_epi32(nibbles, 3)};
  for (int q = 0; q < 4; ++q) {
    const __m512i codes = _mm512_sub_epi32(_mm512_cvtepu8_epi32(parts[q]), eight);
    v[q] = _mm512_mul_ps(_mm512_cvtepi32_ps(codes), s);
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
__attribute__((target("avx512f,avx512bw"))) void Int4SquaresAvx512(const std::byte* blocks, size_t block,
                                                                    size_t count, const float* r, const float* b,
                                                                    double* lanes) {
  __m512d acc = _mm512_loadu_pd(lanes);
  const size_t bytes = kScaleBytes + block / 2;
  __m512 v[4];
  for (size_t k = 0; k < count; ++k) {
    const std::byte* in = blocks + k * bytes;
    const __m512 s = _mm512_set1_ps(Load<float>(in));
    const auto* c = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
    for (size_t j = 0; j < block; j += 64) {
      const size_t at = k * block + j;
      Int4Gradients64(c + j / 2, s, b == nullptr ? nullptr : r + at, b == nullptr ? nullptr : b + at, v);
      for (int q = 0; q < 4; ++q) {
        const __m512d lo = Low8(v[q]), hi = High8(v[q]);
        acc = _mm512_add_pd(acc, _mm512_mul_pd(lo, lo));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(hi, hi));
      }
    }
  }
  _mm512_storeu_pd(lanes, acc);
}

// The same blocks: acc[i] += coef · v_i.
__attribute__((target("avx512f,avx512bw"))) void Int4ScaledAvx512(const std::byte* blocks, size_t block, size_t count,
                                                                   const float* r, const float* b, double coef,
                                                                   double* acc) {
  const __m512d cc = _mm512_set1_pd(coef);
  const size_t bytes = kScaleBytes + block / 2;
  __m512 v[4];
  for (size_t k = 0; k < count; ++k) {
    const std::byte* in = blocks + k * bytes;
    const __m512 s = _mm512_set1_ps(Load<float>(in));
    const auto* c = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
    for (size_t j = 0; j < block; j += 64) {
      const size_t at = k * block + j;
      Int4Gradients64(c + j / 2, s, b == nullptr ? nullptr : r + at, b == nullptr ? nullptr : b + at, v);
      for (int q = 0; q < 4; ++q) {
        double* a = acc + at + 16 * static_cast<size_t>(q);
        _mm512_storeu_pd(a, _mm512_add_pd(_mm512_loadu_pd(a), _mm512_mul_pd(cc, Low8(v[q]))));
        _mm512_storeu_pd(a + 8, _mm512_add_pd(_mm512_loadu_pd(a + 8), _mm512_mul_pd(cc, High8(v[q]))));
      }
    }
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

ATOLL_SIMD_CLONES void AddScaledValues(double* __restrict acc, const float* __restrict x, double c, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] += c * static_cast<double>(x[j]);
}

void ContributionSource::AddSquares(size_t m, size_t begin, size_t end, float* scratch, LaneSquares& sums) const {
  Values(m, begin, end, scratch);
  sums.Add(scratch, end - begin);
}

void ContributionSource::AddScaled(size_t m, size_t begin, size_t end, double coef, float* scratch,
                                   double* acc) const {
  Values(m, begin, end, scratch);
  AddScaledValues(acc, scratch, coef, end - begin);
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

void EncodedGradients::AddScaled(size_t m, size_t begin, size_t end, double coef, float* scratch, double* acc) const {
#if defined(ATOLL_FUSED_INT4)
  if (Fused(begin, end)) {
    const Push& p = pushes_[m];
    const size_t block = static_cast<size_t>(codec_.block_size);
    const bool based = p.base != nullptr;
    Int4ScaledAvx512(p.raw.data() + (begin / block) * (kScaleBytes + block / 2), block, (end - begin) / block,
                     based ? reference_ + begin : nullptr, based ? p.base + begin : nullptr, coef, acc);
    return;
  }
#endif
  ContributionSource::AddScaled(m, begin, end, coef, scratch, acc);
}

}  // namespace atl::diloco
