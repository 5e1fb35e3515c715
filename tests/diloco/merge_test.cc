#include "atoll/diloco/merge.h"
#include "atoll/diloco/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "atoll/core/rng.h"

namespace atl::diloco {
namespace {

using Vec = std::vector<float>;

std::vector<std::span<const float>> Spans(const std::vector<Vec>& v) { return {v.begin(), v.end()}; }

Vec Mean(const std::vector<Vec>& in, const std::vector<double>& w) {
  Vec out(in.empty() ? 0 : in[0].size(), -1.0f);
  const Status s = WeightedMean(Spans(in), w, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

Vec Rda(const std::vector<Vec>& in, const std::vector<double>& w) {
  Vec out(in.empty() ? 0 : in[0].size(), -1.0f);
  const Status s = RdaMerge(Spans(in), w, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(TokenWeightTest, TokensSquaredOverSteps) {
  EXPECT_DOUBLE_EQ(TokenWeight(100, 4), 2500.0);
  EXPECT_DOUBLE_EQ(TokenWeight(3, 2), 4.5);
  EXPECT_DOUBLE_EQ(TokenWeight(0, 5), 0.0);
  EXPECT_DOUBLE_EQ(TokenWeight(5, 0), 0.0);
  EXPECT_DOUBLE_EQ(TokenWeight(10'000'000'000, 1), 1e20);  // would overflow int64
  // A learner that processed half the tokens in the same steps gets a quarter of the weight.
  EXPECT_DOUBLE_EQ(TokenWeight(500, 10) / TokenWeight(1000, 10), 0.25);
}

TEST(TokenWeightTest, UniformWeightsIgnoreSizeButNotEmptiness) {
  EXPECT_DOUBLE_EQ(ContributionWeight(WeightRule::kTokens, 100, 4), TokenWeight(100, 4));
  EXPECT_DOUBLE_EQ(ContributionWeight(WeightRule::kUniform, 100, 4), 1.0);
  EXPECT_DOUBLE_EQ(ContributionWeight(WeightRule::kUniform, 7, 1), 1.0);
  EXPECT_DOUBLE_EQ(ContributionWeight(WeightRule::kUniform, 0, 5), 0.0);
  EXPECT_DOUBLE_EQ(ContributionWeight(WeightRule::kUniform, 5, 0), 0.0);
}

TEST(L2NormTest, HandValues) {
  EXPECT_DOUBLE_EQ(L2Norm(Vec{3, 4}), 5.0);
  EXPECT_DOUBLE_EQ(L2Norm(Vec(1001, 1.0f)), std::sqrt(1001.0));
  EXPECT_DOUBLE_EQ(L2Norm(Vec{}), 0.0);
}

TEST(MergeTest, OrthogonalVectorsKeepTheirNormUnderRda) {
  const std::vector<Vec> in = {{2, 0}, {0, 2}};
  const Vec mean = Mean(in, {1, 1});
  EXPECT_FLOAT_EQ(mean[0], 1.0f);
  EXPECT_FLOAT_EQ(mean[1], 1.0f);
  EXPECT_NEAR(L2Norm(mean), std::sqrt(2.0), 1e-6);
  const Vec rda = Rda(in, {1, 1});
  EXPECT_NEAR(L2Norm(rda), 2.0, 1e-6);
  EXPECT_FLOAT_EQ(rda[0], static_cast<float>(std::sqrt(2.0)));
  EXPECT_FLOAT_EQ(rda[1], static_cast<float>(std::sqrt(2.0)));
}

TEST(MergeTest, WeightsChangeTheDirection) {
  // a = (2, 0) with w = 3, b = (0, 4) with w = 1.
  const std::vector<Vec> in = {{2, 0}, {0, 4}};
  // Mean: (3·2, 1·4) / 4 = (1.5, 1).
  const Vec mean = Mean(in, {3, 1});
  EXPECT_FLOAT_EQ(mean[0], 1.5f);
  EXPECT_FLOAT_EQ(mean[1], 1.0f);
  // RDA: radius (3·2 + 1·4)/4 = 2.5; direction unit(3·(1,0) + 1·(0,1)) = (3, 1)/√10.
  const Vec rda = Rda(in, {3, 1});
  EXPECT_FLOAT_EQ(rda[0], static_cast<float>(2.5 * 3 / std::sqrt(10.0)));
  EXPECT_FLOAT_EQ(rda[1], static_cast<float>(2.5 * 1 / std::sqrt(10.0)));
  // Swapping the weights swaps the emphasis: radius (2 + 12)/4 = 3.5, direction (1, 3)/√10.
  const Vec swapped = Rda(in, {1, 3});
  EXPECT_FLOAT_EQ(swapped[0], static_cast<float>(3.5 / std::sqrt(10.0)));
  EXPECT_FLOAT_EQ(swapped[1], static_cast<float>(3.5 * 3 / std::sqrt(10.0)));
}

TEST(MergeTest, ZeroVectorsCountInTheRadiusButNotTheDirection) {
  // (3,0,0), 0, (0,0,4), equal weights: radius (3 + 0 + 4)/3; direction (1,0,1)/√2.
  const std::vector<Vec> in = {{3, 0, 0}, {0, 0, 0}, {0, 0, 4}};
  const Vec rda = Rda(in, {1, 1, 1});
  const float e = static_cast<float>(7.0 / 3.0 / std::sqrt(2.0));
  EXPECT_FLOAT_EQ(rda[0], e);
  EXPECT_EQ(rda[1], 0.0f);
  EXPECT_FLOAT_EQ(rda[2], e);
  // All zero: nothing to point at.
  const Vec zeros = Rda({{0, 0}, {0, 0}}, {1, 2});
  EXPECT_EQ(zeros, (Vec{0, 0}));
}

TEST(MergeTest, OppositeDirectionsCancelToZero) {
  const std::vector<Vec> in = {{1, -2}, {-1, 2}};
  EXPECT_EQ(Rda(in, {1, 1}), (Vec{0, 0}));
  EXPECT_EQ(Mean(in, {1, 1}), (Vec{0, 0}));
}

TEST(MergeTest, ZeroTotalWeightGivesZeros) {
  const std::vector<Vec> in = {{1, 2}, {3, 4}};
  EXPECT_EQ(Mean(in, {0, 0}), (Vec{0, 0}));
  EXPECT_EQ(Rda(in, {0, 0}), (Vec{0, 0}));
}

TEST(MergeTest, ZeroWeightInputsAreNeverRead) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Vec> in = {{2, 4}, {nan, nan}};
  EXPECT_EQ(Mean(in, {5, 0}), (Vec{2, 4}));
  const Vec rda = Rda(in, {5, 0});
  EXPECT_FLOAT_EQ(rda[0], 2.0f);
  EXPECT_FLOAT_EQ(rda[1], 4.0f);
}

TEST(MergeTest, SingleInputIsReturnedUnchanged) {
  const std::vector<Vec> in = {{0.25f, -1.5f, 3.0f}};
  EXPECT_EQ(Mean(in, {7}), in[0]);
  const Vec rda = Rda(in, {7});
  for (size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(rda[i], in[0][i]);
}

TEST(MergeTest, RdaStepSizeIsIndependentOfM) {
  // M random (nearly orthogonal in high dimension) vectors of norm 1: the mean shrinks like
  // 1/√M, RDA keeps norm 1.
  Rng rng(7);
  const size_t n = 20000;
  for (int M : {1, 4, 16}) {
    std::vector<Vec> in(static_cast<size_t>(M), Vec(n));
    for (auto& v : in) {
      for (auto& x : v) x = static_cast<float>(rng.Normal());
      const double norm = L2Norm(v);
      for (auto& x : v) x = static_cast<float>(x / norm);
    }
    const std::vector<double> w(static_cast<size_t>(M), 1.0);
    EXPECT_NEAR(L2Norm(Rda(in, w)), 1.0, 1e-5) << M;
    EXPECT_NEAR(L2Norm(Mean(in, w)), 1.0 / std::sqrt(M), 0.03) << M;
  }
}

TEST(MergeTest, RejectsBadInputs) {
  const std::vector<Vec> in = {{1, 2}, {3, 4}};
  Vec out(2);
  Vec short_out(1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  using Fn = Status (*)(std::span<const std::span<const float>>, std::span<const double>, std::span<float>);
  for (Fn fn : {static_cast<Fn>(&WeightedMean), static_cast<Fn>(&RdaMerge)}) {
    EXPECT_EQ(fn(Spans(in), std::vector<double>{1, 1}, short_out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans({{1, 2}, {3}}), std::vector<double>{1, 1}, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans(in), std::vector<double>{1}, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans(in), std::vector<double>{1, -1}, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans(in), std::vector<double>{nan, 1}, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans(in), std::vector<double>{inf, 1}, out).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(fn(Spans(in), std::vector<double>{1e308, 1e308}, out).code(),
              StatusCode::kInvalidArgument);  // Σw overflows
    EXPECT_EQ(fn({}, {}, out).code(), StatusCode::kInvalidArgument);
  }
}

// Naive double-precision references of the header's formulas.
std::vector<double> RefMean(const std::vector<Vec>& in, const std::vector<double>& w) {
  std::vector<double> out(in[0].size(), 0.0);
  double sw = 0;
  for (double x : w) sw += x;
  if (sw == 0) return out;
  for (size_t m = 0; m < in.size(); ++m)
    for (size_t i = 0; i < out.size(); ++i) out[i] += w[m] * in[m][i];
  for (double& x : out) x /= sw;
  return out;
}

std::vector<double> RefRda(const std::vector<Vec>& in, const std::vector<double>& w) {
  const size_t n = in[0].size();
  std::vector<double> dir(n, 0.0);
  double sw = 0, radius = 0;
  for (size_t m = 0; m < in.size(); ++m) {
    double norm = 0;
    for (float x : in[m]) norm += static_cast<double>(x) * x;
    norm = std::sqrt(norm);
    sw += w[m];
    radius += w[m] * norm;
    if (norm > 0)
      for (size_t i = 0; i < n; ++i) dir[i] += w[m] * in[m][i] / norm;
  }
  if (sw == 0) return std::vector<double>(n, 0.0);
  radius /= sw;
  double dn = 0;
  for (double x : dir) dn += x * x;
  dn = std::sqrt(dn);
  for (double& x : dir) x = dn > 0 ? radius * x / dn : 0.0;
  return dir;
}

void ExpectClose(const Vec& got, const std::vector<double>& ref, const char* what) {
  double max_abs = 0;
  for (double x : ref) max_abs = std::max(max_abs, std::fabs(x));
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(got[i], ref[i], 4e-7 * std::fabs(ref[i]) + 1e-12 * max_abs)
        << what << " element " << i << " of " << ref.size();
  }
}

TEST(MergePropertyTest, MatchesNaiveDoubleReference) {
  Rng rng(2026);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t M = 1 + rng.UniformInt(6);
    // Lengths around the accumulation chunk (1024) and the 8-lane unrolling.
    const size_t n = trial < 10 ? static_cast<size_t>(trial) : 1 + rng.UniformInt(5000);
    std::vector<Vec> in(M, Vec(n));
    std::vector<double> w(M);
    for (size_t m = 0; m < M; ++m) {
      const double scale = std::exp(rng.Uniform(-8, 8));
      for (auto& x : in[m]) x = static_cast<float>(rng.Normal() * scale);
      if (rng.Bernoulli(0.1)) std::fill(in[m].begin(), in[m].end(), 0.0f);
      w[m] = rng.Bernoulli(0.15) ? 0.0
                                 : TokenWeight(1 + static_cast<int64_t>(rng.UniformInt(100000)),
                                               1 + static_cast<int64_t>(rng.UniformInt(30)));
    }
    ExpectClose(Mean(in, w), RefMean(in, w), "mean");
    ExpectClose(Rda(in, w), RefRda(in, w), "rda");
  }
}

TEST(MergeFragmentTest, RdaPerSliceAndMeanForEmbeddings) {
  // Fragment: an embedding slice (2 values) then a non-embedding slice (2 values).
  Fragment f;
  f.index = 3;
  f.slices = {{.tensor = 0, .offset = 2, .count = 2, .is_embedding = true},
              {.tensor = 1, .offset = 0, .count = 2, .is_embedding = false}};
  f.numel = 4;
  const std::vector<Vec> in = {{2, 0, 2, 0}, {0, 2, 0, 2}};
  const std::vector<double> w = {1, 1};
  Vec out(4);
  ASSERT_TRUE(MergeFragment(f, MergeRule::kRda, Spans(in), w, out).ok());
  EXPECT_FLOAT_EQ(out[0], 1.0f);  // embedding: plain mean
  EXPECT_FLOAT_EQ(out[1], 1.0f);
  EXPECT_FLOAT_EQ(out[2], static_cast<float>(std::sqrt(2.0)));  // RDA of (2,0), (0,2)
  EXPECT_FLOAT_EQ(out[3], static_cast<float>(std::sqrt(2.0)));
  ASSERT_TRUE(MergeFragment(f, MergeRule::kMean, Spans(in), w, out).ok());
  EXPECT_EQ(out, (Vec{1, 1, 1, 1}));
  ASSERT_TRUE(MergeFragment(f, MergeRule::kRdaAll, Spans(in), w, out).ok());  // RDA on the embedding too
  for (float x : out) EXPECT_FLOAT_EQ(x, static_cast<float>(std::sqrt(2.0)));

  Vec wrong(3);
  EXPECT_EQ(MergeFragment(f, MergeRule::kRda, Spans(in), w, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MergeFragment(f, MergeRule::kRda, Spans({{1, 2, 3}, {1, 2, 3}}), w, out).code(),
            StatusCode::kInvalidArgument);
}

TEST(MergeFragmentTest, RulesByName) {
  EXPECT_EQ(ParseMergeRule("rda").value(), MergeRule::kRda);
  EXPECT_EQ(ParseMergeRule("rda-all").value(), MergeRule::kRdaAll);
  EXPECT_EQ(ParseMergeRule("mean").value(), MergeRule::kMean);
  const auto bad = ParseMergeRule("RDA");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("merge must be rda, rda-all or mean (got 'RDA')"), std::string::npos);
}

TEST(MergeFragmentTest, RdaIsPerSliceNotPerFragment) {
  // Two non-embedding slices with very different scales: per-slice RDA keeps each slice's norm.
  Fragment f;
  f.slices = {{.tensor = 0, .offset = 0, .count = 2}, {.tensor = 1, .offset = 0, .count = 2}};
  f.numel = 4;
  const std::vector<Vec> in = {{10, 0, 0.1f, 0}, {0, 10, 0, 0.1f}};
  Vec out(4);
  ASSERT_TRUE(MergeFragment(f, MergeRule::kRda, Spans(in), std::vector<double>{1, 1}, out).ok());
  EXPECT_NEAR(L2Norm(std::span<const float>(out).subspan(0, 2)), 10.0, 1e-5);
  EXPECT_NEAR(L2Norm(std::span<const float>(out).subspan(2, 2)), 0.1, 1e-7);
}

TEST(LaneSquaresTest, PiecesAddUpToSumSquaresBitForBit) {
  Rng rng(7);
  for (size_t n : {0, 1, 7, 8, 9, 1000, 1024, 1031, 4096}) {
    Vec x(n);
    for (float& v : x) v = static_cast<float>(rng.Normal()) * 3.0f;
    for (size_t piece : {8, 24, 1024}) {
      LaneSquares sums;
      for (size_t b = 0; b < n; b += piece) sums.Add(x.data() + b, std::min(piece, n - b));
      EXPECT_EQ(sums.Sum(), SumSquares(x.data(), n)) << "n " << n << ", pieces of " << piece;
    }
  }
}

}  // namespace
}  // namespace atl::diloco
