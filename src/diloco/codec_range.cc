// Payloads read in pieces (codec.h: InflatePayload, DecodeRawRange): the syncer keeps each push in
// the quantiser's layout and decodes the tile it works on, several times per round.
#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "atoll/core/simd.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/reduce.h"
#include "codec_layout.h"

namespace atl::diloco {

using namespace layout;

namespace {

// int4 codes, two per byte (low nibble first), decoded as float(code − 8)·scale. The vector forms
// write the same bits: they widen each byte to 16 bits with its high nibble moved into the upper
// byte, which lays the nibbles out in value order, then convert 16 at a time.
void Int4PairsScalar(const uint8_t* c, size_t pairs, float scale, float* x) {
  for (size_t j = 0; j < pairs; ++j) {
    x[2 * j] = static_cast<float>(static_cast<int>(c[j] & 15u) - 8) * scale;
    x[2 * j + 1] = static_cast<float>(static_cast<int>(c[j] >> 4) - 8) * scale;
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized inside their own set1/undefined helpers.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw"))) void Int4PairsAvx512(const uint8_t* c, size_t pairs, float scale,
                                                                 float* x) {
  const __m512i low = _mm512_set1_epi16(0x0F), high = _mm512_set1_epi16(0xF0);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512 s = _mm512_set1_ps(scale);
  size_t j = 0;
  for (; j + 32 <= pairs; j += 32) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + j)));
    const __m512i nibbles = _mm512_or_si512(_mm512_and_si512(w, low), _mm512_slli_epi16(_mm512_and_si512(w, high), 4));
    for (int q = 0; q < 4; ++q) {
      const __m128i part = q == 0   ? _mm512_extracti32x4_epi32(nibbles, 0)
                           : q == 1 ? _mm512_extracti32x4_epi32(nibbles, 1)
                           : q == 2 ? _mm512_extracti32x4_epi32(nibbles, 2)
                                    : _mm512_extracti32x4_epi32(nibbles, 3);
      const __m512i codes = _mm512_sub_epi32(_mm512_cvtepu8_epi32(part), eight);
      _mm512_storeu_ps(x + 2 * j + 16 * q, _mm512_mul_ps(_mm512_cvtepi32_ps(codes), s));
    }
  }
  Int4PairsScalar(c + j, pairs - j, scale, x + 2 * j);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

__attribute__((target("avx2"))) void Int4PairsAvx2(const uint8_t* c, size_t pairs, float scale, float* x) {
  const __m256i low = _mm256_set1_epi16(0x0F), high = _mm256_set1_epi16(0xF0);
  const __m256i eight = _mm256_set1_epi32(8);
  const __m256 s = _mm256_set1_ps(scale);
  size_t j = 0;
  for (; j + 16 <= pairs; j += 16) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + j)));
    const __m256i nibbles = _mm256_or_si256(_mm256_and_si256(w, low), _mm256_slli_epi16(_mm256_and_si256(w, high), 4));
    const __m128i lo = _mm256_castsi256_si128(nibbles), hi = _mm256_extracti128_si256(nibbles, 1);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int q = 0; q < 4; ++q) {
      const __m256i codes = _mm256_sub_epi32(_mm256_cvtepu8_epi32(parts[q]), eight);
      _mm256_storeu_ps(x + 2 * j + 8 * q, _mm256_mul_ps(_mm256_cvtepi32_ps(codes), s));
    }
  }
  Int4PairsScalar(c + j, pairs - j, scale, x + 2 * j);
}

using Int4Fn = void (*)(const uint8_t*, size_t, float, float*);
Int4Fn PickInt4() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Int4PairsAvx512;
  if (__builtin_cpu_supports("avx2")) return Int4PairsAvx2;
  return Int4PairsScalar;
}
void Int4Pairs(const uint8_t* c, size_t pairs, float scale, float* x) {
  static const Int4Fn fn = PickInt4();
  fn(c, pairs, scale, x);
}
#else
void Int4Pairs(const uint8_t* c, size_t pairs, float scale, float* x) { Int4PairsScalar(c, pairs, scale, x); }
#endif

ATOLL_SIMD_CLONES void Int8Codes(const int8_t* c, size_t n, float scale, float* x) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(c[i]) * scale;
}

// The b values of one whole block (scale, then codes) into x; the block was checked before.
void DecodeBlock(IntCodec codec, const std::byte* in, size_t b, float* x) {
  const float scale = Load<float>(in);
  const auto* c = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
  if (codec.bits == 8) return Int8Codes(reinterpret_cast<const int8_t*>(c), b, scale, x);
  if (codec.bits == 4) {
    Int4Pairs(c, b / 2, scale, x);
    if (b % 2 == 1) x[b - 1] = static_cast<float>(static_cast<int>(c[b / 2] & 15u) - 8) * scale;
    return;
  }
  for (size_t i = 0; i < b; ++i)
    x[i] = static_cast<float>(static_cast<int>((c[i / 4] >> (2 * (i % 4))) & 3u) - 2) * scale;
}

// Whether any of n bytes holds a zero nibble (int4's forbidden code), in one vectorisable loop.
ATOLL_SIMD_CLONES bool AnyZeroNibble(const uint8_t* c, size_t n) {
  unsigned bad = 0;
  for (size_t j = 0; j < n; ++j)
    bad |= static_cast<unsigned>((c[j] & 15u) == 0) | static_cast<unsigned>((c[j] >> 4) == 0);
  return bad != 0;
}

// DataLoss for what Encode never writes in a block: a bad scale, a forbidden code, padding.
Status CheckBlock(IntCodec codec, const std::byte* in, size_t b, size_t index) {
  const float scale = Load<float>(in);
  if (!(scale >= 0) || !std::isfinite(scale * codec.qmax())) {
    return DataLossError(std::string("decode ") + codec.name() + ": block " + std::to_string(index) + " has scale " +
                         std::to_string(scale));
  }
  const auto* c = reinterpret_cast<const uint8_t*>(in + kScaleBytes);
  unsigned bad = 0;
  if (codec.bits == 8) {
    for (size_t i = 0; i < b; ++i) bad |= c[i] == 0x80u;
  } else if (codec.bits == 4) {
    bad |= AnyZeroNibble(c, b / 2) ? 1u : 0u;
    if (b % 2 == 1) bad |= ((c[b / 2] & 15u) == 0) | ((c[b / 2] >> 4) != 0);
  } else {
    for (size_t i = 0; i < b; ++i) bad |= ((c[i / 4] >> (2 * (i % 4))) & 3u) == 0;
    if (b % 4 != 0) bad |= (c[b / 4] >> (2 * (b % 4))) != 0;
  }
  if (bad != 0) {
    return DataLossError(std::string("decode ") + codec.name() + ": block " + std::to_string(index) +
                         " holds a code Encode never writes");
  }
  return Status::Ok();
}

void DecodeIntRange(IntCodec codec, size_t block, const std::byte* raw, size_t n, size_t begin, size_t end,
                    float* out) {
  thread_local std::vector<float> partial;
  const size_t full = codec.BlockBytes(block);
  for (size_t k = begin / block; k * block < end; ++k) {
    const size_t start = k * block, b = std::min(block, n - start);
    const std::byte* in = raw + k * full;  // every block before the last is full
    if (start >= begin && start + b <= end) {
      DecodeBlock(codec, in, b, out + (start - begin));
      continue;
    }
    partial.resize(b);
    DecodeBlock(codec, in, b, partial.data());
    const size_t lo = std::max(start, begin), hi = std::min(start + b, end);
    std::copy(partial.begin() + static_cast<std::ptrdiff_t>(lo - start),
              partial.begin() + static_cast<std::ptrdiff_t>(hi - start), out + (lo - begin));
  }
}

// Checks the blocks that start in [begin, end) (so that every block is checked once).
Status CheckIntRange(IntCodec codec, size_t block, const std::byte* raw, size_t n, size_t begin, size_t end) {
  const size_t full = codec.BlockBytes(block);
  for (size_t k = (begin + block - 1) / block; k * block < end; ++k) {
    ATOLL_RETURN_IF_ERROR(CheckBlock(codec, raw + k * full, std::min(block, n - k * block), k));
  }
  return Status::Ok();
}

bool AllFiniteValues(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(x[i]) & kAbsMask);
  return m < kInfBits;
}

// One tile of InflatePayload's check: its blocks, then its values' chunk sums.
Status CheckTile(const CodecOptions& options, std::span<const std::byte> raw, size_t n, size_t begin, size_t end,
                 std::vector<float>& v, double* parts) {
  const bool int_codec = options.encoding != Encoding::kFp32 && options.encoding != Encoding::kBf16;
  if (int_codec) {
    ATOLL_RETURN_IF_ERROR(CheckIntRange(IntCodecOf(options.encoding), static_cast<size_t>(options.block_size),
                                        raw.data(), n, begin, end));
  }
  v.resize(end - begin);
  DecodeRawRange(options, raw, n, begin, end, v.data());
  if (!int_codec && !AllFiniteValues(v.data(), v.size())) {
    return DataLossError(std::string("decode ") + EncodingName(options.encoding) +
                         ": payload holds a non-finite value");
  }
  for (size_t c = begin; c < end; c += kReduceChunk) {
    parts[(c - begin) / kReduceChunk] = SumSquares(v.data() + (c - begin), std::min(kReduceChunk, end - c));
  }
  return Status::Ok();
}

}  // namespace

void DecodeRawRange(const CodecOptions& options, std::span<const std::byte> raw, size_t n, size_t begin, size_t end,
                    float* out) {
  const std::byte* in = raw.data();
  switch (options.encoding) {
    case Encoding::kFp32: std::memcpy(out, in + 4 * begin, 4 * (end - begin)); return;
    case Encoding::kBf16:
      for (size_t i = begin; i < end; ++i) {
        out[i - begin] = std::bit_cast<float>(static_cast<uint32_t>(Load<uint16_t>(in + 2 * i)) << 16);
      }
      return;
    case Encoding::kInt8:
    case Encoding::kInt4:
    case Encoding::kInt2:
      DecodeIntRange(IntCodecOf(options.encoding), static_cast<size_t>(options.block_size), in, n, begin, end, out);
      return;
  }
}

Status InflatePayload(const CodecOptions& options, std::span<const std::byte> payload, size_t n,
                      std::vector<std::byte>& raw, double* sum_squares, ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(ValidateCodecOptions(options));
  const size_t expected = EncodedSize(options, n);
  const std::string what = std::string("decode ") + EncodingName(options.encoding);
  if (options.compression == Compression::kNone) {
    if (payload.size() != expected) {
      return DataLossError(what + ": expected " + std::to_string(expected) + " bytes for " + std::to_string(n) +
                           " values, got " + std::to_string(payload.size()));
    }
    raw.assign(payload.begin(), payload.end());
  } else {
    const size_t max = MaxPayloadSize(options, n);
    if (payload.empty() || payload.size() > max) {
      return DataLossError(what + "+deflate: a payload of " + std::to_string(payload.size()) + " bytes for " +
                           std::to_string(n) + " values (1 to " + std::to_string(max) + " expected)");
    }
    if (Status st = DecompressBytes(payload, expected, raw, pool); !st.ok())
      return DataLossError(what + ": " + st.message());
  }
  const size_t tiles = std::max<size_t>(1, (n + kTileValues - 1) / kTileValues);
  std::vector<Status> results(tiles);
  std::vector<double> parts((n + kReduceChunk - 1) / kReduceChunk, 0.0);
  const auto tile = [&](size_t t) {
    thread_local std::vector<float> v;
    const size_t b = t * kTileValues, e = std::min(n, b + kTileValues);
    if (b < e) results[t] = CheckTile(options, raw, n, b, e, v, parts.data() + b / kReduceChunk);
  };
  if (pool != nullptr) {
    pool->ParallelFor(tiles, tile);
  } else {
    for (size_t t = 0; t < tiles; ++t) tile(t);
  }
  for (const Status& st : results) ATOLL_RETURN_IF_ERROR(st);
  if (sum_squares != nullptr) *sum_squares = SegmentGrid::Total(parts);
  return Status::Ok();
}

}  // namespace atl::diloco
