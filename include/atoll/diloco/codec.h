// Wire codecs for outer gradients and parameters: fp32, bf16, int8, int4, int2. All decode to fp32.
//
// Layouts (little-endian, pinned by static_asserts and tests); N values, blocks of B values (the
// last block has b = N − B·floor(N/B) values when B does not divide N):
//   fp32  N·4 bytes, bit-exact.
//   bf16  N·2 bytes, the upper 16 bits of the fp32 after round-to-nearest-even.
//         |x − x̂| ≤ 2⁻⁸·|x| for normal x (half an ulp of an 8-bit significand); ≤ 2⁻¹³⁴ for
//         fp32 subnormals. Encode refuses |x| ≥ 0x7F7F8000 (≈3.3961e38), which would round to
//         infinity.
//   int8  per block: fp32 scale s = absmax/127, then b int8 codes q = round(x/s) ∈ [−127, 127].
//         Size: N + 4·ceil(N/B).
//   int4  per block: fp32 scale s = absmax/7, then ceil(b/2) bytes holding two 4-bit codes each
//         (q ∈ [−7, 7] stored as q + 8 ∈ [1, 15], low nibble first; an odd block's last high
//         nibble is 0). Size: Σ_blocks (4 + ceil(b/2)), i.e. N/2 + 4·N/B when B divides N.
//   int2  per block: fp32 scale s = absmax/1, then ceil(b/4) bytes holding four 2-bit codes each
//         (q ∈ [−1, 1] stored as q + 2 ∈ [1, 3], low bits first; the unused codes of a last
//         partial byte are 0). Size: N/4 + 4·N/B when 4 divides B and N. Three levels per block:
//         the 2-bit row of the paper's codec ablation, not meant for training.
//   int error bound (fp32 arithmetic included): |x − x̂| ≤ (absmax_block/(2·qmax))·(1 + 2⁻¹²),
//         i.e. absmax/254 (int8), absmax/14 (int4) and absmax/2 (int2) up to float rounding. A block whose
//         absmax/qmax is below FLT_MIN (≈1.2e-38) is stored with scale 0 and decodes to zeros
//         (error ≤ absmax < 2⁻¹¹⁹).
// Compression (lossless, after the quantiser; CodecOptions::compression):
//   none     the encoded bytes above, as they are.
//   deflate  raw DEFLATE (RFC 1951, no zlib header) of those bytes, Huffman coding only (no
//            back-references: quantised codes have no long repeats, and searching for them costs
//            time without saving bytes), in independent segments of 1 MiB (CompressBytes' layout
//            below: any size, and both ends may code the segments in parallel). int4 outer gradients shrink to 0.6–0.85 of their size
//            (their codes are far from uniform); fp32 barely shrinks. Decode inflates into exactly
//            EncodedSize bytes and refuses (DataLoss) a stream that is malformed, ends early,
//            would inflate to more, or is followed by extra bytes — so a hostile payload can never
//            make the receiver allocate or write more than the uncompressed size.
// Encode refuses non-finite input (InvalidArgument). Decode refuses (DataLoss): a wrong size, a
// non-finite/negative scale or one whose scale·qmax overflows, the unused codes −128 (int8),
// nibble 0 (int4) and 0 (int2), non-zero padding codes, and non-finite fp32/bf16 values — none of which
// Encode produces, so they mean corruption. On error the output is unspecified.
// Thread-safety: pure functions. Without compression Encode/Decode do not allocate beyond
// resizing `out`; with deflate each thread keeps one compressor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/parallel.h"
#include "atoll/core/status.h"

namespace atl::diloco {

enum class Encoding : uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2, kInt4 = 3, kInt2 = 4 };
inline constexpr EnumNames<Encoding, 5> kEncodingNames{"encoding",
                                                       {{{Encoding::kInt4, "int4"},
                                                         {Encoding::kInt8, "int8"},
                                                         {Encoding::kBf16, "bf16"},
                                                         {Encoding::kFp32, "fp32"},
                                                         {Encoding::kInt2, "int2"}}}};
constexpr const auto& NamesOf(Encoding) { return kEncodingNames; }

enum class Compression : uint8_t { kNone = 0, kDeflate = 1 };
inline constexpr EnumNames<Compression, 2> kCompressionNames{
    "compression", {{{Compression::kDeflate, "deflate"}, {Compression::kNone, "none"}}}};
constexpr const auto& NamesOf(Compression) { return kCompressionNames; }

struct CodecOptions {
  Encoding encoding = Encoding::kInt4;
  int block_size = 128;  // for int8/int4/int2; 8 ≤ B ≤ 65536, even
  Compression compression = Compression::kNone;
};

// InvalidArgument when the encoding is unknown or (int8/int4/int2) the block size is out of range.
Status ValidateCodecOptions(const CodecOptions& options);

inline const char* EncodingName(Encoding e) { return kEncodingNames.Name(e); }
// "int4" | "int8" | "bf16" | "fp32" | "int2" → Encoding; InvalidArgument otherwise.
inline StatusOr<Encoding> ParseEncoding(std::string_view s) { return kEncodingNames.Parse(s); }

inline const char* CompressionName(Compression c) { return kCompressionNames.Name(c); }
// "deflate" | "none" → Compression; InvalidArgument otherwise.
inline StatusOr<Compression> ParseCompression(std::string_view s) { return kCompressionNames.Parse(s); }

// Exact size in bytes of n values as the quantiser writes them, before compression. Options must
// be valid (ATOLL_CHECK).
size_t EncodedSize(const CodecOptions& options, size_t n);
// The largest payload Encode produces for n values: EncodedSize without compression (then every
// payload has exactly this size), else the deflate bound of EncodedSize (a payload is 1 byte or
// more, up to this). Receivers check an announced size against it before reserving memory.
size_t MaxPayloadSize(const CodecOptions& options, size_t n);
// True when every payload of these options has exactly EncodedSize bytes (no compression).
inline bool ExactPayloadSize(const CodecOptions& options) { return options.compression == Compression::kNone; }

// Encodes `values` into `out` (resized to the payload: EncodedSize bytes, or the compressed
// size). InvalidArgument for invalid options, non-finite values, or (bf16) values beyond the bf16
// range; Internal if the compressor fails.
// `pool` (may be null) codes the deflate segments in parallel: the bytes are the same.
Status Encode(const CodecOptions& options, std::span<const float> values, std::vector<std::byte>& out,
              ThreadPool* pool = nullptr);

// Decodes a payload of `out.size()` values into out. InvalidArgument for invalid options;
// DataLoss for the corruptions listed above (and, compressed, a stream that does not inflate to
// exactly EncodedSize bytes).
Status Decode(const CodecOptions& options, std::span<const std::byte> bytes, std::span<float> out,
              ThreadPool* pool = nullptr);

// A payload read in pieces, for a receiver that keeps it encoded and decodes the part it needs when
// it needs it (the syncer's rounds, docs/decisions/018).
// InflatePayload: the quantiser's bytes of a payload of n values (the layout above) into `raw` —
// the payload itself without compression, else inflated — checked as Decode checks it (DataLoss,
// InvalidArgument for invalid options), and when `sum_squares` is given the decoded values' Σx²
// (reduce.h's chunked form: the same bits at any thread count).
Status InflatePayload(const CodecOptions& options, std::span<const std::byte> payload, size_t n,
                      std::vector<std::byte>& raw, double* sum_squares = nullptr, ThreadPool* pool = nullptr);
// Values [begin, end) of a raw payload of n values that InflatePayload accepted (not checked
// again) into out[0, end − begin): the bits Decode writes there.
void DecodeRawRange(const CodecOptions& options, std::span<const std::byte> raw, size_t n, size_t begin, size_t end,
                    float* out);

// The lossless stage alone, for payloads that are not a codec's values (the downlink's lattice
// deltas, exchange/lattice.h). Layout: uint32 segment count S, then S × (uint32 raw length,
// uint32 compressed length), then the S raw-DEFLATE segments (Huffman only, like Encode's). Each
// segment holds at most kSegmentBytes of the input, so payloads of any size work (zlib counts
// in 32 bits) and segments can be coded independently. Decompress refuses (DataLoss) anything
// that does not inflate to exactly `raw_size` bytes: a wrong count or length, a corrupt or
// truncated segment, bytes after the last one.
inline constexpr size_t kSegmentBytes = size_t{1} << 20;
Status CompressBytes(std::span<const std::byte> raw, std::vector<std::byte>& out, ThreadPool* pool = nullptr);
Status DecompressBytes(std::span<const std::byte> in, size_t raw_size, std::vector<std::byte>& raw,
                       ThreadPool* pool = nullptr);
// The largest output of CompressBytes for `raw_size` input bytes.
size_t MaxCompressedBytes(size_t raw_size);

// bf16 helpers (exposed for tests and the bf16 paths elsewhere). FloatToBf16 rounds to nearest
// even; infinities stay infinite, NaN becomes a quiet NaN of the same sign (never infinity).
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t b);

}  // namespace atl::diloco
