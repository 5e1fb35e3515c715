#include "atoll/diloco/codec.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include <libdeflate.h>
#include <zlib.h>

#include "codec_layout.h"

namespace atl::diloco {

using namespace layout;

namespace {

// The largest |x| as raw bits: for non-negative floats the bit order is the value order, and
// inf/NaN compare ≥ kInfBits, so one integer max both finds absmax and detects non-finite input.
uint32_t MaxAbsBits(const float* x, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    m = u > m ? u : m;
  }
  return m;
}

// Slow path for error messages only.
Status RefuseValue(const float* x, size_t n, size_t base, uint32_t limit, const char* why) {
  for (size_t i = 0; i < n; ++i) {
    if ((std::bit_cast<uint32_t>(x[i]) & kAbsMask) >= limit) {
      return InvalidArgumentError("encode: value " + std::to_string(x[i]) + " at index " + std::to_string(base + i) +
                                  " " + why);
    }
  }
  return InternalError("encode: refused value not found");
}

inline int32_t Quantize(float x, float inv_scale, float qmax) {
  float q = x * inv_scale;
  q = (q + kRoundMagic) - kRoundMagic;
  q = std::min(std::max(q, -qmax), qmax);
  return static_cast<int32_t>(q);
}

Status EncodeIntBlocks(IntCodec codec, size_t block, std::span<const float> values, std::byte* out) {
  const float qmax = codec.qmax();
  const size_t n = values.size();
  for (size_t start = 0; start < n; start += block) {
    const size_t b = std::min(block, n - start);
    const float* x = values.data() + start;
    const uint32_t absmax_bits = MaxAbsBits(x, b);
    if (absmax_bits >= kInfBits) return RefuseValue(x, b, start, kInfBits, "is not finite");
    float scale = std::bit_cast<float>(absmax_bits) / qmax;
    if (!(scale >= FLT_MIN)) {
      scale = 0;  // flush: 1/scale would overflow, and such a block is zero for all purposes
    } else if (!std::isfinite(scale * qmax)) {
      return InvalidArgumentError("encode: block at index " + std::to_string(start) +
                                  " is too large for an fp32 scale");
    }
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    Store<float>(out, scale);
    out += kScaleBytes;
    if (codec.bits == 8) {
      auto* o = reinterpret_cast<int8_t*>(out);
      for (size_t i = 0; i < b; ++i) o[i] = static_cast<int8_t>(Quantize(x[i], inv, qmax));
    } else {
      auto* o = reinterpret_cast<uint8_t*>(out);
      const int32_t offset = static_cast<int32_t>(qmax) + 1;
      const size_t k = codec.per_byte();
      std::fill(o, o + (b + k - 1) / k, uint8_t{0});
      for (size_t i = 0; i < b; ++i) {
        const int32_t c = Quantize(x[i], inv, qmax) + offset;
        o[i / k] = static_cast<uint8_t>(o[i / k] | (c << (codec.bits * static_cast<int>(i % k))));
      }
    }
    out += codec.BlockBytes(b) - kScaleBytes;
  }
  return Status::Ok();
}

Status DecodeIntBlocks(IntCodec codec, size_t block, const std::byte* in, std::span<float> values) {
  const float qmax = codec.qmax();
  const size_t n = values.size();
  for (size_t start = 0; start < n; start += block) {
    const size_t b = std::min(block, n - start);
    float* x = values.data() + start;
    const float scale = Load<float>(in);
    in += kScaleBytes;
    if (!(scale >= 0) || !std::isfinite(scale * qmax)) {
      return DataLossError(std::string("decode ") + codec.name() + ": block " + std::to_string(start / block) +
                           " has scale " + std::to_string(scale));
    }
    int bad = 0;
    if (codec.bits == 8) {
      const auto* c = reinterpret_cast<const int8_t*>(in);
      for (size_t i = 0; i < b; ++i) {
        bad |= c[i] == -128;
        x[i] = static_cast<float>(c[i]) * scale;
      }
    } else {
      const auto* c = reinterpret_cast<const uint8_t*>(in);
      const int32_t offset = static_cast<int32_t>(qmax) + 1, mask = (1 << codec.bits) - 1;
      const size_t k = codec.per_byte();
      for (size_t i = 0; i < b; ++i) {
        const int32_t code = (c[i / k] >> (codec.bits * static_cast<int>(i % k))) & mask;
        bad |= code == 0;
        x[i] = static_cast<float>(code - offset) * scale;
      }
      if (b % k != 0) bad |= (c[b / k] >> (codec.bits * static_cast<int>(b % k))) != 0;  // padding codes
    }
    if (bad != 0) {
      return DataLossError(std::string("decode ") + codec.name() + ": block " + std::to_string(start / block) +
                           " holds a code Encode never writes");
    }
    in += codec.BlockBytes(b) - kScaleBytes;
  }
  return Status::Ok();
}

}  // namespace

Status ValidateCodecOptions(const CodecOptions& options) {
  if (options.compression != Compression::kNone && options.compression != Compression::kDeflate) {
    return InvalidArgumentError("codec: unknown compression " + std::to_string(static_cast<int>(options.compression)));
  }
  switch (options.encoding) {
    case Encoding::kFp32:
    case Encoding::kBf16: return Status::Ok();
    case Encoding::kInt8:
    case Encoding::kInt4:
    case Encoding::kInt2:
      if (options.block_size < 8 || options.block_size > 65536 || options.block_size % 2 != 0) {
        return InvalidArgumentError("codec: block size must be even and in [8, 65536], got " +
                                    std::to_string(options.block_size));
      }
      return Status::Ok();
  }
  return InvalidArgumentError("codec: unknown encoding " + std::to_string(static_cast<int>(options.encoding)));
}

size_t EncodedSize(const CodecOptions& options, size_t n) {
  ATOLL_CHECK_MSG(ValidateCodecOptions(options).ok(), "EncodedSize: invalid codec options");
  switch (options.encoding) {
    case Encoding::kFp32: return 4 * n;
    case Encoding::kBf16: return 2 * n;
    case Encoding::kInt8:
    case Encoding::kInt4:
    case Encoding::kInt2: {
      const IntCodec codec = IntCodecOf(options.encoding);
      const size_t block = static_cast<size_t>(options.block_size);
      const size_t full = n / block;
      const size_t tail = n % block;
      return full * codec.BlockBytes(block) + (tail > 0 ? codec.BlockBytes(tail) : 0);
    }
  }
  return 0;
}

namespace {

// The quantiser alone (the layouts at the top of codec.h); options are valid.
Status EncodeRaw(const CodecOptions& options, std::span<const float> values, std::vector<std::byte>& out) {
  const size_t n = values.size();
  out.resize(EncodedSize(options, n));
  std::byte* o = out.data();
  const float* x = values.data();
  switch (options.encoding) {
    case Encoding::kFp32: {
      uint32_t m = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(x[i]);
        Store<uint32_t>(o + 4 * i, u);
        m = std::max(m, u & kAbsMask);
      }
      if (m >= kInfBits) return RefuseValue(x, n, 0, kInfBits, "is not finite");
      return Status::Ok();
    }
    case Encoding::kBf16: {
      uint32_t m = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(x[i]);
        Store<uint16_t>(o + 2 * i, static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
        m = std::max(m, u & kAbsMask);
      }
      if (m >= kBf16OverflowBits) {
        return RefuseValue(x, n, 0, kBf16OverflowBits, "is not finite or beyond the bf16 range");
      }
      return Status::Ok();
    }
    case Encoding::kInt8:
    case Encoding::kInt4:
    case Encoding::kInt2:
      return EncodeIntBlocks(IntCodecOf(options.encoding), static_cast<size_t>(options.block_size), values, o);
  }
  return InternalError("encode: unreachable");
}

Status DecodeRaw(const CodecOptions& options, std::span<const std::byte> bytes, std::span<float> out) {
  const size_t n = out.size();
  const size_t expected = EncodedSize(options, n);
  if (bytes.size() != expected) {
    return DataLossError(std::string("decode ") + EncodingName(options.encoding) + ": expected " +
                         std::to_string(expected) + " bytes for " + std::to_string(n) + " values, got " +
                         std::to_string(bytes.size()));
  }
  const std::byte* in = bytes.data();
  float* x = out.data();
  switch (options.encoding) {
    case Encoding::kFp32:
    case Encoding::kBf16: {
      const bool bf16 = options.encoding == Encoding::kBf16;
      uint32_t m = 0;
      if (bf16) {
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = static_cast<uint32_t>(Load<uint16_t>(in + 2 * i)) << 16;
          x[i] = std::bit_cast<float>(u);
          m = std::max(m, u & kAbsMask);
        }
      } else {
        for (size_t i = 0; i < n; ++i) {
          const uint32_t u = Load<uint32_t>(in + 4 * i);
          x[i] = std::bit_cast<float>(u);
          m = std::max(m, u & kAbsMask);
        }
      }
      if (m >= kInfBits) {
        return DataLossError(std::string("decode ") + EncodingName(options.encoding) +
                             ": payload holds a non-finite value");
      }
      return Status::Ok();
    }
    case Encoding::kInt8:
    case Encoding::kInt4:
    case Encoding::kInt2:
      return DecodeIntBlocks(IntCodecOf(options.encoding), static_cast<size_t>(options.block_size), in, out);
  }
  return InternalError("decode: unreachable");
}

// One raw-DEFLATE compressor and decompressor per thread, reset between payloads (zlib's state is
// a few hundred KB; allocating it per fragment would cost more than the coding itself).
class Deflater {
 public:
  static Deflater& ForThisThread() {
    thread_local Deflater d;
    return d;
  }
  Deflater(const Deflater&) = delete;
  Deflater& operator=(const Deflater&) = delete;
  ~Deflater() {
    if (deflate_ok_) deflateEnd(&def_);
    if (inflater_ != nullptr) libdeflate_free_decompressor(inflater_);
  }

  Status Compress(std::span<const std::byte> in, std::vector<std::byte>& out) {
    if (!deflate_ok_) return InternalError("deflate: the compressor could not be initialised");
    if (deflateReset(&def_) != Z_OK) return InternalError("deflate: reset failed");
    out.resize(deflateBound(&def_, static_cast<uLong>(in.size())));
    def_.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(in.data()));
    def_.avail_in = static_cast<uInt>(in.size());
    def_.next_out = reinterpret_cast<Bytef*>(out.data());
    def_.avail_out = static_cast<uInt>(out.size());
    if (deflate(&def_, Z_FINISH) != Z_STREAM_END) return InternalError("deflate: the payload did not fit its bound");
    out.resize(out.size() - def_.avail_out);
    return Status::Ok();
  }

  // Inflates `in` into exactly out.size() bytes; DataLoss unless the stream is valid, ends exactly
  // there, and nothing follows it. libdeflate: a few times zlib's speed, and it never writes past
  // `out` (a stream that would inflate to more is refused).
  Status Decompress(std::span<const std::byte> in, std::span<std::byte> out) {
    if (inflater_ == nullptr) return InternalError("inflate: the decompressor could not be initialised");
    size_t used = 0, produced = 0;
    const libdeflate_result rc =
        libdeflate_deflate_decompress_ex(inflater_, in.data(), in.size(), out.data(), out.size(), &used, &produced);
    if (rc == LIBDEFLATE_SUCCESS) {
      if (produced != out.size()) {
        return DataLossError("deflate payload inflates to " + std::to_string(produced) + " bytes, expected " +
                             std::to_string(out.size()));
      }
      if (used != in.size()) {
        return DataLossError(std::to_string(in.size() - used) + " bytes follow the end of the deflate stream");
      }
      return Status::Ok();
    }
    if (rc == LIBDEFLATE_INSUFFICIENT_SPACE) {
      return DataLossError("deflate payload inflates to more than the expected " + std::to_string(out.size()) +
                           " bytes");
    }
    return DataLossError("deflate payload is corrupt or ends early");
  }

 private:
  Deflater() {
    // Level 1 with Z_HUFFMAN_ONLY: entropy coding of the bytes, no search for repeats.
    deflate_ok_ = deflateInit2(&def_, 1, Z_DEFLATED, -15, 8, Z_HUFFMAN_ONLY) == Z_OK;
    inflater_ = libdeflate_alloc_decompressor();
  }
  z_stream def_{};
  bool deflate_ok_ = false;
  libdeflate_decompressor* inflater_ = nullptr;
};

}  // namespace

size_t MaxPayloadSize(const CodecOptions& options, size_t n) {
  const size_t raw = EncodedSize(options, n);
  return options.compression == Compression::kNone ? raw : MaxCompressedBytes(raw);
}

Status Encode(const CodecOptions& options, std::span<const float> values, std::vector<std::byte>& out,
              ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(ValidateCodecOptions(options));
  if (options.compression == Compression::kNone) return EncodeRaw(options, values, out);
  std::vector<std::byte> raw;
  ATOLL_RETURN_IF_ERROR(EncodeRaw(options, values, raw));
  ATOLL_RETURN_IF_ERROR(CompressBytes(raw, out, pool));
  ATOLL_CHECK(out.size() <= MaxPayloadSize(options, values.size()));
  return Status::Ok();
}

Status Decode(const CodecOptions& options, std::span<const std::byte> bytes, std::span<float> out, ThreadPool* pool) {
  ATOLL_RETURN_IF_ERROR(ValidateCodecOptions(options));
  if (options.compression == Compression::kNone) return DecodeRaw(options, bytes, out);
  const size_t max = MaxPayloadSize(options, out.size());
  if (bytes.empty() || bytes.size() > max) {
    return DataLossError(std::string("decode ") + EncodingName(options.encoding) + "+deflate: a payload of " +
                         std::to_string(bytes.size()) + " bytes for " + std::to_string(out.size()) + " values (1 to " +
                         std::to_string(max) + " expected)");
  }
  std::vector<std::byte> raw;
  Status st = DecompressBytes(bytes, EncodedSize(options, out.size()), raw, pool);
  if (!st.ok()) return DataLossError(std::string("decode ") + EncodingName(options.encoding) + ": " + st.message());
  return DecodeRaw(options, raw, out);
}

namespace {

void PutU32(std::vector<std::byte>& out, size_t at, uint32_t v) { std::memcpy(out.data() + at, &v, 4); }
uint32_t GetU32(std::span<const std::byte> in, size_t at) {
  uint32_t v;
  std::memcpy(&v, in.data() + at, 4);
  return v;
}
size_t SegmentCount(size_t raw_size) { return (raw_size + kSegmentBytes - 1) / kSegmentBytes; }
// zlib's conservative deflate bound for one segment (any level and strategy, raw stream).
size_t SegmentBound(size_t n) { return n + (n + 7) / 8 + (n + 63) / 64 + 5 + 16; }

}  // namespace

size_t MaxCompressedBytes(size_t raw_size) {
  const size_t segments = SegmentCount(raw_size);
  size_t total = 4 + 8 * segments;
  for (size_t s = 0; s < segments; ++s) total += SegmentBound(std::min(kSegmentBytes, raw_size - s * kSegmentBytes));
  return total;
}

Status CompressBytes(std::span<const std::byte> raw, std::vector<std::byte>& out, ThreadPool* pool) {
  const size_t segments = SegmentCount(raw.size());
  std::vector<std::vector<std::byte>> pieces(segments);
  std::vector<Status> results(segments);
  ForRanges(pool, segments, 1, [&](size_t first, size_t last) {
    for (size_t s = first; s < last; ++s) {
      const auto in = raw.subspan(s * kSegmentBytes, std::min(kSegmentBytes, raw.size() - s * kSegmentBytes));
      results[s] = Deflater::ForThisThread().Compress(in, pieces[s]);
    }
  });
  for (const Status& st : results) ATOLL_RETURN_IF_ERROR(st);
  out.assign(4 + 8 * segments, std::byte{0});
  PutU32(out, 0, static_cast<uint32_t>(segments));
  for (size_t s = 0; s < segments; ++s) {
    PutU32(out, 4 + 8 * s, static_cast<uint32_t>(std::min(kSegmentBytes, raw.size() - s * kSegmentBytes)));
    PutU32(out, 8 + 8 * s, static_cast<uint32_t>(pieces[s].size()));
    out.insert(out.end(), pieces[s].begin(), pieces[s].end());
  }
  return Status::Ok();
}

Status DecompressBytes(std::span<const std::byte> in, size_t raw_size, std::vector<std::byte>& raw, ThreadPool* pool) {
  const size_t segments = SegmentCount(raw_size);
  if (in.size() < 4 || GetU32(in, 0) != segments || in.size() < 4 + 8 * segments) {
    return DataLossError("compressed payload: " + std::to_string(in.size()) + " bytes do not hold the " +
                         std::to_string(segments) + " segment(s) of " + std::to_string(raw_size) + " bytes");
  }
  // Every segment's place, checked before any is inflated.
  std::vector<size_t> at(segments);
  size_t pos = 4 + 8 * segments;
  for (size_t s = 0; s < segments; ++s) {
    const size_t want = std::min(kSegmentBytes, raw_size - s * kSegmentBytes);
    const size_t raw_len = GetU32(in, 4 + 8 * s), comp_len = GetU32(in, 8 + 8 * s);
    if (raw_len != want || comp_len == 0 || comp_len > in.size() - pos) {
      return DataLossError("compressed payload: segment " + std::to_string(s) + " announces " +
                           std::to_string(raw_len) + " raw and " + std::to_string(comp_len) + " compressed bytes");
    }
    at[s] = pos;
    pos += comp_len;
  }
  if (pos != in.size())
    return DataLossError(std::to_string(in.size() - pos) + " bytes after the last compressed segment");
  raw.resize(raw_size);
  std::vector<Status> results(segments);
  ForRanges(pool, segments, 1, [&](size_t first, size_t last) {
    for (size_t s = first; s < last; ++s) {
      const size_t want = std::min(kSegmentBytes, raw_size - s * kSegmentBytes);
      results[s] = Deflater::ForThisThread().Decompress(in.subspan(at[s], GetU32(in, 8 + 8 * s)),
                                                        std::span<std::byte>(raw).subspan(s * kSegmentBytes, want));
    }
  });
  for (size_t s = 0; s < segments; ++s) {
    if (!results[s].ok())
      return DataLossError("compressed payload: segment " + std::to_string(s) + ": " + results[s].message());
  }
  return Status::Ok();
}

uint16_t FloatToBf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & kAbsMask) > kInfBits) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace atl::diloco
