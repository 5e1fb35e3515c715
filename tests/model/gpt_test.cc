// The GPT module itself (the one test TU that includes libtorch): shapes, causal masking,
// rotary positions, parameter count.
#include <gtest/gtest.h>

#include <algorithm>

#include "gpt.h"
#include "lm_head_loss.h"

namespace atl::model {
namespace {

ModelConfig Tiny(Mlp mlp = Mlp::kSwiglu) {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.d_ff = 48;
  c.seq_len = 16;
  c.mlp = mlp;
  return c;
}

TEST(ModelGpt, ShapesAndParameterCount) {
  for (Mlp mlp : {Mlp::kSwiglu, Mlp::kGelu}) {
    auto g = Gpt::Create(Tiny(mlp), 1);
    ASSERT_TRUE(g.ok()) << g.status();
    auto idx = torch::randint(0, 50, {3, 16}, torch::kInt64);
    auto logits = (*g)->Forward(idx);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 16, 50}));
    EXPECT_EQ((*g)->num_params(), ParameterCount(Tiny(mlp))) << MlpName(mlp);
    auto shorter = (*g)->Forward(idx.narrow(1, 0, 5));
    EXPECT_EQ(shorter.sizes().vec(), (std::vector<int64_t>{3, 5, 50}));
    for (const auto& p : (*g)->params()) {
      EXPECT_TRUE(p.tensor.is_contiguous() && p.tensor.requires_grad()) << p.name;
      EXPECT_EQ(p.tensor.dtype(), torch::kFloat32);
    }
  }
}

// The fused head + loss against the plain path (cross_entropy of the logits): the same loss and
// gradients, in fp32 and in bf16, over chunks with a partial last one. In bf16 the two paths round
// at different places: the fused gradients must be as close to the plain bf16 ones as bf16 itself
// is to fp32 (twice the plain path's own deviation from fp32, which depends on the CPU's bf16
// kernels: AVX-512-BF16 rounds differently from AVX2's emulation), or within 2 % of the largest entry.
TEST(ModelGpt, FusedHeadLossMatchesCrossEntropyOfTheLogits) {
  torch::manual_seed(3);
  const int64_t N = 700, D = 24, V = 300;
  auto h0 = torch::randn({N, D});
  auto w0 = torch::randn({V, D}) * 0.3;
  auto t = torch::randint(0, V, {N}, torch::kInt64);
  torch::Tensor h_fp32, w_fp32;  // the plain path's gradients in fp32
  const auto bound = [](const torch::Tensor& plain, const torch::Tensor& fp32, double tol) {
    const double rel = tol * plain.abs().max().item<double>();
    return fp32.defined() ? std::max(rel, 2 * (plain - fp32).abs().max().item<double>()) : rel;
  };
  for (bool bf16 : {false, true}) {
    auto h1 = h0.clone().requires_grad_(true), w1 = w0.clone().requires_grad_(true);
    auto h2 = h0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
    torch::Tensor plain;
    {
      CpuBf16Autocast autocast(bf16);
      plain = torch::nn::functional::cross_entropy(torch::linear(h1, w1), t);
    }
    plain.backward();
    torch::Tensor fused;
    {
      CpuBf16Autocast autocast(bf16);
      fused = LmHeadLoss(h2, w2, t, bf16, /*chunk_rows=*/128);  // 5 full chunks and one of 60
    }
    fused.backward();
    EXPECT_EQ(fused.dtype(), torch::kFloat32);
    EXPECT_NEAR(fused.item<double>(), plain.item<double>(), bf16 ? 1e-4 : 1e-6) << "bf16 " << bf16;
    const double tol = bf16 ? 2e-2 : 1e-5;  // relative to each gradient's largest entry
    EXPECT_LT((h2.grad() - h1.grad()).abs().max().item<double>(), bound(h1.grad(), h_fp32, tol)) << "bf16 " << bf16;
    EXPECT_LT((w2.grad() - w1.grad()).abs().max().item<double>(), bound(w1.grad(), w_fp32, tol)) << "bf16 " << bf16;
    if (!bf16) {
      h_fp32 = h1.grad().clone();
      w_fp32 = w1.grad().clone();
    }
    EXPECT_EQ(h2.grad().dtype(), torch::kFloat32);
    EXPECT_EQ(w2.grad().dtype(), torch::kFloat32);
  }
  EXPECT_ANY_THROW(LmHeadLoss(h0, w0, t.to(torch::kInt32), false));
  EXPECT_ANY_THROW(LmHeadLoss(h0, w0, torch::full({N}, V, torch::kInt64), false));  // a target ≥ V
}

// Loss is the fused head: it equals cross_entropy of Forward's logits.
TEST(ModelGpt, LossEqualsCrossEntropyOfForward) {
  auto g = Gpt::Create(Tiny(), 5);
  ASSERT_TRUE(g.ok()) << g.status();
  auto idx = torch::randint(0, 50, {3, 16}, torch::kInt64);
  auto tgt = torch::randint(0, 50, {3, 16}, torch::kInt64);
  torch::NoGradGuard no_grad;
  const double plain =
      torch::nn::functional::cross_entropy((*g)->Forward(idx).view({-1, 50}), tgt.reshape({-1})).item<double>();
  EXPECT_NEAR((*g)->Loss(idx, tgt).item<double>(), plain, 1e-6);
}

TEST(ModelGpt, FutureTokensDoNotChangeEarlierLogits) {
  auto g = Gpt::Create(Tiny(), 2);
  ASSERT_TRUE(g.ok());
  torch::NoGradGuard no_grad;
  auto idx = torch::randint(0, 50, {2, 16}, torch::kInt64);
  auto base = (*g)->Forward(idx);
  for (int64_t t : {1, 7, 15}) {
    auto changed = idx.clone();
    changed.index_put_({torch::indexing::Slice(), t}, (idx.index({0, t}).item<int64_t>() + 1) % 50);
    auto out = (*g)->Forward(changed);
    EXPECT_TRUE(torch::equal(out.narrow(1, 0, t), base.narrow(1, 0, t)))
        << "positions before " << t << " must not see token " << t;
    EXPECT_FALSE(torch::allclose(out.narrow(1, t, 1), base.narrow(1, t, 1)))
        << "position " << t << " sees its own token";
  }
}

TEST(ModelGpt, PositionMattersThroughRotaryEmbeddings) {
  auto g = Gpt::Create(Tiny(), 3);
  ASSERT_TRUE(g.ok());
  torch::NoGradGuard no_grad;
  // "a b c" vs "b a c": without position information the last position could not tell them
  // apart (attention is permutation-invariant over keys).
  auto x = torch::tensor({{5, 9, 11}}, torch::kInt64);
  auto y = torch::tensor({{9, 5, 11}}, torch::kInt64);
  auto lx = (*g)->Forward(x).select(1, 2), ly = (*g)->Forward(y).select(1, 2);
  EXPECT_FALSE(torch::allclose(lx, ly, 1e-5, 1e-6));
}

TEST(ModelGpt, SameSeedSameWeightsAndLossIsNearUniformAtStart) {
  auto a = Gpt::Create(Tiny(), 7), b = Gpt::Create(Tiny(), 7), c = Gpt::Create(Tiny(), 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < (*a)->params().size(); ++i) {
    EXPECT_TRUE(torch::equal((*a)->params()[i].tensor, (*b)->params()[i].tensor));
  }
  EXPECT_FALSE(torch::equal((*a)->params()[0].tensor, (*c)->params()[0].tensor));
  auto idx = torch::randint(0, 50, {4, 16}, torch::kInt64);
  double loss = (*a)->Loss(idx.narrow(1, 0, 15), idx.narrow(1, 1, 15)).item<double>();
  EXPECT_NEAR(loss, std::log(50.0), 0.3);
  EXPECT_EQ(Gpt::Create(
                [] {
                  auto bad = Tiny();
                  bad.n_heads = 5;
                  return bad;
                }(),
                1)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl::model
