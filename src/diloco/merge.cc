#include "atoll/diloco/merge.h"

#include "atoll/diloco/fragment_merger.h"
#include "atoll/diloco/reduce.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

// Checks the shared contract and returns Σw through *sum.
Status CheckInputs(const char* what, std::span<const std::span<const float>> inputs, std::span<const double> weights,
                   size_t n, double* sum) {
  if (inputs.empty()) return InvalidArgumentError(std::string(what) + ": no inputs");
  if (weights.size() != inputs.size()) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(inputs.size()) + " inputs but " +
                                std::to_string(weights.size()) + " weights");
  }
  double s = 0;
  for (size_t m = 0; m < inputs.size(); ++m) {
    if (inputs[m].size() != n) {
      return InvalidArgumentError(std::string(what) + ": input " + std::to_string(m) + " has " +
                                  std::to_string(inputs[m].size()) + " values, expected " + std::to_string(n));
    }
    const double w = weights[m];
    if (!std::isfinite(w) || w < 0) {
      return InvalidArgumentError(std::string(what) + ": weight " + std::to_string(m) + " is " + std::to_string(w) +
                                  " (must be finite and ≥ 0)");
    }
    s += w;
  }
  if (!std::isfinite(s)) {
    return InvalidArgumentError(std::string(what) + ": the weights sum to infinity");
  }
  *sum = s;
  return Status::Ok();
}

// One slice of n values, not an embedding: a plain vector as a fragment.
Fragment OneSlice(size_t n) {
  Fragment f;
  f.slices = {{.tensor = 0, .offset = 0, .count = static_cast<int64_t>(n), .is_embedding = false}};
  f.numel = static_cast<int64_t>(n);
  return f;
}

Status MergeVector(const char* what, MergeRule rule, std::span<const std::span<const float>> inputs,
                   std::span<const double> weights, std::span<float> out) {
  double sum = 0;
  ATOLL_RETURN_IF_ERROR(CheckInputs(what, inputs, weights, out.size(), &sum));
  return MergeFragment(OneSlice(out.size()), rule, inputs, weights, out);
}

}  // namespace

double TokenWeight(int64_t c_tokens, int64_t c_steps) {
  if (c_steps <= 0 || c_tokens <= 0) return 0.0;
  const double t = static_cast<double>(c_tokens);
  return t * t / static_cast<double>(c_steps);
}

double ContributionWeight(WeightRule rule, int64_t c_tokens, int64_t c_steps) {
  if (rule == WeightRule::kTokens) return TokenWeight(c_tokens, c_steps);
  return c_steps > 0 && c_tokens > 0 ? 1.0 : 0.0;
}

double L2Norm(std::span<const float> x) { return std::sqrt(ChunkedSumSquares(x)); }

Status WeightedMean(std::span<const std::span<const float>> inputs, std::span<const double> weights,
                    std::span<float> out) {
  return MergeVector("weighted mean", MergeRule::kMean, inputs, weights, out);
}

Status RdaMerge(std::span<const std::span<const float>> inputs, std::span<const double> weights, std::span<float> out) {
  return MergeVector("RDA merge", MergeRule::kRda, inputs, weights, out);
}

Status MergeFragment(const Fragment& fragment, MergeRule rule, std::span<const std::span<const float>> inputs,
                     std::span<const double> weights, std::span<float> out) {
  const size_t n = static_cast<size_t>(fragment.numel);
  if (out.size() != n) {
    return InvalidArgumentError("merge fragment " + std::to_string(fragment.index) + ": output has " +
                                std::to_string(out.size()) + " values, fragment has " + std::to_string(n));
  }
  double sum = 0;
  ATOLL_RETURN_IF_ERROR(CheckInputs("merge fragment", inputs, weights, n, &sum)
                            .WithContext("fragment " + std::to_string(fragment.index)));
  ATOLL_ASSIGN_OR_RETURN(FragmentMerger merger,
                         FragmentMerger::Create(fragment, rule, std::vector<double>(weights.begin(), weights.end())));
  merger.Run([&](size_t m, size_t begin, size_t end,
                 float* v) { std::copy(inputs[m].begin() + begin, inputs[m].begin() + end, v); },
             [&](size_t, size_t begin, size_t, std::span<const float> merged) {
               std::copy(merged.begin(), merged.end(), out.begin() + static_cast<std::ptrdiff_t>(begin));
             });
  return Status::Ok();
}

}  // namespace atl::diloco
