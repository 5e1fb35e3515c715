// Wire codecs for outer gradients and parameters: fp32, bf16, int8, int4. All decode to fp32.
//
// Layouts (little-endian, pinned by static_asserts and tests):
//   fp32  N·4 bytes, bit-exact.
//   bf16  N·2 bytes, round-to-nearest-even of the fp32 bits (NaN stays NaN).
//         |x − x̂| ≤ 2⁻⁸·|x| (half an ulp of an 8-bit mantissa).
//   int8  per block of B values: fp32 scale s = absmax/127, then B int8 codes q = round(x/s).
//         Size: N + 4·ceil(N/B). |x − x̂| ≤ s/2 = absmax_block/254.
//   int4  per block: fp32 scale s = absmax/7, then ceil(B/2) bytes of two 4-bit codes
//         (q ∈ [−7, 7] stored as q + 8, low nibble first). Size: ceil(N/2)… exactly
//         Σ_blocks (4 + ceil(b/2)); N/2 + 4·N/B when B is even and divides N.
//         |x − x̂| ≤ s/2 = absmax_block/14.
// A block whose absmax is 0 has scale 0 and decodes to zeros. Encode refuses non-finite input
// (InvalidArgument); Decode refuses a wrong size or a non-finite/negative scale (DataLoss).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::diloco {

enum class Encoding : uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2, kInt4 = 3 };

struct CodecOptions {
  Encoding encoding = Encoding::kInt4;
  int block_size = 128;  // for int8/int4; 8 ≤ B ≤ 65536, even
};

const char* EncodingName(Encoding e);
// "fp32" | "bf16" | "int8" | "int4" → Encoding; InvalidArgument otherwise.
StatusOr<Encoding> ParseEncoding(const std::string& s);

// Exact encoded size in bytes for n values.
size_t EncodedSize(const CodecOptions& options, size_t n);

// Encodes `values` into `out` (resized to EncodedSize).
Status Encode(const CodecOptions& options, std::span<const float> values, std::vector<std::byte>& out);

// Decodes `bytes` holding exactly `out.size()` values into out.
Status Decode(const CodecOptions& options, std::span<const std::byte> bytes, std::span<float> out);

// bf16 helpers (exposed for tests and the bf16 paths elsewhere).
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t b);

}  // namespace atl::diloco
