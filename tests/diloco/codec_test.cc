#include "atoll/diloco/codec.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <zlib.h>

#include "atoll/core/rng.h"

namespace atl::diloco {
namespace {

using Bytes = std::vector<std::byte>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

std::vector<float> RoundTrip(const CodecOptions& o, const std::vector<float>& x, Bytes* wire = nullptr) {
  Bytes bytes;
  const Status e = Encode(o, x, bytes);
  EXPECT_TRUE(e.ok()) << e;
  EXPECT_EQ(bytes.size(), EncodedSize(o, x.size()));
  std::vector<float> out(x.size(), -999.0f);
  const Status d = Decode(o, bytes, out);
  EXPECT_TRUE(d.ok()) << d;
  if (wire) *wire = bytes;
  return out;
}

std::vector<uint8_t> U8(const Bytes& b) {
  std::vector<uint8_t> v;
  for (std::byte x : b) v.push_back(static_cast<uint8_t>(x));
  return v;
}

TEST(CodecTest, Names) {
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    auto parsed = ParseEncoding(EncodingName(e));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, e);
  }
  EXPECT_EQ(ParseEncoding("int3").status().code(), StatusCode::kInvalidArgument);
}

TEST(CodecTest, EncodedSizesAreExact) {
  EXPECT_EQ(EncodedSize({Encoding::kFp32}, 1000), 4000u);
  EXPECT_EQ(EncodedSize({Encoding::kBf16}, 1001), 2002u);
  EXPECT_EQ(EncodedSize({Encoding::kInt8, 128}, 1024), 1024u + 4 * 8);
  EXPECT_EQ(EncodedSize({Encoding::kInt8, 128}, 1000), 1000u + 4 * 8);
  EXPECT_EQ(EncodedSize({Encoding::kInt4, 128}, 1024), 512u + 4 * 8);  // N/2 + 4 per block
  EXPECT_EQ(EncodedSize({Encoding::kInt4, 128}, 1000), 7 * (4 + 64) + (4 + 52u));
  EXPECT_EQ(EncodedSize({Encoding::kInt4, 128}, 1001), 7 * (4 + 64) + (4 + 53u));
  EXPECT_EQ(EncodedSize({Encoding::kInt4, 8}, 1), 5u);
  EXPECT_EQ(EncodedSize({Encoding::kInt2, 128}, 1024), 256u + 4 * 8);  // N/4 + 4 per block
  EXPECT_EQ(EncodedSize({Encoding::kInt2, 128}, 1001), 7 * (4 + 32) + (4 + 27u));
  EXPECT_EQ(EncodedSize({Encoding::kInt2, 8}, 1), 5u);
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    EXPECT_EQ(EncodedSize({e, 64}, 0), 0u);
    EXPECT_TRUE(RoundTrip({e, 64}, {}).empty());
  }
}

TEST(CodecTest, Fp32IsBitExact) {
  const std::vector<float> x = {
      0.0f,    -0.0f,      1.0f, -3.25f, FromBits(1), FromBits(0x007fffff), std::numeric_limits<float>::max(),
      -1e-30f, 123456.789f};
  Bytes wire;
  const auto y = RoundTrip({Encoding::kFp32}, x, &wire);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(x[i])) << i;
  }
  // Little-endian layout: 1.0f = 0x3F800000 at bytes 8..11.
  EXPECT_EQ(U8(wire)[8], 0x00);
  EXPECT_EQ(U8(wire)[10], 0x80);
  EXPECT_EQ(U8(wire)[11], 0x3F);
}

TEST(CodecTest, Bf16RoundsToNearestEvenByBitPattern) {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3F800000, 0x3F80},  // 1.0 exact
      {0x3F807FFF, 0x3F80},  // just below half: down
      {0x3F808000, 0x3F80},  // tie, even upper half (0x3F80): stays
      {0x3F808001, 0x3F81},  // just above half: up
      {0x3F818000, 0x3F82},  // tie, odd upper half (0x3F81): up to even
      {0xBF818000, 0xBF82},  // same for negative
      {0x3FFF8000, 0x4000},  // tie carrying into the exponent
      {0x00000001, 0x0000},  // smallest subnormal rounds to +0
      {0x7F7F7FFF, 0x7F7F},  // largest value that stays finite
      {0x7F7F8000, 0x7F80},  // rounds to infinity
      {0x7F800000, 0x7F80},  // infinity stays
      {0xFF800000, 0xFF80},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(FloatToBf16(FromBits(c.in)), c.out) << std::hex << c.in;
  }
  // NaN stays NaN, even one whose payload is only in the low half (plain rounding would make it
  // infinity).
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFF800001u}) {
    EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(nan))))) << std::hex << nan;
  }
  EXPECT_EQ(Bf16ToFloat(0x3F82), FromBits(0x3F820000));
  // Encode uses the same rounding.
  std::vector<float> x;
  for (int i = 0; i < 9; ++i) x.push_back(FromBits(cases[i].in));
  Bytes wire;
  const auto y = RoundTrip({Encoding::kBf16}, x, &wire);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(i)]), static_cast<uint32_t>(cases[i].out) << 16);
  }
  EXPECT_EQ(U8(wire)[6], 0x81);  // value 3 (0x3F81), little-endian
  EXPECT_EQ(U8(wire)[7], 0x3F);
}

TEST(CodecTest, Bf16ErrorBound) {
  Rng rng(1);
  std::vector<float> x(20000);
  for (auto& v : x) v = static_cast<float>(rng.Normal() * std::exp(rng.Uniform(-80, 80)));
  const auto y = RoundTrip({Encoding::kBf16}, x);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
    ASSERT_LE(err, std::ldexp(std::fabs(static_cast<double>(x[i])), -8)) << x[i];
    worst = std::max(worst, err / std::fabs(static_cast<double>(x[i])));
  }
  EXPECT_GT(worst, std::ldexp(1.0, -9));  // the bound is nearly reached: rounding, not luck
  // Subnormals: absolute error ≤ 2⁻¹³⁴.
  const auto s = RoundTrip({Encoding::kBf16}, {FromBits(0x00012345), FromBits(0x807FFFFF)});
  EXPECT_LE(std::fabs(static_cast<double>(FromBits(0x00012345)) - s[0]), std::ldexp(1.0, -134));
  EXPECT_LE(std::fabs(static_cast<double>(FromBits(0x807FFFFF)) - s[1]), std::ldexp(1.0, -134));
}

TEST(CodecTest, Int8HandValues) {
  // Block of 8 with absmax 127: scale exactly 1.
  const std::vector<float> x = {127, -63, 1, 0, 2.4f, -2.6f, 50, 0.49f};
  Bytes wire;
  const auto y = RoundTrip({Encoding::kInt8, 8}, x, &wire);
  EXPECT_EQ(U8(wire), (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F,  // scale 1.0f
                                            127, 0xC1, 1, 0, 2, 0xFD, 50, 0}));
  EXPECT_EQ(y, (std::vector<float>{127, -63, 1, 0, 2, -3, 50, 0}));
}

TEST(CodecTest, Int4HandValuesWithOddTail) {
  // Block 1 (8 values, absmax 7 → scale 1): codes 7 −7 1 2 −3 0 6 0 → nibbles +8.
  // Block 2 (1 value −3.5 → scale 0.5, code −7 → nibble 1, high nibble 0).
  const std::vector<float> x = {7, -7, 1, 2, -3, 0, 6.4f, -0.4f, -3.5f};
  Bytes wire;
  const auto y = RoundTrip({Encoding::kInt4, 8}, x, &wire);
  EXPECT_EQ(U8(wire),
            (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F, 0x1F, 0xA9, 0x85, 0x8E, 0x00, 0x00, 0x00, 0x3F, 0x01}));
  EXPECT_EQ(y, (std::vector<float>{7, -7, 1, 2, -3, 0, 6, 0, -3.5f}));
}

TEST(CodecTest, Int2HandValuesWithPartialTail) {
  // Block 1 (8 values, absmax 4 → scale 4): q = round(x/4) ∈ [−1, 1] → codes q + 2, four per
  // byte, low bits first: 3 1 2 2 | 1 2 3 2 → 0b10_10_01_11 = 0xA7, 0b10_11_10_01 = 0xB9.
  // Block 2 (2 values, absmax 0.5): codes 1 3, the two unused codes of the byte are 0 → 0x0D.
  const std::vector<float> x = {4, -4, 1.9f, -1.9f, -2.1f, 0, 2.1f, 0.5f, -0.5f, 0.5f};
  Bytes wire;
  const auto y = RoundTrip({Encoding::kInt2, 8}, x, &wire);
  EXPECT_EQ(U8(wire), (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x40, 0xA7, 0xB9, 0x00, 0x00, 0x00, 0x3F, 0x0D}));
  EXPECT_EQ(y, (std::vector<float>{4, -4, 0, 0, -4, 0, 4, 0, -0.5f, 0.5f}));
}

void ExpectIntBound(Encoding e, int block, size_t n, uint64_t seed) {
  const double qmax = e == Encoding::kInt8 ? 127 : e == Encoding::kInt4 ? 7 : 1;
  Rng rng(seed);
  std::vector<float> x(n);
  for (size_t start = 0; start < n; start += static_cast<size_t>(block)) {
    const double scale = std::exp(rng.Uniform(-30, 30));  // blocks of very different magnitude
    for (size_t i = start; i < std::min(n, start + static_cast<size_t>(block)); ++i)
      x[i] = static_cast<float>(rng.Normal() * scale);
  }
  const auto y = RoundTrip({e, block}, x);
  double worst_ratio = 0;
  for (size_t start = 0; start < n; start += static_cast<size_t>(block)) {
    const size_t end = std::min(n, start + static_cast<size_t>(block));
    double absmax = 0;
    for (size_t i = start; i < end; ++i) absmax = std::max(absmax, std::fabs(static_cast<double>(x[i])));
    const double bound = absmax / (2 * qmax) * (1 + std::ldexp(1.0, -12));
    for (size_t i = start; i < end; ++i) {
      const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
      ASSERT_LE(err, bound) << EncodingName(e) << " n=" << n << " i=" << i;
      worst_ratio = std::max(worst_ratio, err / bound);
    }
  }
  if (n >= 1000) {
    EXPECT_GT(worst_ratio, 0.9) << "bound should be nearly reached";
  }
}

TEST(CodecTest, IntErrorBounds) {
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    for (int block : {8, 32, 128, 1024}) {
      for (size_t n : {1u, 7u, 8u, 129u, 1000u, 4097u}) {
        ExpectIntBound(e, block, n, 100 * n + static_cast<uint64_t>(block));
      }
    }
  }
}

TEST(CodecTest, ZeroAndTinyBlocksDecodeToZeros) {
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    std::vector<float> x(24, 0.0f);
    x[16] = 1.0f;   // third block non-zero
    x[9] = 1e-40f;  // second block: absmax/qmax below FLT_MIN → flushed
    x[10] = -3e-39f;
    Bytes wire;
    const auto y = RoundTrip({e, 8}, x, &wire);
    for (size_t i = 0; i < 16; ++i) EXPECT_EQ(y[i], 0.0f) << i;
    EXPECT_NEAR(y[16], 1.0f, 1e-6f);
    float scale;
    std::memcpy(&scale, wire.data() + EncodedSize({e, 8}, 8), 4);
    EXPECT_EQ(scale, 0.0f);
  }
}

TEST(CodecTest, EncodeRefusesNonFiniteInput) {
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    for (float bad : {kNaN, kInf, -kInf}) {
      std::vector<float> x(300, 1.0f);
      x[257] = bad;
      Bytes out;
      const Status s = Encode({e, 128}, x, out);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << EncodingName(e);
      EXPECT_NE(s.message().find("257"), std::string::npos) << s;
    }
  }
  Bytes out;
  EXPECT_EQ(Encode({Encoding::kBf16}, std::vector<float>{3.4e38f}, out).code(),
            StatusCode::kInvalidArgument);  // would round to bf16 infinity
  EXPECT_TRUE(Encode({Encoding::kBf16}, std::vector<float>{3.38e38f}, out).ok());
}

TEST(CodecTest, InvalidOptions) {
  std::vector<float> x(16, 1.0f), y(16);
  Bytes out;
  for (int block : {0, 6, 7, 9, 65538}) {
    EXPECT_EQ(Encode({Encoding::kInt4, block}, x, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(Decode({Encoding::kInt8, block}, out, y).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(ValidateCodecOptions({Encoding::kInt4, 65536}).ok());
  EXPECT_TRUE(ValidateCodecOptions({Encoding::kFp32, 0}).ok());  // block size unused
  EXPECT_FALSE(ValidateCodecOptions({static_cast<Encoding>(9), 128}).ok());
}

// Encodes 20 values (blocks of 8: 8 + 8 + 4) and returns the wire bytes.
Bytes Wire(Encoding e) {
  std::vector<float> x(20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 9.5f;
  Bytes b;
  EXPECT_TRUE(Encode({e, 8}, x, b).ok());
  return b;
}

Status DecodeWire(Encoding e, const Bytes& b, size_t n = 20) {
  std::vector<float> y(n);
  return Decode({e, 8}, b, y);
}

void PutFloat(Bytes& b, size_t at, float v) { std::memcpy(b.data() + at, &v, 4); }

TEST(CodecTest, DecodeRefusesCorruption) {
  // n values whose packed codes leave unused bits in the last byte: setting `bits` there is refused.
  auto expect_tail_padding_refused = [](Encoding e, size_t n, uint8_t bits) {
    std::vector<float> x(n, 1.0f), y(n);
    Bytes b;
    ASSERT_TRUE(Encode({e, 8}, x, b).ok());
    ASSERT_TRUE(Decode({e, 8}, b, y).ok());
    b.back() = static_cast<std::byte>(static_cast<uint8_t>(b.back()) | bits);
    EXPECT_EQ(Decode({e, 8}, b, y).code(), StatusCode::kDataLoss) << EncodingName(e);
  };
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    Bytes b = Wire(e);
    ASSERT_TRUE(DecodeWire(e, b).ok());
    Bytes longer = b;
    longer.push_back(std::byte{0});
    EXPECT_EQ(DecodeWire(e, longer).code(), StatusCode::kDataLoss) << EncodingName(e);
    Bytes shorter(b.begin(), b.end() - 1);
    EXPECT_EQ(DecodeWire(e, shorter).code(), StatusCode::kDataLoss) << EncodingName(e);
    EXPECT_EQ(DecodeWire(e, b, 19).code(), StatusCode::kDataLoss) << EncodingName(e);
  }
  // Scales: NaN, negative, infinite, overflowing scale·qmax. Block 2 starts at 4 + 8 (int8).
  for (Encoding e : {Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    const size_t second = EncodedSize({e, 8}, 8);
    for (float scale : {kNaN, -1.0f, kInf, 3e38f}) {
      if (e == Encoding::kInt2 && scale == 3e38f) continue;  // qmax 1: every finite scale is valid
      Bytes b = Wire(e);
      PutFloat(b, second, scale);
      EXPECT_EQ(DecodeWire(e, b).code(), StatusCode::kDataLoss) << EncodingName(e) << scale;
    }
  }
  {  // int8 code −128 is never written.
    Bytes b = Wire(Encoding::kInt8);
    b[5] = std::byte{0x80};
    EXPECT_EQ(DecodeWire(Encoding::kInt8, b).code(), StatusCode::kDataLoss);
  }
  {  // int4 nibble 0 is never written (q + 8 ∈ [1, 15]).
    Bytes b = Wire(Encoding::kInt4);
    b[6] = static_cast<std::byte>(static_cast<uint8_t>(b[6]) & 0xF0);
    EXPECT_EQ(DecodeWire(Encoding::kInt4, b).code(), StatusCode::kDataLoss);
  }
  expect_tail_padding_refused(Encoding::kInt4, 9, 0x10);  // int4 odd tail: the padding nibble must be 0
  {                                                       // int2 code 0 is never written (q + 2 ∈ [1, 3]).
    Bytes b = Wire(Encoding::kInt2);
    b[4] = static_cast<std::byte>(static_cast<uint8_t>(b[4]) & 0xFC);
    EXPECT_EQ(DecodeWire(Encoding::kInt2, b).code(), StatusCode::kDataLoss);
  }
  expect_tail_padding_refused(Encoding::kInt2, 10, 0x40);  // int2 partial tail: the unused codes must be 0
  {                                                        // Non-finite values in fp32 / bf16 payloads.
    Bytes f = Wire(Encoding::kFp32);
    PutFloat(f, 12, kInf);
    EXPECT_EQ(DecodeWire(Encoding::kFp32, f).code(), StatusCode::kDataLoss);
    Bytes h = Wire(Encoding::kBf16);
    h[6] = std::byte{0xC0};
    h[7] = std::byte{0x7F};
    EXPECT_EQ(DecodeWire(Encoding::kBf16, h).code(), StatusCode::kDataLoss);
  }
}

// ---- The lossless deflate stage ----

constexpr Compression kZ = Compression::kDeflate;

// Raw DEFLATE of arbitrary bytes (what a hostile peer can send), level 9 with back-references.
Bytes RawDeflate(const Bytes& in) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&z, static_cast<uLong>(in.size())));
  z.next_in = const_cast<Bytef*>(reinterpret_cast<const Bytef*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - z.avail_out);
  deflateEnd(&z);
  return out;
}

// One raw DEFLATE stream in the segment layout Decode reads (CompressBytes): count 1, the raw and
// compressed lengths, the stream.
Bytes OneSegment(const Bytes& stream, size_t raw_len) {
  Bytes out(12 + stream.size());
  const uint32_t words[3] = {1, static_cast<uint32_t>(raw_len), static_cast<uint32_t>(stream.size())};
  std::memcpy(out.data(), words, 12);
  if (!stream.empty()) std::memcpy(out.data() + 12, stream.data(), stream.size());
  return out;
}

std::vector<float> Gaussian(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  return x;
}

TEST(CodecCompressionTest, Names) {
  for (Compression c : {Compression::kNone, kZ}) {
    auto parsed = ParseCompression(CompressionName(c));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, c);
  }
  EXPECT_EQ(ParseCompression("gzip").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseCompression("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateCodecOptions({Encoding::kInt4, 128, static_cast<Compression>(7)}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(ExactPayloadSize({Encoding::kInt4, 128}));
  EXPECT_FALSE(ExactPayloadSize({Encoding::kInt4, 128, kZ}));
}

TEST(CodecCompressionTest, DecodesToTheSameBitsAsWithoutIt) {
  const std::vector<float> x = Gaussian(5000, 7);  // 5000: a partial last block for every block size
  for (Encoding e : {Encoding::kFp32, Encoding::kBf16, Encoding::kInt8, Encoding::kInt4, Encoding::kInt2}) {
    const CodecOptions raw{e, 256}, z{e, 256, kZ};
    Bytes wire;
    ASSERT_TRUE(Encode(z, x, wire).ok()) << EncodingName(e);
    EXPECT_GE(wire.size(), 1u);
    EXPECT_LE(wire.size(), MaxPayloadSize(z, x.size())) << EncodingName(e);
    EXPECT_EQ(MaxPayloadSize(raw, x.size()), EncodedSize(raw, x.size()));
    EXPECT_GT(MaxPayloadSize(z, x.size()), EncodedSize(z, x.size()));
    std::vector<float> a(x.size()), b(x.size());
    ASSERT_TRUE(Decode(z, wire, a).ok()) << EncodingName(e);
    const std::vector<float> expected = RoundTrip(raw, x);
    ASSERT_EQ(std::memcmp(a.data(), expected.data(), a.size() * sizeof(float)), 0) << EncodingName(e);
  }
}

TEST(CodecCompressionTest, QuantisedCodesShrink) {
  // int4 codes of Gaussian values use 15 levels far from uniformly (entropy ≈ 3.3 bits of 4);
  // heavier tails (what outer gradients have) concentrate them further.
  const std::vector<float> g = Gaussian(1 << 16, 3);
  std::vector<float> heavy(g.size());
  for (size_t i = 0; i < g.size(); ++i) heavy[i] = g[i] * g[i] * g[i];
  for (const auto& [x, at_most] :
       std::vector<std::pair<const std::vector<float>*, double>>{{&g, 0.90}, {&heavy, 0.75}}) {
    Bytes wire;
    ASSERT_TRUE(Encode({Encoding::kInt4, 256, kZ}, *x, wire).ok());
    const double ratio =
        static_cast<double>(wire.size()) / static_cast<double>(EncodedSize({Encoding::kInt4, 256}, x->size()));
    EXPECT_LT(ratio, at_most);
    EXPECT_GT(ratio, 0.3);  // and not by magic: the codes carry information
  }
}

TEST(CodecCompressionTest, DecodeRefusesBadStreams) {
  const CodecOptions z{Encoding::kInt4, 8, kZ};
  std::vector<float> x(20), y(20), y21(21), y19(19);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 9.5f;
  Bytes good;
  ASSERT_TRUE(Encode(z, x, good).ok());
  ASSERT_TRUE(Decode(z, good, y).ok());
  auto expect_loss = [&](const Bytes& b, std::span<float> out, const char* what) {
    const Status st = Decode(z, b, out);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << what << ": " << st;
  };
  expect_loss({}, y, "empty");
  expect_loss(Bytes(good.begin(), good.end() - 1), y, "truncated stream");
  Bytes trailing = good;
  trailing.push_back(std::byte{0});
  expect_loss(trailing, y, "bytes after the stream");
  expect_loss(good, y21, "inflates to fewer bytes than 21 values need");
  expect_loss(good, y19, "inflates to more bytes than 19 values need");
  Bytes garbage(40);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<std::byte>(0xA5 ^ (i * 37));
  expect_loss(garbage, y, "not a deflate stream");
  // (A flipped bit inside a Huffman stream can decode to other valid codes: raw deflate has no
  // checksum of its own. The payload checksum of every push and pull catches that.)
  expect_loss(Bytes(MaxPayloadSize(z, 20) + 1, std::byte{0}), y, "larger than any stream of 20 values");
  // A valid stream whose inflated bytes are corrupt codes (int4 nibble 0): the quantiser's check.
  Bytes raw;
  ASSERT_TRUE(Encode({Encoding::kInt4, 8}, x, raw).ok());
  raw[6] = static_cast<std::byte>(static_cast<uint8_t>(raw[6]) & 0xF0);
  expect_loss(OneSegment(RawDeflate(raw), raw.size()), y, "corrupt codes inside a valid stream");
}

TEST(CodecCompressionTest, ABombInflatesNoFurtherThanTheExpectedSize) {
  // 16 MiB of zeros in about 16 KiB, announced for 32768 int4 values (32 KiB raw, so the
  // stream passes the size check): inflating stops at those 32 KiB.
  std::vector<float> y(32768);
  const CodecOptions z{Encoding::kInt4, 8, kZ};
  const Bytes bomb = OneSegment(RawDeflate(Bytes(16u << 20, std::byte{0})), EncodedSize(z, y.size()));
  ASSERT_LE(bomb.size(), MaxPayloadSize(z, y.size()));
  const Status st = Decode(z, bomb, y);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("more than"), std::string::npos) << st;
}

}  // namespace
}  // namespace atl::diloco
