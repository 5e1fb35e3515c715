// The codecs' byte layouts (codec.h) as the encoder, the decoder and the range decoder share them.
// Internal to atoll_diloco.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "atoll/diloco/codec.h"

namespace atl::diloco::layout {

static_assert(std::endian::native == std::endian::little,
              "the wire layouts are little-endian and the codecs copy native words");
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4);

inline constexpr uint32_t kAbsMask = 0x7fffffffu;
inline constexpr uint32_t kInfBits = 0x7f800000u;           // |bits| ≥ this: inf or NaN
inline constexpr uint32_t kBf16OverflowBits = 0x7f7f8000u;  // |bits| ≥ this: rounds to bf16 inf
inline constexpr float kRoundMagic = 12582912.0f;           // 1.5·2²³: (q + M) − M rounds q to even
inline constexpr size_t kScaleBytes = 4;

// Unaligned little-endian word access; memcpy compiles to a plain (vectorisable) load/store.
template <typename T>
inline T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// The integer codecs: int8 (one signed byte per code), int4 and int2 (codes packed low bits
// first, q + qmax + 1 stored so that the all-zero code is never written).
struct IntCodec {
  int bits;  // 8, 4 or 2
  float qmax() const { return static_cast<float>((1 << (bits - 1)) - 1); }
  size_t per_byte() const { return static_cast<size_t>(8 / bits); }
  const char* name() const { return bits == 8 ? "int8" : bits == 4 ? "int4" : "int2"; }
  size_t BlockBytes(size_t b) const { return kScaleBytes + (b + per_byte() - 1) / per_byte(); }
};

inline IntCodec IntCodecOf(Encoding e) { return {e == Encoding::kInt8 ? 8 : e == Encoding::kInt4 ? 4 : 2}; }

}  // namespace atl::diloco::layout
