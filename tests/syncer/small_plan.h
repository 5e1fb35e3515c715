// The smallest plan the syncer tests use: two tensors of 4 values, P = 2 strided, so fragment 0
// is "layers.0.w" and fragment 1 is "layers.1.w". Header-only; tests and fuzz targets share it.
#pragma once

#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"

namespace atl::testing {

inline diloco::FragmentPlan SmallStridedPlan() {
  std::vector<diloco::TensorSpec> t = {{"layers.0.w", {2, 2}, 4, false}, {"layers.1.w", {2, 2}, 4, false}};
  diloco::PlanOptions po;
  po.num_fragments = 2;
  po.strategy = diloco::PlanStrategy::kStrided;
  po.split_large = false;
  auto plan = diloco::MakeFragmentPlan(t, po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

}  // namespace atl::testing
