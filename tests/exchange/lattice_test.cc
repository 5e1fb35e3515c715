#include "atoll/exchange/lattice.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::exchange {
namespace {

std::vector<float> Normal(size_t n, double sd, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal(0, sd));
  return v;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The unit of a block is 2^-14 of its largest value's power of two (a zero block: 2^-20), and
// snapping moves a value by at most half a unit.
TEST(Lattice, UnitsFollowTheInitialValuesAndSnappingMovesHalfAUnitAtMost) {
  std::vector<float> init(20, 0.0f);
  for (int i = 0; i < 8; ++i) init[static_cast<size_t>(i)] = 0.03f * static_cast<float>(i % 3);  // block 0: max 0.06
  for (int i = 8; i < 16; ++i) init[static_cast<size_t>(i)] = 1.5f;                              // block 1: max 1.5
  auto l = MakeLattice(init, 8);  // block 2: zeros (4 values)
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->num_blocks(), 3u);
  EXPECT_EQ(l->exp[0], std::ilogb(0.06f) - 14);
  EXPECT_EQ(l->exp[1], 0 - 14);
  EXPECT_EQ(l->exp[2], -6 - 14);
  std::vector<float> snapped = init;
  SnapToLattice(*l, snapped);
  for (size_t i = 0; i < init.size(); ++i) {
    const double unit = std::ldexp(1.0, l->exp[i / 8]);
    EXPECT_LE(std::fabs(snapped[i] - init[i]), unit / 2) << i;
    EXPECT_EQ(std::fmod(static_cast<double>(snapped[i]), unit), 0.0) << i;  // on the lattice
  }
  EXPECT_FALSE(MakeLattice(init, 4).ok());
  init[3] = NAN;
  EXPECT_FALSE(MakeLattice(init, 8).ok());
}

// Round after round of error feedback: Φ follows Θ within one step, and every chain of deltas
// sums to one delta that gives exactly the same bits as applying the chain one by one.
TEST(Lattice, ChainsOfDeltasSumExactly) {
  const size_t n = 1000;
  std::vector<float> theta = Normal(n, 0.02, 1);
  auto l = MakeLattice(theta, 64);
  ASSERT_TRUE(l.ok());
  std::vector<float> phi = theta;
  SnapToLattice(*l, phi);
  std::vector<std::vector<float>> versions = {phi};
  std::vector<std::vector<std::byte>> deltas;
  Rng rng(2);
  for (int round = 0; round < 12; ++round) {
    for (float& x : theta) x += static_cast<float>(rng.Normal(0, 0.001 * (1 + round % 4)));
    std::vector<std::byte> raw;
    LatticeStepStats stats;
    ASSERT_TRUE(EncodeLatticeStep(*l, 7, theta, phi, raw, &stats).ok());
    EXPECT_EQ(stats.saturated, 0);
    ASSERT_TRUE(CheckLatticeDelta(*l, raw).ok());
    std::vector<float> applied = versions.back();
    ASSERT_TRUE(ApplyLatticeDelta(*l, raw, applied).ok());
    ASSERT_TRUE(SameBits(applied, phi)) << "round " << round;
    versions.push_back(phi);
    deltas.push_back(std::move(raw));
  }
  for (size_t u = 0; u < versions.size(); ++u) {
    std::vector<std::span<const std::byte>> chain(deltas.begin() + static_cast<ptrdiff_t>(u), deltas.end());
    std::vector<std::byte> sum;
    ASSERT_TRUE(SumLatticeDeltas(*l, chain, sum).ok());
    std::vector<float> from_u = versions[u];
    ASSERT_TRUE(ApplyLatticeDelta(*l, sum, from_u).ok());
    EXPECT_TRUE(SameBits(from_u, versions.back())) << "from version " << u;
    // And back: the newest copy minus the chain is version u again (the syncer's ValuesAt).
    std::vector<float> back = versions.back();
    ASSERT_TRUE(ApplyLatticeDelta(*l, sum, back, -1).ok());
    EXPECT_TRUE(SameBits(back, versions[u])) << "back to version " << u;
  }
  // The full copy round-trips with its lattice.
  std::vector<std::byte> full;
  ASSERT_TRUE(EncodeLatticeFull(*l, phi, full).ok());
  EXPECT_LE(full.size(), MaxLatticeFullBytes(64, n));
  std::vector<float> decoded;
  auto dl = DecodeLatticeFull(full, 64, n, decoded);
  ASSERT_TRUE(dl.ok()) << dl.status();
  EXPECT_EQ(dl->exp, l->exp);
  EXPECT_TRUE(SameBits(decoded, phi));
}

// One round's delta is int4-sized: codes within ±7 travel in 4 bits.
TEST(Lattice, ARoundsDeltaTakesFourBitsPerValue) {
  const size_t n = 4096;
  std::vector<float> theta = Normal(n, 0.02, 3);
  auto l = MakeLattice(theta, 256);
  ASSERT_TRUE(l.ok());
  std::vector<float> phi = theta;
  SnapToLattice(*l, phi);
  for (float& x : theta) x += 0.001f;
  std::vector<std::byte> raw;
  ASSERT_TRUE(EncodeLatticeStep(*l, 7, theta, phi, raw).ok());
  EXPECT_EQ(raw.size(), l->num_blocks() * 2 + n / 2);
  // Error feedback bound: Θ − Φ within half a step of at most 2·absmax/7.
  for (size_t i = 0; i < n; ++i) EXPECT_LE(std::fabs(theta[i] - phi[i]), 0.0011 / 7 + 1e-6) << i;
}

// Θ beyond the lattice's range (1,024× the initial block's size) holds Φ at the edge, counted.
TEST(Lattice, ValuesBeyondTheRangeSaturate) {
  std::vector<float> theta(16, 0.5f);
  auto l = MakeLattice(theta, 16);
  ASSERT_TRUE(l.ok());
  std::vector<float> phi = theta;
  SnapToLattice(*l, phi);
  theta[3] = 1e6f;
  theta[4] = -1e6f;
  std::vector<std::byte> raw;
  LatticeStepStats stats;
  ASSERT_TRUE(EncodeLatticeStep(*l, 0, theta, phi, raw, &stats).ok());
  EXPECT_EQ(stats.saturated, 2);
  const double edge = std::ldexp(1.0, l->exp[0]) * static_cast<double>(kLatticeMax);
  EXPECT_EQ(phi[3], static_cast<float>(edge));
  EXPECT_EQ(phi[4], static_cast<float>(-edge));
  EXPECT_EQ(phi[0], 0.5f);
  theta[5] = INFINITY;
  EXPECT_EQ(EncodeLatticeStep(*l, 7, theta, phi, raw).code(), StatusCode::kInvalidArgument);
}

// Every corruption a decoder can meet is refused, and Φ is left as it was.
TEST(Lattice, MalformedDeltasAreRefusedAndChangeNothing) {
  std::vector<float> theta = Normal(20, 0.02, 4);
  auto l = MakeLattice(theta, 8);
  ASSERT_TRUE(l.ok());
  std::vector<float> phi = theta;
  SnapToLattice(*l, phi);
  std::vector<float> target = theta;
  for (float& x : target) x += 0.005f;
  std::vector<float> scratch = phi;
  std::vector<std::byte> raw;
  ASSERT_TRUE(EncodeLatticeStep(*l, 7, target, scratch, raw).ok());
  const std::vector<float> before = phi;
  auto refused = [&](std::vector<std::byte> bad, const char* what) {
    std::vector<float> copy = phi;
    Status st = ApplyLatticeDelta(*l, bad, copy);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << what << ": " << st;
    EXPECT_TRUE(SameBits(copy, before)) << what;
  };
  refused(std::vector<std::byte>(raw.begin(), raw.end() - 1), "truncated");
  auto longer = raw;
  longer.push_back(std::byte{0});
  refused(longer, "trailing byte");
  auto width = raw;
  width[1] = std::byte{5};
  refused(width, "unknown width");
  auto shift = raw;
  shift[0] = std::byte{41};
  refused(shift, "shift beyond 40");
  // A last block of 4 values at width 4 has no padding nibble; make block 0 odd-sized instead.
  auto odd_lattice = *MakeLattice(std::vector<float>(7, 0.1f), 8);
  std::vector<std::byte> odd = {std::byte{0},    std::byte{4},    std::byte{0x11},
                                std::byte{0x11}, std::byte{0x11}, std::byte{0x71}};
  std::vector<float> seven(7, 0.0f);
  EXPECT_EQ(ApplyLatticeDelta(odd_lattice, odd, seven).code(), StatusCode::kDataLoss) << "padding nibble";
  // A delta that would leave the range.
  std::vector<std::byte> huge(2 + 7 * 4);
  huge[0] = std::byte{40};
  huge[1] = std::byte{32};
  const int32_t k = 1 << 30;
  for (size_t i = 0; i < 7; ++i) std::memcpy(huge.data() + 2 + 4 * i, &k, 4);
  EXPECT_EQ(ApplyLatticeDelta(odd_lattice, huge, seven).code(), StatusCode::kDataLoss) << "out of range";
  // A full copy with an exponent out of range.
  std::vector<std::byte> full;
  ASSERT_TRUE(EncodeLatticeFull(*l, phi, full).ok());
  full[0] = static_cast<std::byte>(static_cast<int8_t>(127));
  std::vector<float> out;
  EXPECT_EQ(DecodeLatticeFull(full, 8, 20, out).status().code(), StatusCode::kDataLoss);
}

TEST(Lattice, CompressedBytesRoundTripAndCorruptionIsRefused) {
  std::vector<std::byte> raw(3 * diloco::kSegmentBytes + 123);
  Rng rng(9);
  for (auto& b : raw) b = static_cast<std::byte>(static_cast<int>(rng.Normal(128, 10)) & 0xff);
  std::vector<std::byte> packed, back;
  ASSERT_TRUE(diloco::CompressBytes(raw, packed).ok());
  EXPECT_LT(packed.size(), raw.size());
  EXPECT_LE(packed.size(), diloco::MaxCompressedBytes(raw.size()));
  ASSERT_TRUE(diloco::DecompressBytes(packed, raw.size(), back).ok());
  EXPECT_EQ(back, raw);
  EXPECT_EQ(diloco::DecompressBytes(packed, raw.size() + 1, back).code(), StatusCode::kDataLoss);
  auto cut = packed;
  cut.resize(cut.size() - 10);
  EXPECT_EQ(diloco::DecompressBytes(cut, raw.size(), back).code(), StatusCode::kDataLoss);
  auto count = packed;
  count[0] = std::byte{9};  // the segment count
  EXPECT_EQ(diloco::DecompressBytes(count, raw.size(), back).code(), StatusCode::kDataLoss);
  std::vector<std::byte> empty_packed;
  ASSERT_TRUE(diloco::CompressBytes({}, empty_packed).ok());
  ASSERT_TRUE(diloco::DecompressBytes(empty_packed, 0, back).ok());
  EXPECT_TRUE(back.empty());
}

// The vector paths of a round's step (the fast path's kernels, in and out of place) give the
// exact path's codes, values and held-at-the-edge count, bit for bit: small moves, moves that need
// a larger step, and moves that leave the range (held at its edge).
TEST(Lattice, TheFastPathsGiveTheExactPathsBits) {
  for (int block : {64, 256, 200}) {
    const size_t n = static_cast<size_t>(block) * 12 + 37;
    const std::vector<float> init = Normal(n, 0.02, 3);
    auto l = MakeLattice(init, block);
    ASSERT_TRUE(l.ok());
    std::vector<float> phi = init;
    SnapToLattice(*l, phi);
    std::vector<float> theta = phi;
    Rng rng(4);
    for (size_t i = 0; i < n; ++i) {
      const size_t b = i / static_cast<size_t>(block);
      const double scale = b % 3 == 0 ? 1e-4 : b % 3 == 1 ? 1e-2 : 1e3;  // the last third leaves the range
      theta[i] += static_cast<float>(rng.Normal(0, scale));
    }
    for (int qmax : {1, 7}) {
      for (const bool in_place : {false, true}) {
        std::vector<float> fast_phi = phi, exact_phi = phi, fast_out(n), exact_out(n);
        std::vector<std::byte> fast_raw, exact_raw;
        int64_t fast_held = 0, exact_held = 0;
        EncodeLatticeStepBlocks(*l, qmax, 0, l->num_blocks(), theta, fast_phi, in_place ? fast_phi : fast_out, fast_raw,
                                &fast_held);
        TEST_EncodeLatticeStepBlocksExact(*l, qmax, 0, l->num_blocks(), theta, exact_phi,
                                          in_place ? exact_phi : exact_out, exact_raw, &exact_held);
        const std::string what = "block " + std::to_string(block) + " qmax " + std::to_string(qmax);
        EXPECT_EQ(fast_raw, exact_raw) << what;
        EXPECT_TRUE(SameBits(in_place ? fast_phi : fast_out, in_place ? exact_phi : exact_out)) << what;
        EXPECT_EQ(fast_held, exact_held) << what;
        EXPECT_GT(exact_held, 0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace atl::exchange
