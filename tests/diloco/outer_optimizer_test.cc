#include "atoll/diloco/outer_optimizer.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace atl::diloco {
namespace {

// Runs a scalar sequence of deltas and returns θ after each step.
std::vector<double> RunSteps(const OuterOptimizerOptions& o, const std::vector<float>& deltas,
                        float theta0, std::vector<double>* momentum = nullptr) {
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
  const auto theta = RunSteps({.lr = 0.7, .momentum = 0.9, .nesterov = true}, {0.5f, 0.5f, -0.2f},
                         1.0f, &b);
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
  const auto theta = RunSteps({.lr = 0.7, .momentum = 0.9, .nesterov = false}, {0.5f, 0.5f, -0.2f},
                         1.0f);
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

}  // namespace
}  // namespace atl::diloco
