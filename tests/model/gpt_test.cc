// The GPT module itself (the one test TU that includes libtorch): shapes, causal masking,
// rotary positions, parameter count.
#include <gtest/gtest.h>

#include "gpt.h"

namespace atl::model {
namespace {

ModelConfig Tiny(const std::string& mlp = "swiglu") {
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
  for (const char* mlp : {"swiglu", "gelu"}) {
    auto g = Gpt::Create(Tiny(mlp), 1);
    ASSERT_TRUE(g.ok()) << g.status();
    auto idx = torch::randint(0, 50, {3, 16}, torch::kInt64);
    auto logits = (*g)->Forward(idx);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 16, 50}));
    EXPECT_EQ((*g)->num_params(), ParameterCount(Tiny(mlp))) << mlp;
    auto shorter = (*g)->Forward(idx.narrow(1, 0, 5));
    EXPECT_EQ(shorter.sizes().vec(), (std::vector<int64_t>{3, 5, 50}));
    for (const auto& p : (*g)->params()) {
      EXPECT_TRUE(p.tensor.is_contiguous() && p.tensor.requires_grad()) << p.name;
      EXPECT_EQ(p.tensor.dtype(), torch::kFloat32);
    }
  }
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
  EXPECT_EQ(Gpt::Create([] { auto bad = Tiny(); bad.n_heads = 5; return bad; }(), 1).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl::model
