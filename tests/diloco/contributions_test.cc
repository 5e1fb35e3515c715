#include "atoll/diloco/contributions.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"

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
  const size_t n = 256 * 40 + 100;
  for (int block : {64, 128, 256, 96}) {
    const CodecOptions codec{.encoding = Encoding::kInt4, .block_size = block};
    Rng rng(5);
    std::vector<float> reference(n), base(n), delta(n);
    for (size_t i = 0; i < n; ++i) {
      reference[i] = static_cast<float>(rng.Normal(0, 0.05));
      base[i] = reference[i] + static_cast<float>(rng.Normal(0, 0.001));
      delta[i] = static_cast<float>(rng.Normal(0, 0.01));
    }
    std::vector<std::byte> raw;
    ASSERT_TRUE(Encode(codec, delta, raw).ok());
    for (const float* b : {static_cast<const float*>(base.data()), static_cast<const float*>(nullptr)}) {
      const EncodedGradients fused(codec, n, reference.data(), {{.raw = raw, .base = b}});
      const PlainSource plain(fused);
      std::vector<float> scratch(n);
      for (const auto& [begin, end] : {std::pair<size_t, size_t>{0, 1024}, {256, 768}, {512, 4096}, {0, n},
                                       {8, 1032}, {1024, 1024 + 96}}) {
        LaneSquares a, c;
        fused.AddSquares(0, begin, end, scratch.data(), a);
        plain.AddSquares(0, begin, end, scratch.data(), c);
        EXPECT_EQ(a.Sum(), c.Sum()) << "block " << block << " [" << begin << ", " << end << ")";
        std::vector<double> x(end - begin, 0.5), y(end - begin, 0.5);
        fused.AddScaled(0, begin, end, 0.37, scratch.data(), x.data());
        plain.AddScaled(0, begin, end, 0.37, scratch.data(), y.data());
        EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)), 0)
            << "block " << block << " [" << begin << ", " << end << ")";
      }
    }
  }
}

}  // namespace
}  // namespace atl::diloco
