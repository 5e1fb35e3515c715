#include "atoll/diloco/merge.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

// Chunk of double accumulators kept on the stack: the inner loops run over a chunk for one input
// at a time, which the compiler vectorises (an element-outer, input-inner loop would not).
constexpr size_t kChunk = 1024;

// Σ x² in double with independent partial sums, so the loop vectorises without -ffast-math.
double SumSquares(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const double v = static_cast<double>(x[i + k]);
      acc[k] += v * v;
    }
  }
  double tail = 0;
  for (; i < n; ++i) tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  double s = 0;
  for (double a : acc) s += a;
  return s + tail;
}

double SumSquares(const double* x, size_t n) {
  constexpr size_t kLanes = 8;
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) acc[k] += x[i + k] * x[i + k];
  }
  double tail = 0;
  for (; i < n; ++i) tail += x[i] * x[i];
  double s = 0;
  for (double a : acc) s += a;
  return s + tail;
}

// Checks the shared contract and returns Σw through *sum.
Status CheckInputs(const char* what, std::span<const std::span<const float>> inputs,
                   std::span<const double> weights, size_t n, double* sum) {
  if (inputs.empty()) return InvalidArgumentError(std::string(what) + ": no inputs");
  if (weights.size() != inputs.size()) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(inputs.size()) +
                                " inputs but " + std::to_string(weights.size()) + " weights");
  }
  double s = 0;
  for (size_t m = 0; m < inputs.size(); ++m) {
    if (inputs[m].size() != n) {
      return InvalidArgumentError(std::string(what) + ": input " + std::to_string(m) + " has " +
                                  std::to_string(inputs[m].size()) + " values, expected " +
                                  std::to_string(n));
    }
    const double w = weights[m];
    if (!std::isfinite(w) || w < 0) {
      return InvalidArgumentError(std::string(what) + ": weight " + std::to_string(m) + " is " +
                                  std::to_string(w) + " (must be finite and ≥ 0)");
    }
    s += w;
  }
  if (!std::isfinite(s)) {
    return InvalidArgumentError(std::string(what) + ": the weights sum to infinity");
  }
  *sum = s;
  return Status::Ok();
}

// out = Σ coef[m]·inputs[m] in double, rounded to fp32; also returns Σ out_double² when asked.
// Inputs whose coefficient is 0 are skipped (their values never matter).
double Combine(std::span<const std::span<const float>> inputs, const double* coef,
               std::span<float> out, bool want_sum_squares) {
  const size_t n = out.size();
  double acc[kChunk];
  double sum_squares = 0;
  for (size_t base = 0; base < n; base += kChunk) {
    const size_t len = std::min(kChunk, n - base);
    std::fill(acc, acc + len, 0.0);
    for (size_t m = 0; m < inputs.size(); ++m) {
      const double c = coef[m];
      if (c == 0) continue;
      const float* x = inputs[m].data() + base;
      for (size_t j = 0; j < len; ++j) acc[j] += c * static_cast<double>(x[j]);
    }
    if (want_sum_squares) sum_squares += SumSquares(acc, len);
    float* o = out.data() + base;
    for (size_t j = 0; j < len; ++j) o[j] = static_cast<float>(acc[j]);
  }
  return sum_squares;
}

// Small-M coefficient storage without heap allocation in the common case.
class Coefficients {
 public:
  explicit Coefficients(size_t m) : heap_(m > kInline ? m : 0) {
    data_ = m > kInline ? heap_.data() : inline_;
  }
  double& operator[](size_t i) { return data_[i]; }
  const double* data() const { return data_; }

 private:
  static constexpr size_t kInline = 64;
  double inline_[kInline] = {};
  std::vector<double> heap_;
  double* data_;
};

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

double L2Norm(std::span<const float> x) { return std::sqrt(SumSquares(x.data(), x.size())); }

Status WeightedMean(std::span<const std::span<const float>> inputs,
                    std::span<const double> weights, std::span<float> out) {
  double sum = 0;
  ATOLL_RETURN_IF_ERROR(CheckInputs("weighted mean", inputs, weights, out.size(), &sum));
  if (sum == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return Status::Ok();
  }
  Coefficients coef(inputs.size());
  for (size_t m = 0; m < inputs.size(); ++m) coef[m] = weights[m] / sum;
  Combine(inputs, coef.data(), out, /*want_sum_squares=*/false);
  return Status::Ok();
}

Status RdaMerge(std::span<const std::span<const float>> inputs, std::span<const double> weights,
                std::span<float> out) {
  double sum = 0;
  ATOLL_RETURN_IF_ERROR(CheckInputs("RDA merge", inputs, weights, out.size(), &sum));
  if (sum == 0) {
    std::fill(out.begin(), out.end(), 0.0f);
    return Status::Ok();
  }
  // Radius: weighted mean of the norms (zero vectors count with norm 0). Direction: Σ (w/Σw)·v/‖v‖,
  // whose norm is ≤ 1, so the fp32 intermediate in `out` can neither overflow nor lose range.
  Coefficients coef(inputs.size());
  double radius = 0;
  bool any_direction = false;
  for (size_t m = 0; m < inputs.size(); ++m) {
    coef[m] = 0;
    if (weights[m] == 0) continue;
    const double norm = L2Norm(inputs[m]);
    radius += weights[m] / sum * norm;
    if (norm > 0) {
      coef[m] = weights[m] / sum / norm;
      any_direction = true;
    }
  }
  if (!any_direction) {
    std::fill(out.begin(), out.end(), 0.0f);
    return Status::Ok();
  }
  const double direction_norm = std::sqrt(Combine(inputs, coef.data(), out, true));
  if (!(direction_norm > 0)) {  // the unit vectors cancelled exactly: unit(0) = 0
    std::fill(out.begin(), out.end(), 0.0f);
    return Status::Ok();
  }
  const double scale = radius / direction_norm;
  for (float& v : out) v = static_cast<float>(static_cast<double>(v) * scale);
  return Status::Ok();
}

StatusOr<MergeRule> ParseMergeRule(const std::string& name) {
  if (name == "rda") return MergeRule::kRda;
  if (name == "rda-all") return MergeRule::kRdaAll;
  if (name == "mean") return MergeRule::kMean;
  return InvalidArgumentError("merge must be rda, rda-all or mean (got '" + name + "')");
}

Status MergeFragment(const Fragment& fragment, MergeRule rule,
                     std::span<const std::span<const float>> inputs,
                     std::span<const double> weights, std::span<float> out) {
  const size_t n = static_cast<size_t>(fragment.numel);
  if (out.size() != n) {
    return InvalidArgumentError("merge fragment " + std::to_string(fragment.index) + ": output has " +
                                std::to_string(out.size()) + " values, fragment has " +
                                std::to_string(n));
  }
  double sum = 0;
  ATOLL_RETURN_IF_ERROR(CheckInputs("merge fragment", inputs, weights, n, &sum)
                            .WithContext("fragment " + std::to_string(fragment.index)));
  std::vector<std::vector<double>> norms;
  for (const auto& in : inputs) norms.push_back(FragmentMerger::SliceNorms(fragment, in));
  ATOLL_ASSIGN_OR_RETURN(FragmentMerger merger, FragmentMerger::Create(fragment, rule, std::vector<double>(weights.begin(), weights.end()), std::move(norms)));
  for (size_t m = 0; m < inputs.size(); ++m) {
    if (merger.Reads(m)) merger.Add(m, inputs[m]);
  }
  merger.Finish(out);
  return Status::Ok();
}

std::vector<double> FragmentMerger::SliceNorms(const Fragment& fragment, std::span<const float> values) {
  ATOLL_CHECK(static_cast<int64_t>(values.size()) == fragment.numel);
  std::vector<double> norms;
  size_t offset = 0;
  for (const TensorSlice& s : fragment.slices) {
    norms.push_back(L2Norm(values.subspan(offset, static_cast<size_t>(s.count))));
    offset += static_cast<size_t>(s.count);
  }
  return norms;
}

bool FragmentMerger::Rda(size_t slice) const {
  return rule_ == MergeRule::kRdaAll || (rule_ == MergeRule::kRda && !fragment_.slices[slice].is_embedding);
}

StatusOr<FragmentMerger> FragmentMerger::Create(const Fragment& fragment, MergeRule rule, std::vector<double> weights,
                                                std::vector<std::vector<double>> slice_norms, ThreadPool* pool) {
  const std::string what = "merge fragment " + std::to_string(fragment.index);
  if (weights.empty()) return InvalidArgumentError(what + ": no inputs");
  if (slice_norms.size() != weights.size()) return InvalidArgumentError(what + ": norms and weights differ in number");
  FragmentMerger f;
  f.fragment_ = fragment;
  f.rule_ = rule;
  const size_t slices = fragment.slices.size();
  for (size_t m = 0; m < weights.size(); ++m) {
    if (!std::isfinite(weights[m]) || weights[m] < 0) {
      return InvalidArgumentError(what + ": weight " + std::to_string(m) + " is " + std::to_string(weights[m]) +
                                  " (must be finite and ≥ 0)");
    }
    if (slice_norms[m].size() != slices) return InvalidArgumentError(what + ": contribution " + std::to_string(m) + " has the wrong number of slice norms");
    f.sum_ += weights[m];
  }
  if (!std::isfinite(f.sum_)) return InvalidArgumentError(what + ": the weights sum to infinity");
  f.coef_.assign(weights.size(), std::vector<double>(slices, 0.0));
  f.radius_.assign(slices, 0.0);
  f.any_direction_.assign(slices, false);
  for (size_t s = 0; s < slices && f.sum_ > 0; ++s) {
    for (size_t m = 0; m < weights.size(); ++m) {
      if (weights[m] == 0) continue;
      if (!f.Rda(s)) {
        f.coef_[m][s] = weights[m] / f.sum_;
        continue;
      }
      // RDA (as RdaMerge): radius = Σ (w/Σw)·‖v‖; direction = Σ (w/Σw)·v/‖v‖.
      const double norm = slice_norms[m][s];
      f.radius_[s] += weights[m] / f.sum_ * norm;
      if (norm > 0) {
        f.coef_[m][s] = weights[m] / f.sum_ / norm;
        f.any_direction_[s] = true;
      }
    }
  }
  f.weights_ = std::move(weights);
  f.acc_.assign(static_cast<size_t>(fragment.numel), 0.0);
  f.pool_ = pool;
  return f;
}

// Element ranges a merge works on in parallel: whole chunks of kChunk, so that Finish's sums of
// squares are formed exactly as Combine forms them.
constexpr size_t kParallelGrain = 64 * kChunk;

void FragmentMerger::Add(size_t m, std::span<const float> values) {
  ATOLL_CHECK(m >= next_ && m < weights_.size() && static_cast<int64_t>(values.size()) == fragment_.numel);
  next_ = m + 1;
  size_t offset = 0;
  for (size_t s = 0; s < fragment_.slices.size(); ++s) {
    const size_t count = static_cast<size_t>(fragment_.slices[s].count);
    const double c = coef_[m][s];
    if (c != 0) {
      const float* x = values.data() + offset;
      double* a = acc_.data() + offset;
      ForRanges(pool_, count, kParallelGrain, [&](size_t begin, size_t end) {
        for (size_t j = begin; j < end; ++j) a[j] += c * static_cast<double>(x[j]);
      });
    }
    offset += count;
  }
}

void FragmentMerger::Finish(std::span<float> out) {
  ATOLL_CHECK(static_cast<int64_t>(out.size()) == fragment_.numel);
  size_t offset = 0;
  for (size_t s = 0; s < fragment_.slices.size(); ++s) {
    const size_t count = static_cast<size_t>(fragment_.slices[s].count);
    const std::span<float> o = out.subspan(offset, count);
    const double* a = acc_.data() + offset;
    if (sum_ == 0 || (Rda(s) && !any_direction_[s])) {
      std::fill(o.begin(), o.end(), 0.0f);
      offset += count;
      continue;
    }
    // The same chunked reduction as Combine: Σ acc² per chunk of kChunk, chunks summed in order.
    const size_t chunks = (count + kChunk - 1) / kChunk;
    std::vector<double> squares(chunks, 0.0);
    ForRanges(pool_, chunks, kParallelGrain / kChunk, [&](size_t first, size_t last) {
      for (size_t k = first; k < last; ++k) {
        const size_t base = k * kChunk, len = std::min(kChunk, count - base);
        if (Rda(s)) squares[k] = SumSquares(a + base, len);
        for (size_t j = 0; j < len; ++j) o[base + j] = static_cast<float>(a[base + j]);
      }
    });
    if (Rda(s)) {
      double sum_squares = 0;
      for (double q : squares) sum_squares += q;
      const double direction_norm = std::sqrt(sum_squares);
      if (!(direction_norm > 0)) {
        std::fill(o.begin(), o.end(), 0.0f);
      } else {
        const double scale = radius_[s] / direction_norm;
        ForRanges(pool_, count, kParallelGrain, [&](size_t begin, size_t end) {
          for (size_t j = begin; j < end; ++j) o[j] = static_cast<float>(static_cast<double>(o[j]) * scale);
        });
      }
    }
    offset += count;
  }
}

}  // namespace atl::diloco
