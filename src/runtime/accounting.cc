#include "atoll/runtime/accounting.h"

#include <algorithm>
#include <cmath>

namespace atl::runtime {
namespace {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

RunAccounting AccountGoodput(const std::vector<LearnerRecordOfRun>& learners) {
  RunAccounting run;
  run.window_start = INFINITY;
  run.window_end = -INFINITY;
  std::vector<double> step_seconds, last_t(learners.size(), -INFINITY);
  for (size_t i = 0; i < learners.size(); ++i) {
    LearnerAccounting a;
    for (const StepRecord& s : learners[i].steps) {
      a.tokens_computed += s.tokens;
      a.seconds_training += s.seconds;  // includes the throttle of slower hardware: its time
      step_seconds.push_back(s.seconds);
      run.window_start = std::min(run.window_start, s.t - s.seconds);
      run.window_end = std::max(run.window_end, s.t);
      last_t[i] = std::max(last_t[i], s.t);
    }
    const double merged = learners[i].tokens_merged;
    a.useful_seconds = a.tokens_computed > 0 ? a.seconds_training * std::min(1.0, merged / a.tokens_computed) : 0;
    a.tokens_lost = std::max(0.0, a.tokens_computed - merged);
    run.tokens_computed += a.tokens_computed;
    run.useful_seconds += a.useful_seconds;
    run.learners.push_back(a);
  }
  if (!(run.window_end > run.window_start)) {
    run.window_start = run.window_end = 0;
    return run;
  }
  for (size_t i = 0; i < learners.size(); ++i) {
    const double end = learners[i].finished && std::isfinite(last_t[i]) ? last_t[i] : run.window_end;
    run.learners[i].seconds_allocated = std::max(0.0, end - run.window_start);
    run.allocated_seconds += run.learners[i].seconds_allocated;
  }
  run.goodput = run.allocated_seconds > 0 ? run.useful_seconds / run.allocated_seconds : 0;
  run.median_step_seconds = MedianOf(step_seconds);
  return run;
}

double Uptime(const std::map<int, std::vector<double>>& round_closes, int fragments, int H, const RunAccounting& run) {
  const double span = run.window_seconds();
  if (span <= 0 || fragments < 1) return 1.0;
  const double allowance = 2.0 * H * run.median_step_seconds + 1.0;
  double down = 0;
  for (int p = 0; p < fragments; ++p) {
    auto it = round_closes.find(p);
    if (it == round_closes.end() || it->second.empty()) {
      down += span;
      continue;
    }
    std::vector<double> t = it->second;
    std::sort(t.begin(), t.end());
    double d = 0;
    for (size_t k = 1; k < t.size(); ++k) d += std::max(0.0, t[k] - t[k - 1] - allowance);
    d += std::max(0.0, run.window_end - t.back() - allowance);
    down += std::min(d, span);
  }
  return std::clamp(1.0 - down / fragments / span, 0.0, 1.0);
}

}  // namespace atl::runtime
