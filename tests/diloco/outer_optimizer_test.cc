#include "atoll/diloco/outer_optimizer.h"
#include "atoll/diloco/reduce.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace atl::diloco {
namespace {

// Runs a scalar sequence of deltas and returns θ after each step.
std::vector<double> RunSteps(const OuterOptimizerOptions& o, const std::vector<float>& deltas, float theta0,
                             std::vector<double>* momentum = nullptr) {
  std::vector<float> theta = {theta0};
  std::vector<float> b = {0.0f};
  std::vector<double> out;
  for (float d : deltas) {
    const std::vector<float> delta = {d};
    EXPECT_TRUE(OuterStep(o, delta, b, theta).ok());
    out.push_back(theta[0]);
    if (momentum) momentum->push_back(b[0]);
  }
  return out;
}

TEST(OuterStepTest, NesterovByHand) {
  // lr 0.7, μ 0.9, θ0 = 1, Δ = 0.5, 0.5, −0.2:
  //   b = 0.5;   θ = 1 − 0.7·(0.5 + 0.45)         = 0.335
  //   b = 0.95;  θ = 0.335 − 0.7·(0.5 + 0.855)    = −0.6135
  //   b = 0.655; θ = −0.6135 − 0.7·(−0.2 + 0.5895) = −0.88615
  std::vector<double> b;
  const auto theta = RunSteps({.lr = 0.7, .momentum = 0.9, .nesterov = true}, {0.5f, 0.5f, -0.2f}, 1.0f, &b);
  EXPECT_NEAR(theta[0], 0.335, 1e-6);
  EXPECT_NEAR(theta[1], -0.6135, 1e-6);
  EXPECT_NEAR(theta[2], -0.88615, 1e-6);
  EXPECT_NEAR(b[0], 0.5, 1e-7);
  EXPECT_NEAR(b[1], 0.95, 1e-7);
  EXPECT_NEAR(b[2], 0.655, 1e-7);
}

TEST(OuterStepTest, ClassicMomentumByHand) {
  //   b = 0.5;   θ = 1 − 0.35       = 0.65
  //   b = 0.95;  θ = 0.65 − 0.665   = −0.015
  //   b = 0.655; θ = −0.015 − 0.4585 = −0.4735
  const auto theta = RunSteps({.lr = 0.7, .momentum = 0.9, .nesterov = false}, {0.5f, 0.5f, -0.2f}, 1.0f);
  EXPECT_NEAR(theta[0], 0.65, 1e-6);
  EXPECT_NEAR(theta[1], -0.015, 1e-6);
  EXPECT_NEAR(theta[2], -0.4735, 1e-6);
}

TEST(OuterStepTest, PlainSgdWithZeroMomentum) {
  for (bool nesterov : {true, false}) {
    const auto theta = RunSteps({.lr = 0.5, .momentum = 0.0, .nesterov = nesterov}, {0.4f, -0.2f}, 1.0f);
    EXPECT_FLOAT_EQ(static_cast<float>(theta[0]), 0.8f);
    EXPECT_FLOAT_EQ(static_cast<float>(theta[1]), 0.9f);
  }
}

TEST(OuterStepTest, ElementwiseOnVectors) {
  std::vector<float> theta = {1, 2, 3};
  std::vector<float> b = {1, 0, -1};
  const std::vector<float> delta = {0, 1, 2};
  ASSERT_TRUE(OuterStep({.lr = 1.0, .momentum = 0.5}, delta, b, theta).ok());
  // b = 0.5·b + Δ = (0.5, 1, 1.5); θ −= Δ + 0.5·b = (0.25, 1.5, 2.75).
  EXPECT_EQ(b, (std::vector<float>{0.5f, 1.0f, 1.5f}));
  EXPECT_EQ(theta, (std::vector<float>{0.75f, 0.5f, 0.25f}));
}

TEST(OuterStepTest, RejectsBadArguments) {
  std::vector<float> theta(3), b(3), d(3), short_v(2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(OuterStep({}, short_v, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({}, d, short_v, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({.lr = nan}, d, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({.lr = -0.1}, d, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({.momentum = 1.0}, d, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({.momentum = -0.1}, d, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OuterStep({.momentum = nan}, d, b, theta).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(OuterStep({}, d, b, theta).ok());
}

// The sweep outer step (docs/decisions/007).
Fragment OneSlice(int64_t n, bool embedding = false) {
  Fragment f;
  f.slices.push_back({0, 0, n, embedding});
  f.numel = n;
  return f;
}

TEST(SweepOuterStepTest, OneFullRoundIsOneSynchronousNesterovStep) {
  const std::vector<float> g = {0.5f, -1.25f, 2.0f};
  {
    std::vector<float> theta_sync = {1.0f, 2.0f, 3.0f}, b_sync(3, 0.1f);
    std::vector<float> theta = theta_sync, b = b_sync;
    SweepState state;
    const OuterOptimizerOptions o{.lr = 0.7, .momentum = 0.9};
    ASSERT_TRUE(OuterStep(o, g, b_sync, theta_sync).ok());
    auto r = SweepOuterStep(o, OneSlice(3), g, 1.0, state, b, theta);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->sweep_completed);
    EXPECT_EQ(state.sweeps, 1);
    for (int i = 0; i < 3; ++i) {
      EXPECT_NEAR(theta[i], theta_sync[i], 1e-6) << i;
      EXPECT_NEAR(b[i], b_sync[i], 1e-6) << i;
    }
  }
}

TEST(SweepOuterStepTest, PartialRoundsMoveByTheirShareAndMomentumWaitsForTheSweep) {
  // lr 1, μ 0.5, mean: four single-learner rounds of a quarter each.
  const OuterOptimizerOptions o{.lr = 1.0, .momentum = 0.5};
  std::vector<float> theta = {0, 0, 0, 0}, b(4, 0.0f);
  SweepState state;
  for (int m = 0; m < 4; ++m) {
    std::vector<float> g(4, 0.0f);
    g[static_cast<size_t>(m)] = 4.0f;  // learner m's outer gradient
    auto r = SweepOuterStep(o, OneSlice(4), g, 0.25, state, b, theta);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->sweep_completed, m == 3);
    if (m < 3) {
      // Only the round's share moved Θ; no momentum yet.
      EXPECT_FLOAT_EQ(theta[static_cast<size_t>(m)], -1.0f);
      EXPECT_FLOAT_EQ(b[static_cast<size_t>(m)], 0.0f);
    }
  }
  // After the sweep: mean of the four = (1,1,1,1); b = 1; Θ = −lr·(1 + μ·1) = −1.5 everywhere.
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(b[static_cast<size_t>(i)], 1.0f);
    EXPECT_FLOAT_EQ(theta[static_cast<size_t>(i)], -1.5f);
  }
  EXPECT_EQ(state.share, 0.0);
}

TEST(SweepOuterStepTest, ASweepOfCancellingRoundsEndsAtTheLastLearnerNotPastIt) {
  // The end of a 2-learner run: learner 0's final push alone (ρ 0.5) moves Θ halfway to it; then
  // learner 1, alone and live (ρ 1), pulls Θ to its own values. Its outer gradient is taken
  // against the Θ learner 0 moved, so the sweep's sum nearly cancels (a = 0.5·2 − 1.1 = −0.1)
  // while the norms add up (0.5·2 + 1.1 = 2.1). The sweep once restored the sum's norm to the
  // norms' (RDA across rounds) and threw Θ to 2.1, two units past learner 1 (0.1), away from
  // learner 0 (−2): a global model worse than either. Completing the sweep adds nothing to the
  // rounds' own moves at μ = 0; with momentum the sweep's sum feeds b.
  for (double mu : {0.0, 0.5}) {
    const OuterOptimizerOptions o{.lr = 1.0, .momentum = mu};
    std::vector<float> theta = {0.0f}, b = {0.0f};
    SweepState state;
    const float learner0 = -2.0f, learner1 = 0.1f;
    std::vector<float> g = {theta[0] - learner0};
    ASSERT_TRUE(SweepOuterStep(o, OneSlice(1), g, 0.5, state, b, theta).ok());
    EXPECT_FLOAT_EQ(theta[0], -1.0f);
    g = {theta[0] - learner1};
    auto r = SweepOuterStep(o, OneSlice(1), g, 1.0, state, b, theta);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->sweep_completed);
    EXPECT_NEAR(b[0], -0.1, 1e-6) << "b = μ·0 + a";
    EXPECT_NEAR(theta[0], learner1 - mu * -0.1, 1e-6) << "Θ = learner 1 − lr·μ·b";
  }
}

TEST(SweepOuterStepTest, RunningSweepHoldsTheEstimatedStepAndEndsAtTheSynchronousOne) {
  // lr 1, μ 0.5, mean. Learner outer gradients g_m = 4·e_m arrive one per round, ρ = 1/4 each.
  const OuterOptimizerOptions o{.lr = 1.0, .momentum = 0.5};
  std::vector<float> theta(4, 0.0f), b(4, 0.0f);
  SweepState state;
  std::vector<float> g(4, 0.0f);
  g[0] = 4.0f;
  auto r = SweepOuterStep(o, OneSlice(4), g, 0.25, state, b, theta, /*extrapolate=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->sweep_completed);
  // The estimate from the first arrival alone: ĝ = g_0, Θ = −(ĝ + μ·ĝ) = −1.5·g_0; b untouched.
  EXPECT_FLOAT_EQ(theta[0], -6.0f);
  EXPECT_FLOAT_EQ(b[0], 0.0f);
  for (int m = 1; m < 4; ++m) {
    std::fill(g.begin(), g.end(), 0.0f);
    g[static_cast<size_t>(m)] = 4.0f;
    r = SweepOuterStep(o, OneSlice(4), g, 0.25, state, b, theta, true);
    ASSERT_TRUE(r.ok());
  }
  EXPECT_TRUE(r->sweep_completed);
  // The synchronous step on the mean (1,1,1,1): b = 1, Θ = −(1 + 0.5) = −1.5; the next sweep
  // starts from there.
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(b[static_cast<size_t>(i)], 1.0f);
    EXPECT_FLOAT_EQ(theta[static_cast<size_t>(i)], -1.5f);
    EXPECT_FLOAT_EQ(state.start[static_cast<size_t>(i)], -1.5f);
  }
}

TEST(SweepOuterStepTest, RejectsBadArgumentsAndChangesNothing) {
  std::vector<float> theta = {1, 2}, b = {0, 0}, g = {1, 1}, short_v = {1};
  SweepState state;
  const OuterOptimizerOptions o;
  EXPECT_EQ(SweepOuterStep(o, OneSlice(2), g, 0.0, state, b, theta).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SweepOuterStep(o, OneSlice(2), g, 1.5, state, b, theta).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(SweepOuterStep(o, OneSlice(2), g, std::nan(""), state, b, theta).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SweepOuterStep(o, OneSlice(2), short_v, 0.5, state, b, theta).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(SweepOuterStep({.momentum = 1.0}, OneSlice(2), g, 0.5, state, b, theta).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(theta, (std::vector<float>{1, 2}));
  EXPECT_TRUE(state.accum.empty());
}

}  // namespace
TEST(OuterStepKernelTest, ApplyMeasuredEqualsApplyThenTheSums) {
  // Every kind, stateless and with momentum, in place: the measured form and Apply + SumSquares +
  // a finiteness scan give the same bits, and the saved values are Θ_before.
  const size_t n = 4096 + 13;
  std::vector<float> theta0(n), merged(n), momentum0(n), accum0(n);
  for (size_t i = 0; i < n; ++i) {
    theta0[i] = std::sin(0.37f * static_cast<float>(i)) * 0.05f;
    merged[i] = std::cos(0.11f * static_cast<float>(i)) * 0.01f;
    momentum0[i] = 0.001f * static_cast<float>(i % 7);
    accum0[i] = 0.002f * static_cast<float>(i % 5);
  }
  merged[17] = std::numeric_limits<float>::infinity();  // one value leaves the finite range
  for (const OuterStepKind kind : {OuterStepKind::kRound, OuterStepKind::kSweep, OuterStepKind::kRunning}) {
    for (const double mu : {0.0, 0.9}) {
      const bool keeps = mu > 0 || kind == OuterStepKind::kRunning;
      auto k = OuterStepKernel::Create({0.7, mu, true}, kind, 0.25, 0.5, keeps);
      ASSERT_TRUE(k.ok()) << k.status();
      std::vector<float> t1 = theta0, t2 = theta0, m1 = momentum0, m2 = momentum0, a1 = accum0, a2 = accum0,
                         s1 = theta0, s2 = theta0, saved(n);
      const auto spans = [&](std::vector<float>& t, std::vector<float>& m, std::vector<float>& a,
                             std::vector<float>& st) {
        return OuterStepSpans{.theta = t.data(),
                              .theta_out = t.data(),
                              .momentum = keeps ? m.data() : nullptr,
                              .momentum_out = keeps ? m.data() : nullptr,
                              .accum = k->keeps_accum() ? a.data() : nullptr,
                              .accum_out = k->keeps_accum() ? a.data() : nullptr,
                              .start = k->keeps_start() ? st.data() : nullptr,
                              .start_out = k->keeps_start() ? st.data() : nullptr};
      };
      const auto got = k->ApplyMeasured(0, n, merged.data(), spans(t1, m1, a1, s1), saved.data());
      const double step2 = k->Apply(0, n, merged.data(), spans(t2, m2, a2, s2));
      bool finite = true;
      for (float x : t2) finite &= std::isfinite(x);
      // Bit for bit (NaN included: one merged value is infinite).
      const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
      EXPECT_TRUE(same(t1, t2));
      EXPECT_TRUE(same(m1, m2));
      EXPECT_TRUE(same(a1, a2));
      EXPECT_TRUE(same(saved, theta0));
      EXPECT_EQ(bits(got.step2), bits(step2));
      EXPECT_EQ(bits(got.before2), bits(SumSquares(theta0.data(), n)));
      EXPECT_EQ(bits(got.after2), bits(SumSquares(t2.data(), n)));
      EXPECT_EQ(got.finite, finite);
      EXPECT_FALSE(got.finite);
    }
  }
}

}  // namespace atl::diloco
