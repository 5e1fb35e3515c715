// A toy "model" for learner tests: each learner pulls its parameters toward its own target
// (θ ← θ − η(θ − target_m)), so the global model should move toward the targets' mean. Its
// tensors are ToyTensors (plans.h).
#pragma once

#include <cmath>
#include <span>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/learner/learner_agent.h"
#include "testing/plans.h"

namespace atl::testing {

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
// taking `step_ms` on `clock` and moving the toy by `eta` toward its target (0: no progress).
inline void TrainToy(ToyLearner& toy, learner::LearnerAgent& agent, int steps, int step_ms, Clock& clock, int first = 0,
                     float eta = 0.05f) {
  for (int s = first; s < first + steps && !agent.finish_requested(); ++s) {
    toy.Step(eta);
    clock.SleepFor(std::chrono::milliseconds(step_ms));
    learner::Progress p;
    p.step = s + 1;
    p.step_seconds = step_ms / 1000.0;
    agent.SetProgress(p);
    agent.AfterStep(s, 100);
  }
}

// ‖Θ_p − (the mean of the learners' targets)_p‖: how far fragment p of a global model is from
// where averaging the toys should take it.
inline double DistanceToMeanTarget(std::span<const float> theta, const std::vector<ToyLearner*>& toys,
                                   const diloco::FragmentPlan& plan, int p) {
  std::vector<std::vector<float>> mean_t;
  for (size_t t = 0; t < toys[0]->target.size(); ++t) {
    std::vector<float> m(toys[0]->target[t].size(), 0.0f);
    for (auto* toy : toys)
      for (size_t i = 0; i < m.size(); ++i) m[i] += toy->target[t][i] / static_cast<float>(toys.size());
    mean_t.push_back(m);
  }
  std::vector<std::span<float>> views(mean_t.begin(), mean_t.end());
  std::vector<float> target(theta.size());
  exchange::GatherFragment(plan.fragments[static_cast<size_t>(p)], views, target);
  double d = 0;
  for (size_t i = 0; i < theta.size(); ++i) d += std::pow(theta[i] - target[i], 2);
  return std::sqrt(d);
}

}  // namespace atl::testing
