// The fragment plans of the tests: StridedPlan, n square tensors "layers.i.w" with one fragment
// each (strided, never split), and ToyPlan, the toy model's three tensors (an embedding and two
// layers) in P balanced fragments. Header-only; tests and fuzz targets share it.
#pragma once

#include <string>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"

namespace atl::testing {

// `tensors` tensors of side × side values, fragment p = tensor p.
inline diloco::FragmentPlan StridedPlan(int tensors, int64_t side) {
  std::vector<diloco::TensorSpec> t;
  for (int i = 0; i < tensors; ++i)
    t.push_back({"layers." + std::to_string(i) + ".w", {side, side}, side * side, false});
  diloco::PlanOptions po;
  po.num_fragments = tensors;
  po.strategy = diloco::PlanStrategy::kStrided;
  po.split_large = false;
  auto plan = diloco::MakeFragmentPlan(t, po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

// The smallest plan: two tensors of 4 values, fragment 0 "layers.0.w", fragment 1 "layers.1.w".
inline diloco::FragmentPlan SmallStridedPlan() { return StridedPlan(2, 2); }

inline std::vector<diloco::TensorSpec> ToyTensors() {
  return {{"tok_emb.weight", {16, 8}, 128, true}, {"layers.0.w", {8, 8}, 64, false}, {"layers.1.w", {8, 8}, 64, false}};
}

inline diloco::FragmentPlan ToyPlan(int P) {
  diloco::PlanOptions po;
  po.num_fragments = P;
  auto plan = diloco::MakeFragmentPlan(ToyTensors(), po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

}  // namespace atl::testing
