// Merging M learners' outer gradients for one fragment, and the token weights that drive it.
//
// Outer gradient of learner m for fragment p: v_m = Θ_p − θ_{m,p} (global minus local).
// Token weight: w_m = c_tokens² / c_steps ("quantity × quality"), 0 when c_steps = 0.
// Weighted mean:  Σ w_m v_m / Σ w_m.
// RDA (radial-directional averaging), per tensor slice:
//   (Σ w_m ‖v_m‖ / Σ w_m) · unit(Σ w_m unit(v_m) / Σ w_m),  unit(x) = x/‖x‖, unit(0) = 0.
// Embedding slices always use the weighted mean. When Σ w = 0 the merged result is all zeros
// (nothing to merge). Inputs whose weight is 0 are never read (a dead learner's stale buffer
// cannot poison the merge). Non-finite input values are not checked and propagate.
// All accumulation is in double, results in fp32 (within a few fp32 ulps of an exact double
// evaluation of the formulas above).
// Thread-safety: pure functions over caller-owned buffers; no allocation beyond temporaries.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/parallel.h"
#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"

namespace atl::diloco {

// kRda: RDA for every tensor but embeddings, which take the weighted mean (the paper's rule: an
// embedding's rows are updated sparsely). kRdaAll: RDA for embeddings too — for a tied embedding,
// which as the output head gets a dense gradient. kMean: the weighted mean everywhere.
enum class MergeRule { kMean, kRda, kRdaAll };
inline constexpr EnumNames<MergeRule, 3> kMergeRuleNames{
    "merge", {{{MergeRule::kRda, "rda"}, {MergeRule::kRdaAll, "rda-all"}, {MergeRule::kMean, "mean"}}}};
constexpr const auto& NamesOf(MergeRule) { return kMergeRuleNames; }
inline const char* MergeRuleName(MergeRule r) { return kMergeRuleNames.Name(r); }
// The rule a run file or flag names: "rda", "rda-all" or "mean"; InvalidArgument for any other.
inline StatusOr<MergeRule> ParseMergeRule(std::string_view name) { return kMergeRuleNames.Parse(name); }

// c_tokens² / c_steps in double (no int64 overflow); 0 when c_steps ≤ 0 or c_tokens ≤ 0.
double TokenWeight(int64_t c_tokens, int64_t c_steps);

// How a round weights its contributions: the paper's token weights ("quantity × quality",
// TokenWeight), or uniform (1 each; 0 for a contribution without steps) for ablation.
enum class WeightRule { kTokens, kUniform };
inline constexpr EnumNames<WeightRule, 2> kWeightRuleNames{
    "weights", {{{WeightRule::kTokens, "tokens"}, {WeightRule::kUniform, "uniform"}}}};
constexpr const auto& NamesOf(WeightRule) { return kWeightRuleNames; }
inline const char* WeightRuleName(WeightRule r) { return kWeightRuleNames.Name(r); }
inline StatusOr<WeightRule> ParseWeightRule(std::string_view name) { return kWeightRuleNames.Parse(name); }
double ContributionWeight(WeightRule rule, int64_t c_tokens, int64_t c_steps);

// Weighted mean of inputs[m] into out. All inputs and out have the same length; weights ≥ 0.
// InvalidArgument on length mismatch, negative or non-finite weights, or no inputs.
Status WeightedMean(std::span<const std::span<const float>> inputs, std::span<const double> weights,
                    std::span<float> out);

// RDA of inputs[m] into out (one tensor or slice). Same contract as WeightedMean.
Status RdaMerge(std::span<const std::span<const float>> inputs, std::span<const double> weights, std::span<float> out);

// Merges one fragment: inputs[m] is learner m's outer gradient for the whole fragment, laid out
// as the fragment's slices concatenated in order. Each slice is merged separately: RDA for
// non-embedding slices under kRda, for every slice under kRdaAll, weighted mean otherwise.
// Norms are formed per segment (reduce.h); this is diloco::FragmentMerger over the spans, so a
// merge of encoded contributions decoded tile by tile gives the same bits.
Status MergeFragment(const Fragment& fragment, MergeRule rule, std::span<const std::span<const float>> inputs,
                     std::span<const double> weights, std::span<float> out);

// L2 norm in double: the square root of ChunkedSumSquares (reduce.h).
double L2Norm(std::span<const float> x);

}  // namespace atl::diloco
