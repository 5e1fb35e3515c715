// A toy "model" for runtime tests: each learner pulls its parameters toward its own target
// (θ ← θ − η(θ − target_m)), so the global model should move toward the targets' mean.
#pragma once

#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/learner/learner_agent.h"

namespace atl::testing {

inline std::vector<diloco::TensorSpec> ToyTensors() {
  return {{"tok_emb.weight", {16, 8}, 128, true},
          {"layers.0.w", {8, 8}, 64, false},
          {"layers.1.w", {8, 8}, 64, false}};
}

inline diloco::FragmentPlan ToyPlan(int P) {
  diloco::PlanOptions po;
  po.num_fragments = P;
  auto plan = diloco::MakeFragmentPlan(ToyTensors(), po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

struct ToyLearner {
  std::vector<std::vector<float>> params, target;
  explicit ToyLearner(uint64_t seed) {
    Rng rng(seed);
    for (const auto& t : ToyTensors()) {
      params.emplace_back(static_cast<size_t>(t.numel), 0.0f);
      std::vector<float> tg(static_cast<size_t>(t.numel));
      for (float& v : tg) v = static_cast<float>(rng.Normal(1.0, 0.5));
      target.push_back(tg);
    }
  }
  std::vector<std::span<float>> Views() { return {params.begin(), params.end()}; }
  void Step(float eta) {
    for (size_t t = 0; t < params.size(); ++t)
      for (size_t i = 0; i < params[t].size(); ++i) params[t][i] -= eta * (params[t][i] - target[t][i]);
  }
};

// Runs inner steps [first, first + steps) with the agent's after-step rule in the loop, each
// taking `step_ms` on `clock`.
inline void TrainToy(ToyLearner& toy, learner::LearnerAgent& agent, int steps, int step_ms, Clock& clock,
                     int first = 0) {
  for (int s = first; s < first + steps && !agent.finish_requested(); ++s) {
    toy.Step(0.05f);
    clock.SleepFor(std::chrono::milliseconds(step_ms));
    learner::Progress p;
    p.step = s + 1;
    p.step_seconds = step_ms / 1000.0;
    agent.SetProgress(p);
    agent.AfterStep(s, 100);
  }
}

}  // namespace atl::testing
