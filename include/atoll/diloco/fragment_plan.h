// Fragment plans: how the model's parameters are split into P fragments that are synchronised on
// a staggered schedule (one fragment per inner step when P = H).
//
// A fragment is a list of slices; a slice is a contiguous element range [offset, offset+count) of
// one tensor's flat (row-major) data. Without splitting every slice is a whole tensor. With
// split_large (default) a tensor larger than the ideal fragment size (total/P) is cut into row
// blocks (whole rows of its first dimension) that are packed like separate tensors, so one huge
// tied embedding cannot make one fragment far bigger than the rest.
//
// Strategies:
//   kBalanced  greedy bin packing (LPT): items sorted by size descending (ties by name, then
//              offset), each placed into the currently lightest fragment (ties: lowest index).
//              Deterministic. The peak fragment is at most ideal + (its last-placed item), so
//              with items ≤ ideal/3 peak/ideal ≤ 4/3. With split_large, if cutting at ideal
//              still leaves peak/ideal > 4/3 (e.g. 4 equal tensors into 3 fragments), the plan is
//              rebuilt cutting every tensor larger than ideal/3, which guarantees ≤ 4/3 unless a
//              single row is larger than ideal/3. Without split_large nothing is guaranteed (one
//              tensor may be half the model).
//   kStrided   transformer layer i (the integer after a "layers." / "blocks." / "h." name
//              component) goes to fragment i mod P; tensors without a layer number go
//              round-robin in name order after the layers (the k-th to fragment (L + k) mod P,
//              L = highest layer + 1). Matches Streaming DiLoCo's layer-strided fragments.
//              Never splits tensors (split_large is ignored).
// A fragment can be empty (numel 0) only when there are fewer items than fragments: strided
// with P > L + (non-layer tensors), or no splitting with fewer tensors than P, or rows larger
// than the ideal. Merges, codecs and the optimizer accept empty spans.
// Thread-safety: a built plan is immutable.
#pragma once

#include "atoll/diloco/mode.h"

#include <cstdint>
#include <string>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"
#include "atoll/diloco/tensor_spec.h"

namespace atl::diloco {

enum class PlanStrategy { kBalanced, kStrided };
inline constexpr EnumNames<PlanStrategy, 2> kPlanStrategyNames{
    "plan", {{{PlanStrategy::kBalanced, "balanced"}, {PlanStrategy::kStrided, "strided"}}}};
constexpr const auto& NamesOf(PlanStrategy) { return kPlanStrategyNames; }
inline const char* PlanStrategyName(PlanStrategy s) { return kPlanStrategyNames.Name(s); }
// "balanced" | "strided"; InvalidArgument for anything else.
inline StatusOr<PlanStrategy> ParsePlanStrategy(std::string_view s) { return kPlanStrategyNames.Parse(s); }

// The default number of fragments P, of a plan and of its schedule alike.
inline constexpr int kDefaultFragments = 24;

struct PlanOptions {
  int num_fragments = kDefaultFragments;  // P ≥ 1
  PlanStrategy strategy = PlanStrategy::kBalanced;
  bool split_large = true;  // cut tensors larger than total/P into row blocks
};

struct TensorSlice {
  int tensor = 0;      // index into the TensorSpec list the plan was built from
  int64_t offset = 0;  // first element (flat, row-major)
  int64_t count = 0;   // number of elements
  bool is_embedding = false;
};

struct Fragment {
  int index = 0;
  std::vector<TensorSlice> slices;  // in a deterministic order (tensor index, then offset)
  int64_t numel = 0;                // sum of slice counts
};

struct FragmentPlan {
  std::vector<TensorSpec> tensors;
  std::vector<Fragment> fragments;  // size P; every element of every tensor in exactly one slice
  int64_t total_numel = 0;
  double ideal_numel = 0;    // total / P
  double peak_to_ideal = 0;  // max fragment numel / ideal

  int num_fragments() const { return static_cast<int>(fragments.size()); }
  // The largest fragment's numel (0 without fragments): what a buffer that serves any fragment holds.
  size_t largest_numel() const {
    int64_t n = 0;
    for (const Fragment& f : fragments) n = n > f.numel ? n : f.numel;
    return static_cast<size_t>(n);
  }
};

// Builds a plan. InvalidArgument when P < 1, P > number of elements, no tensors, a tensor has
// numel ≤ 0 or numel ≠ product(shape), or names repeat.
StatusOr<FragmentPlan> MakeFragmentPlan(const std::vector<TensorSpec>& tensors, const PlanOptions& options);

// Human-readable one-line-per-fragment report ("fragment 3: 41,216 elements (1.02× ideal) ...").
std::string DescribePlan(const FragmentPlan& plan);

// The staggered schedule. Inner steps are counted from 0 on each learner. With H ≥ P, fragment p
// is sent after every local step t with (t mod H) == floor(p·H / P); its merged value is due
// before step t + 1 + τ (τ = 0: applied before the very next step, no overlap; τ = 2: two inner
// steps run while the round is merged). When P = H exactly one fragment goes out every step.
// Synchronous DiLoCo instead sends every fragment after the last step of each period of H and
// applies the merge before the next step (τ is not used). This is the one place these rules live:
// the learner agent asks FragmentsAt and DueStep.
struct Schedule {
  int H = 24;                 // inner steps between two syncs of the same fragment
  int P = kDefaultFragments;  // number of fragments, 1 ≤ P ≤ H
  int tau = 2;                // overlap in steps, 0 ≤ τ < H
  bool synchronous = false;   // synchronous DiLoCo (every fragment at once, at the barrier)

  // The schedule of `mode` (synchronous for Mode::kDiloco).
  static Schedule Of(Mode mode, int H, int P, int tau) { return {H, P, tau, mode == Mode::kDiloco}; }

  // Validates 1 ≤ P ≤ H and 0 ≤ τ < H (InvalidArgument otherwise). The other members require a
  // valid schedule (ATOLL_CHECK) and p in [0, P).
  Status Validate() const;
  // The staggered fragment sent after local step t, or -1 when none is sent at t (or t < 0).
  int FragmentAt(int64_t step) const;
  // Every fragment sent after local step t (either schedule).
  std::vector<int> FragmentsAt(int64_t step) const;
  // The local step before which the merge of a fragment sent after step `send_step` is applied.
  int64_t DueStep(int64_t send_step) const { return send_step + 1 + (synchronous ? 0 : tau); }
  // The offset within a period of H at which fragment p is sent.
  int SendOffset(int p) const;
};

}  // namespace atl::diloco
