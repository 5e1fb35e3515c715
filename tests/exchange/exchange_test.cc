#include "atoll/exchange/fragment_exchange.h"

#include <gtest/gtest.h>

#include <numeric>

namespace atl::exchange {
namespace {

TEST(FragmentExchange, GatherScatterCoverEveryElementOnce) {
  std::vector<diloco::TensorSpec> t = {
      {"tok_emb.weight", {64, 8}, 512, true}, {"layers.0.w", {8, 8}, 64, false}, {"layers.1.w", {8, 8}, 64, false}};
  diloco::PlanOptions po;
  po.num_fragments = 4;  // the embedding is larger than the ideal size: split into row blocks
  auto plan = diloco::MakeFragmentPlan(t, po);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::vector<float>> storage = {std::vector<float>(512), std::vector<float>(64), std::vector<float>(64)};
  float next = 0;
  for (auto& s : storage)
    for (float& v : s) v = next++;
  std::vector<std::span<float>> views(storage.begin(), storage.end());
  std::vector<std::vector<float>> frags;
  double sum = 0;
  for (const auto& f : plan->fragments) {
    std::vector<float> buf(static_cast<size_t>(f.numel));
    GatherFragment(f, views, buf);
    sum += std::accumulate(buf.begin(), buf.end(), 0.0);
    frags.push_back(buf);
  }
  EXPECT_DOUBLE_EQ(sum, (next - 1) * next / 2);  // each element exactly once
  for (auto& s : storage) std::fill(s.begin(), s.end(), -1.0f);
  for (size_t p = 0; p < frags.size(); ++p) ScatterFragment(plan->fragments[p], frags[p], views);
  next = 0;
  for (auto& s : storage)
    for (float v : s) EXPECT_EQ(v, next++);
  // Mixing: θ ← 0.25·θ + 0.75·value.
  std::vector<float> ones(static_cast<size_t>(plan->fragments[0].numel), 1.0f);
  std::vector<std::vector<float>> before = storage;
  ScatterFragment(plan->fragments[0], ones, views, 0.25);
  const auto& s0 = plan->fragments[0].slices[0];
  EXPECT_FLOAT_EQ(storage[s0.tensor][s0.offset], 0.25f * before[s0.tensor][s0.offset] + 0.75f);
}

TEST(FragmentExchange, OuterGradientRoundTripRebuildsTheLearnersParameters) {
  diloco::CodecOptions fp32{diloco::Encoding::kFp32, 64};
  std::vector<float> base = {1, 2, 3, 4}, local = {0.5, 2.5, 3, 3};
  std::vector<std::byte> enc;
  ASSERT_TRUE(EncodeOuterGradient(fp32, base, local, enc).ok());
  std::vector<float> rebuilt(4);
  ASSERT_TRUE(DecodeLocal(fp32, enc, base, rebuilt).ok());
  EXPECT_EQ(rebuilt, local);  // fp32: exact
  std::vector<std::byte> truncated(enc.begin(), enc.end() - 1);
  EXPECT_FALSE(DecodeLocal(fp32, truncated, base, rebuilt).ok());
  std::vector<float> short_out(3);
  EXPECT_EQ(DecodeLocal(fp32, enc, base, short_out).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl::exchange
