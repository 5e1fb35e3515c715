#include "atoll/exchange/lattice.h"

#include "atoll/core/simd.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace atl::exchange {
namespace {

static_assert(std::endian::native == std::endian::little, "the lattice layouts are little-endian");

constexpr size_t kHeaderBytes = 2;  // int8 shift, uint8 width

size_t CodeBytes(int width, size_t b) {
  switch (width) {
    case 0: return 0;
    case 4: return (b + 1) / 2;
    case 8: return b;
    case 16: return 2 * b;
    case 32: return 4 * b;
  }
  return 0;
}

bool ValidWidth(int width) { return width == 0 || width == 4 || width == 8 || width == 16 || width == 32; }

int WidthFor(int64_t max_abs_code, int64_t min_code) {
  if (max_abs_code == 0) return 0;
  if (max_abs_code <= 7 && min_code >= -8) return 4;
  if (max_abs_code <= 127) return 8;
  if (max_abs_code <= 32767) return 16;
  return 32;
}

size_t BlockSize(const Lattice& l, size_t b) {
  const size_t start = b * static_cast<size_t>(l.block);
  return std::min(static_cast<size_t>(l.block), l.numel - start);
}

// The unit 2^e and its inverse, both exact fp32 powers of two for e in [kMinExp, kMaxExp].
float Unit(int e) { return std::ldexp(1.0f, e); }

// One block of a raw delta, parsed and bounds-checked.
struct BlockCodes {
  int shift = 0, width = 0;
  const std::byte* codes = nullptr;
};

int64_t CodeAt(const BlockCodes& c, size_t i) {
  switch (c.width) {
    case 4: {
      const int v = (static_cast<uint8_t>(c.codes[i / 2]) >> (4 * (i % 2))) & 0xF;
      return (v ^ 8) - 8;
    }
    case 8: return static_cast<int8_t>(c.codes[i]);
    case 16: {
      int16_t v;
      std::memcpy(&v, c.codes + 2 * i, 2);
      return v;
    }
    case 32: {
      int32_t v;
      std::memcpy(&v, c.codes + 4 * i, 4);
      return v;
    }
  }
  return 0;
}

// Whether code·2^shift can be a move within the range (|·| ≤ 2·kLatticeMax < 2^25): checked before
// any product is formed, so a hostile delta cannot overflow the integer arithmetic.
bool CodeInRange(int64_t code, int shift) {
  const int64_t limit = shift >= 25 ? 0 : (int64_t{1} << 25) >> shift;
  return code <= limit && code >= -limit;
}

// Reads block headers in order; DataLoss on anything Encode never writes.
class DeltaReader {
 public:
  DeltaReader(const Lattice& l, std::span<const std::byte> raw) : l_(l), raw_(raw) {}

  StatusOr<BlockCodes> Next(size_t b) {
    const size_t n = BlockSize(l_, b);
    if (pos_ + kHeaderBytes > raw_.size()) return Truncated(b);
    BlockCodes c;
    c.shift = static_cast<int8_t>(raw_[pos_]);
    c.width = static_cast<uint8_t>(raw_[pos_ + 1]);
    pos_ += kHeaderBytes;
    if (!ValidWidth(c.width) || c.shift < 0 || c.shift > kMaxShift || (c.width == 0 && c.shift != 0)) {
      return DataLossError("lattice delta: block " + std::to_string(b) + " has shift " + std::to_string(c.shift) +
                           " and width " + std::to_string(c.width));
    }
    const size_t bytes = CodeBytes(c.width, n);
    if (pos_ + bytes > raw_.size()) return Truncated(b);
    c.codes = raw_.data() + pos_;
    if (c.width == 4 && n % 2 == 1 && (static_cast<uint8_t>(c.codes[n / 2]) >> 4) != 0) {
      return DataLossError("lattice delta: block " + std::to_string(b) + " has a non-zero padding nibble");
    }
    pos_ += bytes;
    return c;
  }
  Status Finish() const {
    if (pos_ == raw_.size()) return Status::Ok();
    return DataLossError("lattice delta: " + std::to_string(raw_.size() - pos_) + " bytes after the last block");
  }

 private:
  Status Truncated(size_t b) const {
    return DataLossError("lattice delta: ends inside block " + std::to_string(b) + " (" + std::to_string(raw_.size()) +
                         " bytes)");
  }
  const Lattice& l_;
  std::span<const std::byte> raw_;
  size_t pos_ = 0;
};

// Every block of a raw delta, validated (the whole buffer, nothing after the last block).
StatusOr<std::vector<BlockCodes>> ParseBlocks(const Lattice& l, std::span<const std::byte> raw) {
  DeltaReader reader(l, raw);
  std::vector<BlockCodes> blocks(l.num_blocks());
  for (size_t b = 0; b < l.num_blocks(); ++b) {
    ATOLL_ASSIGN_OR_RETURN(blocks[b], reader.Next(b));
  }
  ATOLL_RETURN_IF_ERROR(reader.Finish());
  return blocks;
}

// Blocks per range of parallel work (64 Ki values at block 256).
constexpr size_t kBlocksPerRange = 256;

// Runs fn(first_block, last_block, out) over block ranges in parallel, each range writing its own
// part of a raw buffer; the parts are joined in order. The first error wins.
Status ForBlockRanges(ThreadPool* pool, size_t blocks, std::vector<std::byte>& raw,
                      const std::function<Status(size_t, size_t, std::vector<std::byte>&)>& fn) {
  const size_t ranges = (blocks + kBlocksPerRange - 1) / kBlocksPerRange;
  std::vector<std::vector<std::byte>> parts(ranges);
  std::vector<Status> results(ranges);
  ForRanges(pool, blocks, kBlocksPerRange, [&](size_t first, size_t last) {
    const size_t r = first / kBlocksPerRange;
    results[r] = fn(first, last, parts[r]);
  });
  for (const Status& st : results) ATOLL_RETURN_IF_ERROR(st);
  for (const auto& part : parts) raw.insert(raw.end(), part.begin(), part.end());
  return Status::Ok();
}

// Appends one block: header and codes (width chosen from the codes).
void WriteBlock(int shift, std::span<const int64_t> codes, std::vector<std::byte>& out) {
  int64_t max_abs = 0, min_code = 0;
  for (int64_t k : codes) {
    max_abs = std::max(max_abs, k < 0 ? -k : k);
    min_code = std::min(min_code, k);
  }
  const int width = WidthFor(max_abs, min_code);
  out.push_back(static_cast<std::byte>(static_cast<int8_t>(width == 0 ? 0 : shift)));
  out.push_back(static_cast<std::byte>(static_cast<uint8_t>(width)));
  const size_t at = out.size();
  out.resize(at + CodeBytes(width, codes.size()));
  std::byte* o = out.data() + at;
  for (size_t i = 0; i < codes.size() && width != 0; ++i) {
    const int64_t k = codes[i];
    switch (width) {
      case 4: o[i / 2] |= static_cast<std::byte>((static_cast<uint8_t>(k) & 0xF) << (4 * (i % 2))); break;
      case 8: o[i] = static_cast<std::byte>(static_cast<int8_t>(k)); break;
      case 16: {
        const int16_t v = static_cast<int16_t>(k);
        std::memcpy(o + 2 * i, &v, 2);
        break;
      }
      case 32: {
        const int32_t v = static_cast<int32_t>(k);
        std::memcpy(o + 4 * i, &v, 4);
        break;
      }
    }
  }
}

// Removes the common factor 2^t of a block's codes (so a sum whose values share low zero bits
// travels at a coarser step): returns t, codes divided by 2^t.
int StripCommonPowerOfTwo(std::span<int64_t> codes, int shift) {
  uint64_t any = 0;
  for (int64_t k : codes) any |= static_cast<uint64_t>(k);
  if (any == 0) return 0;
  const int t = std::min(std::countr_zero(any), kMaxShift - shift);
  if (t > 0) {
    for (int64_t& k : codes) k /= (int64_t{1} << t);  // exact: every code is a multiple of 2^t
  }
  return t;
}

// The lattice integer of a value (Φ is on the lattice: exact; off it, the nearest).
inline int64_t Code(float value, float inv_unit) { return std::llrint(static_cast<double>(value) * inv_unit); }

Status CheckSize(const Lattice& l, size_t n, const char* what) {
  if (n == l.numel && l.num_blocks() == (l.numel + static_cast<size_t>(l.block) - 1) / static_cast<size_t>(l.block)) {
    return Status::Ok();
  }
  return InvalidArgumentError(std::string(what) + ": " + std::to_string(n) + " values, the lattice has " +
                              std::to_string(l.numel));
}

}  // namespace

StatusOr<Lattice> MakeLattice(std::span<const float> initial, int block) {
  if (block < 8 || block > 65536) return InvalidArgumentError("lattice: block size must be in [8, 65536]");
  Lattice l;
  l.block = block;
  l.numel = initial.size();
  const size_t blocks = (initial.size() + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  l.exp.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t start = b * static_cast<size_t>(block), n = BlockSize(l, b);
    float absmax = std::ldexp(1.0f, -6);  // a zero block still holds values up to 16, at 2^-20
    for (size_t i = 0; i < n; ++i) {
      const float x = initial[start + i];
      if (!std::isfinite(x))
        return InvalidArgumentError("lattice: initial value " + std::to_string(start + i) + " is not finite");
      absmax = std::max(absmax, std::fabs(x));
    }
    const int e = std::ilogb(absmax) - 14;
    l.exp[b] = static_cast<int8_t>(std::clamp(e, kMinExp, kMaxExp));
  }
  return l;
}

void SnapToLattice(const Lattice& l, std::span<float> values) {
  ATOLL_CHECK(CheckSize(l, values.size(), "snap").ok());
  for (size_t b = 0; b < l.num_blocks(); ++b) {
    const size_t start = b * static_cast<size_t>(l.block), n = BlockSize(l, b);
    const float unit = Unit(l.exp[b]), inv = Unit(-l.exp[b]);
    for (size_t i = start; i < start + n; ++i) {
      const int64_t k = std::clamp(Code(values[i], inv), -kLatticeMax, kLatticeMax);
      values[i] = static_cast<float>(k) * unit;
    }
  }
}

namespace {

// One block of a round's delta (EncodeLatticeStep), exactly: integer codes in int64, values held
// at the range's edge. Returns the values held there.
int64_t StepBlockExact(const Lattice& l, int qmax, size_t b, const float* theta, const float* phi, float* phi_out,
                       std::vector<std::byte>& out) {
  thread_local std::vector<int64_t> codes;
  thread_local std::vector<double> d;
  const size_t start = b * static_cast<size_t>(l.block), n = BlockSize(l, b);
  codes.resize(n);
  d.resize(n);
  const float unit = Unit(l.exp[b]), inv = Unit(-l.exp[b]);
  double absmax = 0;
  for (size_t i = 0; i < n; ++i) {
    d[i] = (static_cast<double>(theta[start + i]) - phi[start + i]) * inv;  // Θ − Φ in units
    absmax = std::max(absmax, std::fabs(d[i]));
  }
  int shift = 0;
  while (qmax > 0 && shift < kMaxShift && static_cast<double>(qmax) * std::ldexp(1.0, shift) < absmax) ++shift;
  const int64_t step = int64_t{1} << shift;
  int64_t held_at_edge = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t held = Code(phi[start + i], inv);
    const double q = std::clamp(d[i] / static_cast<double>(step), -4.0 * kLatticeMax, 4.0 * kLatticeMax);
    int64_t k = static_cast<int64_t>(std::nearbyint(q));
    if (qmax > 0) k = std::clamp<int64_t>(k, -qmax, qmax);
    int64_t next = held + k * step;
    if (next > kLatticeMax || next < -kLatticeMax) {  // Θ left the range: hold Φ at its edge
      k = ((next > 0 ? kLatticeMax : -kLatticeMax) - held) / step;
      next = held + k * step;
      ++held_at_edge;
    }
    codes[i] = k;
    phi_out[start + i] = static_cast<float>(next) * unit;
  }
  WriteBlock(shift, std::span<int64_t>(codes.data(), n), out);
  return held_at_edge;
}

// (Θ − Φ) in units of the block, in double (exact), into d; returns the largest |d| (Θ and Φ are
// finite). Two loops that vectorise: the differences, then their maximum taken on the bits (for
// doubles ≥ 0 the order of the bit patterns is the order of the values).
ATOLL_SIMD_CLONES double UnitDifferences(const float* __restrict theta, const float* __restrict phi, double inv,
                                         size_t n, double* __restrict d) {
  uint64_t max_bits = 0;
  for (size_t i = 0; i < n; ++i) d[i] = (static_cast<double>(theta[i]) - static_cast<double>(phi[i])) * inv;
  for (size_t i = 0; i < n; ++i) max_bits = std::max(max_bits, std::bit_cast<uint64_t>(d[i]) & ~(uint64_t{1} << 63));
  return std::bit_cast<double>(max_bits);
}

// The codes k = round(d / 2^shift) within ±qmax (ties to even, as nearbyint: |q| ≤ qmax + 1 < 2^51
// makes the magic-number rounding exact), and the next values (held + k·2^shift)·unit, in double
// (every integer involved is below 2^53). Returns whether every next value is within the range.
ATOLL_SIMD_CLONES bool StepCodes(const double* d, const float* phi, double inv, double unit, double step,
                                 double inv_step, double qmax, size_t n, int8_t* k, float* next) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5·2^52
  constexpr double kMax = static_cast<double>(kLatticeMax);
  // std::clamp as min(max(·)), and the range test without a branch, so that the loop vectorises
  // (the same values: clamp(x, lo, hi) = min(max(x, lo), hi) for lo ≤ hi).
  unsigned out_of_range = 0;
  for (size_t i = 0; i < n; ++i) {
    const double q = std::min(std::max(d[i] * inv_step, -(qmax + 1)), qmax + 1);
    const double code = std::min(std::max((q + kMagic) - kMagic, -qmax), qmax);
    const double held = static_cast<double>(phi[i]) * inv;
    const double v = held + code * step;
    out_of_range |= static_cast<unsigned>(v > kMax) | static_cast<unsigned>(v < -kMax);
    k[i] = static_cast<int8_t>(static_cast<int32_t>(code));
    next[i] = static_cast<float>(v * unit);
  }
  return out_of_range == 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized inside their own set1/undefined helpers.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// StepCodes, 16 values at a time in 512-bit vectors (n a multiple of 16), the same operations in
// the same order: std::max(a, b) is max_pd(b, a) and std::min(a, b) is min_pd(b, a), NaN included.
__attribute__((target("avx512f"))) bool StepCodesAvx512(const double* d, const float* phi, double inv, double unit,
                                                        double step, double inv_step, double qmax, size_t n, int8_t* k,
                                                        float* next) {
  constexpr double kMagic = 6755399441055744.0;  // 1.5·2^52
  const __m512d vinv = _mm512_set1_pd(inv), vunit = _mm512_set1_pd(unit), vstep = _mm512_set1_pd(step);
  const __m512d vinv_step = _mm512_set1_pd(inv_step), magic = _mm512_set1_pd(kMagic);
  const __m512d q_hi = _mm512_set1_pd(qmax + 1), q_lo = _mm512_set1_pd(-(qmax + 1));
  const __m512d c_hi = _mm512_set1_pd(qmax), c_lo = _mm512_set1_pd(-qmax);
  const __m512d v_hi = _mm512_set1_pd(static_cast<double>(kLatticeMax)),
                v_lo = _mm512_set1_pd(-static_cast<double>(kLatticeMax));
  __mmask8 out_of_range = 0;
  for (size_t i = 0; i < n; i += 16) {
    __m256i codes[2];
    for (int h = 0; h < 2; ++h) {
      const size_t at = i + 8 * static_cast<size_t>(h);
      const __m512d q = _mm512_min_pd(q_hi, _mm512_max_pd(q_lo, _mm512_mul_pd(_mm512_loadu_pd(d + at), vinv_step)));
      const __m512d rounded = _mm512_sub_pd(_mm512_add_pd(q, magic), magic);
      const __m512d code = _mm512_min_pd(c_hi, _mm512_max_pd(c_lo, rounded));
      const __m512d held = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(phi + at)), vinv);
      const __m512d v = _mm512_add_pd(held, _mm512_mul_pd(code, vstep));
      out_of_range |= _mm512_cmp_pd_mask(v, v_hi, _CMP_GT_OQ) | _mm512_cmp_pd_mask(v, v_lo, _CMP_LT_OQ);
      codes[h] = _mm512_cvttpd_epi32(code);
      _mm256_storeu_ps(next + at, _mm512_cvtpd_ps(_mm512_mul_pd(v, vunit)));
    }
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(codes[0]), codes[1], 1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(k + i), _mm512_cvtepi32_epi8(both));
  }
  return out_of_range == 0;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

bool CpuHasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}
#else
bool CpuHasAvx512() { return false; }
#endif

// The codes and next values of one block: StepCodesAvx512 where the CPU has it and the block is
// whole vectors, else StepCodes (the same bits).
bool StepBlockCodes(const double* d, const float* phi, double inv, double unit, double step, double inv_step,
                    double qmax, size_t n, int8_t* k, float* next) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = CpuHasAvx512();
  if (avx512 && n % 16 == 0) return StepCodesAvx512(d, phi, inv, unit, step, inv_step, qmax, n, k, next);
#endif
  return StepCodes(d, phi, inv, unit, step, inv_step, qmax, n, k, next);
}

// Header and two's-complement nibbles of a block whose codes are within ±7 (width 0 when all are 0).
void WriteNibbleBlock(int shift, const int8_t* k, size_t n, std::vector<std::byte>& out) {
  int8_t any = 0;
  for (size_t i = 0; i < n; ++i) any |= k[i];
  const int width = any == 0 ? 0 : 4;
  out.push_back(static_cast<std::byte>(static_cast<int8_t>(width == 0 ? 0 : shift)));
  out.push_back(static_cast<std::byte>(static_cast<uint8_t>(width)));
  if (width == 0) return;
  const size_t at = out.size();
  out.resize(at + (n + 1) / 2);
  auto* o = reinterpret_cast<uint8_t*>(out.data() + at);
  for (size_t j = 0; j < n / 2; ++j) {
    o[j] = static_cast<uint8_t>((static_cast<uint8_t>(k[2 * j]) & 0xFu) |
                                ((static_cast<uint8_t>(k[2 * j + 1]) & 0xFu) << 4));
  }
  if (n % 2 == 1) o[n / 2] = static_cast<uint8_t>(static_cast<uint8_t>(k[n - 1]) & 0xFu);
}

// One block by the fast path (qmax ≤ 7): false, writing nothing, when a value would leave the
// range (the exact path then holds it at the edge). The same codes and values as StepBlockExact.
bool StepBlockFast(const Lattice& l, int qmax, size_t b, const float* theta, const float* phi, float* phi_out,
                   std::vector<std::byte>& out) {
  thread_local std::vector<double> d;
  thread_local std::vector<int8_t> k;
  thread_local std::vector<float> next;
  const size_t start = b * static_cast<size_t>(l.block), n = BlockSize(l, b);
  d.resize(n);
  k.resize(n);
  next.resize(n);
  const double inv = std::ldexp(1.0, -l.exp[b]), unit = std::ldexp(1.0, l.exp[b]);
  const double absmax = UnitDifferences(theta + start, phi + start, inv, n, d.data());
  int shift = 0;
  while (shift < kMaxShift && static_cast<double>(qmax) * std::ldexp(1.0, shift) < absmax) ++shift;
  // Out of place the next values go straight to phi_out (the exact path rewrites them all if this
  // one fails); in place through a buffer, so that a failure leaves Φ as the exact path reads it.
  float* to = phi_out == phi ? next.data() : phi_out + start;
  if (!StepBlockCodes(d.data(), phi + start, inv, unit, std::ldexp(1.0, shift), std::ldexp(1.0, -shift),
                      static_cast<double>(qmax), n, k.data(), to)) {
    return false;
  }
  if (to == next.data()) std::copy(next.begin(), next.end(), phi_out + start);
  WriteNibbleBlock(shift, k.data(), n, out);
  return true;
}

}  // namespace

void EncodeLatticeStepBlocks(const Lattice& l, int qmax, size_t first, size_t last, std::span<const float> theta,
                             std::span<const float> phi, std::span<float> phi_out, std::vector<std::byte>& out,
                             int64_t* saturated) {
  int64_t held_at_edge = 0;
  const bool fast = qmax >= 1 && qmax <= 7;
  for (size_t b = first; b < last; ++b) {
    if (fast && StepBlockFast(l, qmax, b, theta.data(), phi.data(), phi_out.data(), out)) continue;
    held_at_edge += StepBlockExact(l, qmax, b, theta.data(), phi.data(), phi_out.data(), out);
  }
  if (saturated != nullptr) *saturated += held_at_edge;
}

void TEST_EncodeLatticeStepBlocksExact(const Lattice& l, int qmax, size_t first, size_t last,
                                       std::span<const float> theta, std::span<const float> phi,
                                       std::span<float> phi_out, std::vector<std::byte>& out, int64_t* saturated) {
  int64_t held_at_edge = 0;
  for (size_t b = first; b < last; ++b)
    held_at_edge += StepBlockExact(l, qmax, b, theta.data(), phi.data(), phi_out.data(), out);
  if (saturated != nullptr) *saturated += held_at_edge;
}

Status EncodeLatticeStep(const Lattice& l, int qmax, std::span<const float> theta, std::span<float> phi,
                         std::vector<std::byte>& raw, LatticeStepStats* stats, ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(CheckSize(l, theta.size(), "lattice step"));
  ATOLL_RETURN_IF_ERROR(CheckSize(l, phi.size(), "lattice step"));
  if (qmax < 0) return InvalidArgumentError("lattice step: qmax must be ≥ 0");
  for (size_t i = 0; i < theta.size(); ++i) {
    if (!std::isfinite(theta[i]))
      return InvalidArgumentError("lattice step: value " + std::to_string(i) + " is not finite");
  }
  raw.clear();
  std::atomic<int64_t> saturated{0};
  ATOLL_RETURN_IF_ERROR(
      ForBlockRanges(pool, l.num_blocks(), raw, [&](size_t first, size_t last, std::vector<std::byte>& out) {
        int64_t held_at_edge = 0;
        EncodeLatticeStepBlocks(l, qmax, first, last, theta, phi, phi, out, &held_at_edge);
        saturated += held_at_edge;
        return Status::Ok();
      }));
  if (stats != nullptr) stats->saturated += saturated.load();
  return Status::Ok();
}

Status ApplyLatticeDelta(const Lattice& l, std::span<const std::byte> raw, std::span<float> phi, int sign,
                         ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(CheckSize(l, phi.size(), "lattice delta"));
  ATOLL_CHECK(sign == 1 || sign == -1);
  ATOLL_ASSIGN_OR_RETURN(std::vector<BlockCodes> blocks, ParseBlocks(l, raw));
  // Two passes, so that Φ is unchanged when any value would leave the range: check, then write.
  std::atomic<int64_t> bad{-1};
  for (const bool write : {false, true}) {
    ForRanges(pool, l.num_blocks(), kBlocksPerRange, [&](size_t first, size_t last) {
      for (size_t b = first; b < last; ++b) {
        const BlockCodes& c = blocks[b];
        if (c.width == 0) continue;
        const size_t start = b * static_cast<size_t>(l.block), n = BlockSize(l, b);
        const float unit = Unit(l.exp[b]), inv = Unit(-l.exp[b]);
        for (size_t i = 0; i < n; ++i) {
          const int64_t code = CodeAt(c, i);
          const int64_t k = CodeInRange(code, c.shift)
                                ? Code(phi[start + i], inv) + sign * code * (int64_t{1} << c.shift)
                                : kLatticeMax + 1;
          if (k > kLatticeMax || k < -kLatticeMax) {
            bad = static_cast<int64_t>(start + i);
          } else if (write) {
            phi[start + i] = static_cast<float>(k) * unit;
          }
        }
      }
    });
    if (bad.load() >= 0) {
      return DataLossError("lattice delta: value " + std::to_string(bad.load()) + " leaves the lattice's range");
    }
  }
  return Status::Ok();
}

StatusOr<size_t> CheckLatticeDelta(const Lattice& l, std::span<const std::byte> raw) {
  ATOLL_RETURN_IF_ERROR(ParseBlocks(l, raw).status());
  return raw.size();
}

size_t MaxLatticeDeltaBytes(const Lattice& l) { return l.num_blocks() * kHeaderBytes + 4 * l.numel; }

Status SumLatticeDeltas(const Lattice& l, std::span<const std::span<const std::byte>> chain,
                        std::vector<std::byte>& raw, ThreadPool* pool) {
  std::vector<std::vector<BlockCodes>> parsed;
  for (const auto& d : chain) {
    ATOLL_ASSIGN_OR_RETURN(auto blocks, ParseBlocks(l, d));
    parsed.push_back(std::move(blocks));
  }
  raw.clear();
  return ForBlockRanges(pool, l.num_blocks(), raw, [&](size_t first, size_t last, std::vector<std::byte>& out) {
    std::vector<int64_t> acc(static_cast<size_t>(l.block));
    for (size_t b = first; b < last; ++b) {
      const size_t n = BlockSize(l, b);
      int low = kMaxShift;
      for (const auto& blocks : parsed) {
        if (blocks[b].width != 0) low = std::min(low, blocks[b].shift);
      }
      std::fill(acc.begin(), acc.begin() + static_cast<ptrdiff_t>(n), 0);
      for (const auto& blocks : parsed) {
        const BlockCodes& c = blocks[b];
        if (c.width == 0) continue;
        const int64_t scale = int64_t{1} << (c.shift - low);
        for (size_t i = 0; i < n; ++i) {
          const int64_t code = CodeAt(c, i);
          if (!CodeInRange(code, c.shift))
            return DataLossError("lattice sum: block " + std::to_string(b) + " moves beyond the lattice's range");
          acc[i] += code * scale;
        }
      }
      const std::span<int64_t> codes(acc.data(), n);
      for (int64_t k : codes) {
        if (k > std::numeric_limits<int32_t>::max() || k < -std::numeric_limits<int32_t>::max()) {
          return DataLossError("lattice sum: block " + std::to_string(b) + " leaves the lattice's range");
        }
      }
      const int t = StripCommonPowerOfTwo(codes, low);
      WriteBlock(low + t, codes, out);
    }
    return Status::Ok();
  });
}

Status EncodeLatticeFull(const Lattice& l, std::span<const float> phi, std::vector<std::byte>& raw, ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(CheckSize(l, phi.size(), "lattice full copy"));
  if (!std::all_of(phi.begin(), phi.end(), [](float x) { return std::isfinite(x); })) {
    return InvalidArgumentError("lattice full copy: a value is not finite");
  }
  raw.assign(l.num_blocks(), std::byte{0});
  for (size_t b = 0; b < l.num_blocks(); ++b) raw[b] = static_cast<std::byte>(l.exp[b]);
  return ForBlockRanges(pool, l.num_blocks(), raw, [&](size_t first, size_t last, std::vector<std::byte>& out) {
    std::vector<int64_t> codes(static_cast<size_t>(l.block));
    for (size_t b = first; b < last; ++b) {
      const size_t start = b * static_cast<size_t>(l.block), n = BlockSize(l, b);
      const float inv = Unit(-l.exp[b]);
      for (size_t i = 0; i < n; ++i) codes[i] = std::clamp(Code(phi[start + i], inv), -kLatticeMax, kLatticeMax);
      const std::span<int64_t> block(codes.data(), n);
      const int t = StripCommonPowerOfTwo(block, 0);
      WriteBlock(t, block, out);
    }
    return Status::Ok();
  });
}

StatusOr<Lattice> DecodeLatticeFull(std::span<const std::byte> raw, int block, size_t numel, std::vector<float>& phi,
                                    ThreadPool* pool) {
  Lattice l;
  if (block < 8 || block > 65536) return DataLossError("lattice full copy: bad block size " + std::to_string(block));
  l.block = block;
  l.numel = numel;
  const size_t blocks = (numel + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  if (raw.size() < blocks) return DataLossError("lattice full copy: " + std::to_string(raw.size()) + " bytes");
  l.exp.resize(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    const int e = static_cast<int8_t>(raw[b]);
    if (e < kMinExp || e > kMaxExp)
      return DataLossError("lattice full copy: block " + std::to_string(b) + " has exponent " + std::to_string(e));
    l.exp[b] = static_cast<int8_t>(e);
  }
  std::vector<float> values(numel, 0.0f);
  ATOLL_RETURN_IF_ERROR(ApplyLatticeDelta(l, raw.subspan(blocks), values, 1, pool));
  phi.swap(values);
  return l;
}

size_t MaxLatticeFullBytes(int block, size_t numel) {
  const size_t blocks = (numel + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  return blocks * (1 + kHeaderBytes) + 4 * numel;
}

}  // namespace atl::exchange
