#include "atoll/diloco/contributions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_merger.h"

namespace atl::diloco {
namespace {

// The source's fused forms against the default ones (Values, then the plain kernels), over ranges
// that the fused kernels take (whole int4 blocks) and ranges they leave to the default.
class PlainSource final : public ContributionSource {
 public:
  explicit PlainSource(const EncodedGradients& g) : g_(g) {}
  void Values(size_t m, size_t begin, size_t end, float* out) const override { g_.Values(m, begin, end, out); }

 private:
  const EncodedGradients& g_;
};

TEST(EncodedGradientsTest, FusedFormsGiveTheDefaultFormsBits) {
  // Three pushes (two against bases, one a plain Δ̂), over ranges that the fused kernels take
  // (whole int4 blocks) and ranges they leave to the default forms.
  const size_t n = 256 * 40 + 100;
  for (int block : {64, 128, 256, 96}) {
    const CodecOptions codec{.encoding = Encoding::kInt4, .block_size = block};
    Rng rng(5);
    std::vector<float> reference(n), base(n), older(n);
    for (size_t i = 0; i < n; ++i) {
      reference[i] = static_cast<float>(rng.Normal(0, 0.05));
      base[i] = reference[i] + static_cast<float>(rng.Normal(0, 0.001));
      older[i] = reference[i] + static_cast<float>(rng.Normal(0, 0.002));
    }
    std::vector<std::vector<std::byte>> raws(3);
    for (auto& raw : raws) {
      std::vector<float> delta(n);
      for (float& x : delta) x = static_cast<float>(rng.Normal(0, 0.01));
      ASSERT_TRUE(Encode(codec, delta, raw).ok());
    }
    const EncodedGradients fused(codec, n, reference.data(),
                                 {{.raw = raws[0], .base = base.data()},
                                  {.raw = raws[1], .base = nullptr},
                                  {.raw = raws[2], .base = older.data()}});
    const PlainSource plain(fused);
    std::vector<float> scratch(n);
    for (const auto& [begin, end] :
         {std::pair<size_t, size_t>{0, 1024}, {256, 768}, {512, 4096}, {0, n}, {8, 1032}, {1024, 1024 + 96}}) {
      const std::string where =
          "block " + std::to_string(block) + " [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
      for (size_t m = 0; m < 3; ++m) {
        LaneSquares a, c;
        fused.AddSquares(m, begin, end, scratch.data(), a);
        plain.AddSquares(m, begin, end, scratch.data(), c);
        EXPECT_EQ(a.Sum(), c.Sum()) << where << " push " << m;
      }
      for (const std::vector<double>& coefs :
           {std::vector<double>{0.37, 0.0, 1.5}, {0.0, 2.0, 0.25}, {0.0, 0.0, 0.0}}) {
        std::vector<double> x(end - begin, 0.5), y(end - begin, -0.5);
        fused.Accumulate(coefs, begin, end, scratch.data(), x.data());
        plain.Accumulate(coefs, begin, end, scratch.data(), y.data());
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)), 0) << where;
      }
    }
  }
}

// Three int4 pushes against one base, of a fragment of an embedding slice of `embedding` values and
// a second slice of `rest`.
struct ThreePushes {
  Fragment fragment;
  CodecOptions codec{.encoding = Encoding::kInt4, .block_size = 256};
  std::vector<float> reference, base;
  std::vector<std::vector<std::byte>> raws;

  ThreePushes(int64_t embedding, int64_t rest, uint64_t seed) {
    fragment.slices = {{.tensor = 0, .offset = 0, .count = embedding, .is_embedding = true},
                       {.tensor = 1, .offset = 0, .count = rest}};
    fragment.numel = embedding + rest;
    const auto n = static_cast<size_t>(fragment.numel);
    Rng rng(seed);
    reference.resize(n);
    base.resize(n);
    for (size_t i = 0; i < n; ++i) {
      reference[i] = static_cast<float>(rng.Normal(0, 0.05));
      base[i] = reference[i] + static_cast<float>(rng.Normal(0, 0.001));
    }
    raws.resize(3);
    for (auto& raw : raws) {
      std::vector<float> delta(n);
      for (float& x : delta) x = static_cast<float>(rng.Normal(0, 0.01));
      EXPECT_TRUE(Encode(codec, delta, raw).ok());
    }
  }
  EncodedGradients Source() const {
    std::vector<EncodedGradients::Push> pushes;
    for (const auto& raw : raws) pushes.push_back({.raw = raw, .base = base.data()});
    return EncodedGradients(codec, static_cast<size_t>(fragment.numel), reference.data(), std::move(pushes));
  }
};

TEST(FragmentMergerTest, NormsGivenBeforeTheRunGiveTheSameMerge) {
  // Three int4 pushes of a two-slice fragment (one an embedding), merged by RDA with every norm
  // formed by the run, and with two of them given beforehand from NormsOf: the same bits.
  const ThreePushes in(3000, 9000, 9);
  const Fragment& f = in.fragment;
  const EncodedGradients source = in.Source();
  const auto merge = [&](bool give) {
    auto merger = FragmentMerger::Create(f, MergeRule::kRda, {1.0, 2.0, 0.5});
    EXPECT_TRUE(merger.ok());
    for (size_t m : {0u, 2u}) {
      if (!give) break;
      auto norms = FragmentMerger::NormsOf(f, source, m);
      EXPECT_TRUE(norms.ok());
      merger->GiveNorms(m, norms->slice_norms, norms->norm);
    }
    std::vector<float> out(12000);
    merger->Run(source, [&](size_t, size_t b, size_t e, std::span<const float> merged) {
      std::copy(merged.begin(), merged.end(), out.begin() + static_cast<std::ptrdiff_t>(b));
    });
    return std::pair{out, merger->norm(2)};
  };
  const auto [formed, norm_formed] = merge(false);
  const auto [given, norm_given] = merge(true);
  EXPECT_EQ(std::memcmp(formed.data(), given.data(), formed.size() * sizeof(float)), 0);
  EXPECT_EQ(norm_formed, norm_given);
  EXPECT_GT(norm_given, 0);
}

TEST(FragmentMergerTest, SumsKeptForTheMergeGiveTheSameBits) {
  // Pass 3 reading the sums pass 2 kept (fp32) against forming them again (double): the same
  // merged values and norm, for RDA and a weighted mean, on one thread and on a pool.
  const ThreePushes in(70000, 90000, 11);
  const Fragment& f = in.fragment;
  const EncodedGradients source = in.Source();
  ThreadPool pool(3);
  for (MergeRule rule : {MergeRule::kRda, MergeRule::kRdaAll, MergeRule::kMean}) {
    for (ThreadPool* on : {static_cast<ThreadPool*>(nullptr), &pool}) {
      const auto merge = [&](std::vector<float>* keep) {
        auto merger = FragmentMerger::Create(f, rule, {1.0, 2.0, 0.5}, on);
        EXPECT_TRUE(merger.ok());
        if (keep != nullptr) merger->KeepSums(keep);
        std::vector<float> out(f.numel);
        merger->Run(source, [&](size_t, size_t b, size_t, std::span<const float> merged) {
          std::copy(merged.begin(), merged.end(), out.begin() + static_cast<std::ptrdiff_t>(b));
        });
        return std::pair{out, merger->merged_norm()};
      };
      std::vector<float> kept;
      const auto [formed, norm_formed] = merge(nullptr);
      const auto [reused, norm_reused] = merge(&kept);
      EXPECT_EQ(std::memcmp(formed.data(), reused.data(), formed.size() * sizeof(float)), 0);
      EXPECT_EQ(norm_formed, norm_reused);
      EXPECT_GT(norm_reused, 0);
    }
  }
}

}  // namespace
}  // namespace atl::diloco
