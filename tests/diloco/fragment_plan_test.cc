#include "atoll/diloco/fragment_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atoll/core/rng.h"

namespace atl::diloco {
namespace {

TensorSpec T(std::string name, std::vector<int64_t> shape, bool emb = false) {
  const int64_t n = NumelOf(shape);
  return {std::move(name), std::move(shape), n, emb};
}

// Every element of every tensor is in exactly one slice; bookkeeping is consistent.
void ExpectExactCover(const FragmentPlan& plan, int P) {
  ASSERT_EQ(plan.num_fragments(), P);
  std::vector<std::vector<int>> seen(plan.tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    seen[i].assign(static_cast<size_t>(plan.tensors[i].numel), 0);
    total += plan.tensors[i].numel;
  }
  EXPECT_EQ(plan.total_numel, total);
  int64_t sum = 0;
  int64_t peak = 0;
  for (int p = 0; p < P; ++p) {
    const Fragment& f = plan.fragments[static_cast<size_t>(p)];
    EXPECT_EQ(f.index, p);
    int64_t n = 0;
    for (size_t k = 0; k < f.slices.size(); ++k) {
      const TensorSlice& s = f.slices[k];
      ASSERT_GE(s.tensor, 0);
      ASSERT_LT(s.tensor, static_cast<int>(plan.tensors.size()));
      const TensorSpec& t = plan.tensors[static_cast<size_t>(s.tensor)];
      ASSERT_GT(s.count, 0);
      ASSERT_GE(s.offset, 0);
      ASSERT_LE(s.offset + s.count, t.numel);
      EXPECT_EQ(s.is_embedding, t.is_embedding);
      if (k > 0) {  // deterministic order: tensor index, then offset
        const TensorSlice& prev = f.slices[k - 1];
        EXPECT_TRUE(prev.tensor < s.tensor || (prev.tensor == s.tensor && prev.offset < s.offset));
      }
      for (int64_t e = s.offset; e < s.offset + s.count; ++e) {
        ++seen[static_cast<size_t>(s.tensor)][static_cast<size_t>(e)];
      }
      n += s.count;
    }
    EXPECT_EQ(f.numel, n);
    sum += n;
    peak = std::max(peak, n);
  }
  EXPECT_EQ(sum, total);
  for (size_t i = 0; i < seen.size(); ++i) {
    for (size_t e = 0; e < seen[i].size(); ++e) {
      ASSERT_EQ(seen[i][e], 1) << plan.tensors[i].name << " element " << e;
    }
  }
  EXPECT_DOUBLE_EQ(plan.ideal_numel, static_cast<double>(total) / P);
  EXPECT_DOUBLE_EQ(plan.peak_to_ideal, static_cast<double>(peak) / plan.ideal_numel);
}

TEST(ExampleGptTest, ShapeOfTheTinyModel) {
  const auto t = ExampleGptTensors();
  ASSERT_EQ(t.size(), 38u);  // embedding + 4 × 9 + final norm
  EXPECT_EQ(t[0].name, "tok_emb.weight");
  EXPECT_TRUE(t[0].is_embedding);
  EXPECT_EQ(t[0].numel, 4096 * 128);
  EXPECT_EQ(t[7].name, "layers.0.mlp.w1.weight");
  EXPECT_EQ(t[8].shape, (std::vector<int64_t>{128, 344}));
  int64_t total = 0;
  for (const auto& s : t) total += s.numel;
  // 524,288 + 4 × (2·128 + 4·16,384 + 3·44,032) + 128
  EXPECT_EQ(total, 1315968);
}

TEST(FragmentPlanTest, HandPackedLpt) {
  // Sizes 5, 4, 3, 3, 3 into 2: A→0 (5), B→1 (4), C→1 (7), D→0 (8), E→1 (10).
  std::vector<TensorSpec> t = {T("e", {3}), T("a", {5}), T("c", {3}), T("b", {4}), T("d", {3})};
  auto plan = MakeFragmentPlan(t, {.num_fragments = 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectExactCover(*plan, 2);
  const auto& f0 = plan->fragments[0].slices;
  const auto& f1 = plan->fragments[1].slices;
  ASSERT_EQ(f0.size(), 2u);
  ASSERT_EQ(f1.size(), 3u);
  EXPECT_EQ(f0[0].tensor, 1);  // a
  EXPECT_EQ(f0[1].tensor, 4);  // d
  EXPECT_EQ(f1[0].tensor, 0);  // e
  EXPECT_EQ(f1[1].tensor, 2);  // c
  EXPECT_EQ(f1[2].tensor, 3);  // b
  EXPECT_EQ(plan->fragments[0].numel, 8);
  EXPECT_EQ(plan->fragments[1].numel, 10);
  EXPECT_DOUBLE_EQ(plan->peak_to_ideal, 10.0 / 9.0);
}

TEST(FragmentPlanTest, TinyGptBalancedP24) {
  const auto t = ExampleGptTensors();
  auto plan = MakeFragmentPlan(t, {.num_fragments = 24});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectExactCover(*plan, 24);
  EXPECT_DOUBLE_EQ(plan->ideal_numel, 54832.0);
  // The embedding (9.6× ideal) is cut into 10 row blocks of 409/410 rows (≤ 428 rows = ideal).
  int emb_slices = 0;
  for (const auto& f : plan->fragments) {
    EXPECT_GT(f.numel, 0);
    for (const auto& s : f.slices) {
      if (s.tensor != 0) {
        EXPECT_EQ(s.count, t[static_cast<size_t>(s.tensor)].numel) << "only the embedding splits";
        continue;
      }
      ++emb_slices;
      EXPECT_EQ(s.offset % 128, 0);
      EXPECT_TRUE(s.count == 409 * 128 || s.count == 410 * 128) << s.count;
    }
  }
  EXPECT_EQ(emb_slices, 10);
  // By hand: 10 bins hold an embedding block (52,352/52,480), 12 an MLP matrix (44,032), 16
  // attention matrices (16,384) go 3+3 to the two empty bins (49,152) and 10 onto MLP bins
  // (60,416); the 9 norms (128) fill the lightest. Peak = 60,416 → 1.1018.
  EXPECT_DOUBLE_EQ(plan->peak_to_ideal, 60416.0 / 54832.0);
  EXPECT_LE(plan->peak_to_ideal, 4.0 / 3.0);
}

TEST(FragmentPlanTest, TinyGptWithoutSplitIsDominatedByTheEmbedding) {
  auto plan = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 24, .split_large = false});
  ASSERT_TRUE(plan.ok());
  ExpectExactCover(*plan, 24);
  EXPECT_DOUBLE_EQ(plan->peak_to_ideal, 524288.0 / 54832.0);
}

TEST(FragmentPlanTest, TinyGptStrided) {
  auto plan = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 24, .strategy = PlanStrategy::kStrided});
  ASSERT_TRUE(plan.ok());
  ExpectExactCover(*plan, 24);
  // Layers 0..3 → fragments 0..3; then "norm.weight" → 4, "tok_emb.weight" → 5; rest empty.
  for (int p = 0; p < 4; ++p) EXPECT_EQ(plan->fragments[static_cast<size_t>(p)].numel, 197888);
  ASSERT_EQ(plan->fragments[4].slices.size(), 1u);
  EXPECT_EQ(plan->fragments[4].slices[0].tensor, 37);
  ASSERT_EQ(plan->fragments[5].slices.size(), 1u);
  EXPECT_EQ(plan->fragments[5].slices[0].tensor, 0);
  for (int p = 6; p < 24; ++p) EXPECT_EQ(plan->fragments[static_cast<size_t>(p)].numel, 0);
  EXPECT_DOUBLE_EQ(plan->peak_to_ideal, 524288.0 / 54832.0);

  auto two = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 2, .strategy = PlanStrategy::kStrided});
  ASSERT_TRUE(two.ok());
  ExpectExactCover(*two, 2);
  // Layers 0, 2 and norm ((4 + 0) mod 2) → 0; layers 1, 3 and tok_emb ((4 + 1) mod 2) → 1.
  EXPECT_EQ(two->fragments[0].numel, 2 * 197888 + 128);
  EXPECT_EQ(two->fragments[1].numel, 2 * 197888 + 524288);
}

TEST(FragmentPlanTest, StridedLayerNamesAreWholeComponents) {
  std::vector<TensorSpec> t = {T("model.blocks.3.w", {2}), T("h.1.attn", {2}), T("mlp.fch.2.w", {2}),
                               T("layers.5x.w", {2}), T("a.layers.2", {2})};
  auto plan = MakeFragmentPlan(t, {.num_fragments = 4, .strategy = PlanStrategy::kStrided});
  ASSERT_TRUE(plan.ok());
  ExpectExactCover(*plan, 4);
  auto fragment_of = [&](int tensor) {
    for (const auto& f : plan->fragments) {
      for (const auto& s : f.slices) {
        if (s.tensor == tensor) return f.index;
      }
    }
    return -1;
  };
  EXPECT_EQ(fragment_of(0), 3);  // blocks.3
  EXPECT_EQ(fragment_of(1), 1);  // h.1
  EXPECT_EQ(fragment_of(4), 2);  // layers.2
  // No layer: "layers.5x.w" < "mlp.fch.2.w" in name order, after L = 4 → 0, 1.
  EXPECT_EQ(fragment_of(3), 0);
  EXPECT_EQ(fragment_of(2), 1);
}

TEST(FragmentPlanTest, FallsBackToFinerSplitToKeepFourThirds) {
  // Four equal tensors into 3 fragments: LPT gives 8/4/4 (1.5× ideal) without cutting.
  std::vector<TensorSpec> t = {T("a", {4}), T("b", {4}), T("c", {4}), T("d", {4})};
  auto whole = MakeFragmentPlan(t, {.num_fragments = 3, .split_large = false});
  ASSERT_TRUE(whole.ok());
  EXPECT_DOUBLE_EQ(whole->peak_to_ideal, 1.5);
  auto split = MakeFragmentPlan(t, {.num_fragments = 3});
  ASSERT_TRUE(split.ok());
  ExpectExactCover(*split, 3);
  EXPECT_DOUBLE_EQ(split->peak_to_ideal, 6.0 / (16.0 / 3.0));
}

TEST(FragmentPlanTest, RandomShapesCoverExactlyOnceForManyP) {
  Rng rng(42);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<TensorSpec> t;
    const int n = 1 + static_cast<int>(rng.UniformInt(12));
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> shape;
      const int rank = static_cast<int>(rng.UniformInt(3));
      for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng.UniformInt(40)));
      std::string name = "t";
      name += std::to_string(i);
      t.push_back(T(name, shape, i == 0 && rng.Bernoulli(0.5)));
    }
    int64_t total = 0;
    for (const auto& s : t) total += s.numel;
    // P around the number of tensors, and beyond it where elements allow.
    for (int P : {1, n - 1, n, n + 1, 2 * n + 3}) {
      if (P < 1 || P > total) continue;
      for (auto strategy : {PlanStrategy::kBalanced, PlanStrategy::kStrided}) {
        for (bool split : {true, false}) {
          auto plan = MakeFragmentPlan(t, {.num_fragments = P, .strategy = strategy, .split_large = split});
          ASSERT_TRUE(plan.ok()) << plan.status();
          ExpectExactCover(*plan, P);
          // Balanced + split with rows no larger than ideal/3: the LPT bound holds.
          if (strategy == PlanStrategy::kBalanced && split) {
            bool small_rows = true;
            for (const auto& s : t) {
              const int64_t row = s.shape.empty() ? s.numel : s.numel / s.shape[0];
              if (static_cast<double>(row) > plan->ideal_numel / 3) small_rows = false;
            }
            if (small_rows) {
              EXPECT_LE(plan->peak_to_ideal, 4.0 / 3.0 + 1e-12);
            }
          }
        }
      }
    }
  }
}

TEST(FragmentPlanTest, TinyGptWithPNearTheNumberOfTensors) {
  // 38 tensors; P around it, with and without splitting, both strategies.
  for (int P : {36, 37, 38, 39, 40, 76, 200}) {
    for (auto strategy : {PlanStrategy::kBalanced, PlanStrategy::kStrided}) {
      for (bool split : {true, false}) {
        auto plan =
            MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = P, .strategy = strategy, .split_large = split});
        ASSERT_TRUE(plan.ok()) << plan.status();
        ExpectExactCover(*plan, P);
        if (strategy == PlanStrategy::kBalanced && split) {
          EXPECT_LE(plan->peak_to_ideal, 4.0 / 3.0) << P;
          for (const auto& f : plan->fragments) EXPECT_GT(f.numel, 0) << P;
        }
      }
    }
  }
}

TEST(FragmentPlanTest, IsDeterministic) {
  auto a = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 7});
  auto b = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 7});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(DescribePlan(*a), DescribePlan(*b));
}

TEST(FragmentPlanTest, RejectsBadInput) {
  const auto gpt = ExampleGptTensors();
  EXPECT_EQ(MakeFragmentPlan(gpt, {.num_fragments = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeFragmentPlan({}, {.num_fragments = 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeFragmentPlan({T("a", {2})}, {.num_fragments = 3}).status().code(),
            StatusCode::kInvalidArgument);  // P > elements
  TensorSpec wrong = T("a", {2, 3});
  wrong.numel = 5;
  EXPECT_EQ(MakeFragmentPlan({wrong}, {.num_fragments = 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeFragmentPlan({T("a", {-2, -3})}, {.num_fragments = 1}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeFragmentPlan({T("a", {2}), T("a", {3})}, {.num_fragments = 1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(FragmentPlanTest, DescribeAndParse) {
  auto plan = MakeFragmentPlan(ExampleGptTensors(), {.num_fragments = 24});
  ASSERT_TRUE(plan.ok());
  const std::string d = DescribePlan(*plan);
  EXPECT_NE(d.find("1,315,968 elements"), std::string::npos) << d;
  EXPECT_NE(d.find("fragment 23:"), std::string::npos);
  EXPECT_NE(d.find("tok_emb.weight[rows 0:409]"), std::string::npos) << d;
  EXPECT_EQ(*ParsePlanStrategy("strided"), PlanStrategy::kStrided);
  EXPECT_EQ(*ParsePlanStrategy("balanced"), PlanStrategy::kBalanced);
  for (PlanStrategy s : {PlanStrategy::kBalanced, PlanStrategy::kStrided}) {
    EXPECT_EQ(*ParsePlanStrategy(PlanStrategyName(s)), s);
  }
  const auto bad = ParsePlanStrategy("lpt");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "plan must be balanced or strided (got 'lpt')");
}

TEST(ScheduleTest, OneFragmentPerStepWhenPEqualsH) {
  Schedule s{.H = 24, .P = 24, .tau = 2};
  ASSERT_TRUE(s.Validate().ok());
  for (int64_t t = 0; t < 100; ++t) EXPECT_EQ(s.FragmentAt(t), static_cast<int>(t % 24));
  EXPECT_EQ(s.DueStep(5), 8);  // sent after step 5; steps 6 and 7 overlap the round
  EXPECT_EQ(s.SendOffset(13), 13);
  EXPECT_EQ(s.FragmentAt(-1), -1);
}

TEST(ScheduleTest, SpreadsFragmentsWhenHExceedsP) {
  Schedule s{.H = 10, .P = 4, .tau = 3};
  ASSERT_TRUE(s.Validate().ok());
  // Offsets floor(p·10/4) = 0, 2, 5, 7.
  const int expected[10] = {0, -1, 1, -1, -1, 2, -1, 3, -1, -1};
  for (int64_t t = 0; t < 30; ++t) EXPECT_EQ(s.FragmentAt(t), expected[t % 10]) << t;
  EXPECT_EQ(s.SendOffset(2), 5);
  EXPECT_EQ(s.DueStep(17), 21);
}

TEST(ScheduleTest, EveryFragmentOncePerPeriod) {
  for (int H = 1; H <= 30; ++H) {
    for (int P = 1; P <= H; ++P) {
      Schedule s{.H = H, .P = P, .tau = 0};
      std::vector<int> count(static_cast<size_t>(P), 0);
      for (int64_t t = 3 * H; t < 4 * H; ++t) {
        const int p = s.FragmentAt(t);
        if (p >= 0) {
          ++count[static_cast<size_t>(p)];
          EXPECT_EQ(s.SendOffset(p), t % H);
        }
      }
      for (int c : count) EXPECT_EQ(c, 1) << "H=" << H << " P=" << P;
    }
  }
}

TEST(ScheduleTest, Validate) {
  EXPECT_FALSE((Schedule{.H = 4, .P = 5, .tau = 0}).Validate().ok());
  EXPECT_FALSE((Schedule{.H = 4, .P = 0, .tau = 0}).Validate().ok());
  EXPECT_FALSE((Schedule{.H = 4, .P = 4, .tau = 4}).Validate().ok());
  EXPECT_FALSE((Schedule{.H = 4, .P = 4, .tau = -1}).Validate().ok());
  EXPECT_TRUE((Schedule{.H = 4, .P = 4, .tau = 3}).Validate().ok());
}

}  // namespace
}  // namespace atl::diloco

namespace atl::diloco {
namespace {

TEST(ScheduleTest, SynchronousDilocoSendsEveryFragmentAtTheBarrierAndAppliesBeforeTheNextStep) {
  const Schedule s = Schedule::Of(Mode::kDiloco, 4, 3, 2);
  EXPECT_TRUE(s.synchronous);
  for (int64_t t : {0, 1, 2, 4, 5, 6}) EXPECT_TRUE(s.FragmentsAt(t).empty()) << t;
  EXPECT_EQ(s.FragmentsAt(3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.FragmentsAt(7), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.DueStep(3), 4);  // τ is not used: the barrier
  const Schedule d = Schedule::Of(Mode::kDecoupled, 4, 4, 2);
  EXPECT_FALSE(d.synchronous);
  EXPECT_EQ(d.FragmentsAt(5), (std::vector<int>{1}));
  EXPECT_EQ(d.DueStep(5), 8);
  EXPECT_TRUE(d.FragmentsAt(-1).empty());
}

}  // namespace
}  // namespace atl::diloco
