// The references a push is judged against (docs/decisions/016): the other learners' latest
// pushes of the fragment, the bounds on its claimed counters, and the quarantine of outliers.
#include "atoll/syncer/syncer_core.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atoll/diloco/merge.h"

namespace atl::syncer {

namespace {

// The upper median (the larger middle value of an even count): one value of k ≥ 2 that is
// lowered to zero never lowers it below the others' middle.
double UpperMedian(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

SyncerCore::RobustRefs SyncerCore::RefsFor(int p, int id, TimePoint now) const {
  // A live learner's latest push counts however many rounds others closed since (a flood of
  // rounds must not age the honest references out); a departed learner's for the window.
  const int64_t oldest = fragments_[static_cast<size_t>(p)].version - options_.quarantine_window;
  const Duration timeout = FromSeconds(options_.learner_timeout_s);
  std::vector<double> sizes, steps, tps, weights;
  for (const auto& [other, l] : learners_) {
    if (other == id || static_cast<int>(l.samples.size()) <= p) continue;
    const PushSample& s = l.samples[static_cast<size_t>(p)];
    const bool live = l.state != LearnerState::kDone && now - l.last_seen <= timeout;
    if (s.version < 0 || (!live && s.version < oldest)) continue;
    sizes.push_back(s.size);
    steps.push_back(s.steps);
    tps.push_back(s.tokens_per_step);
    weights.push_back(s.weight);
  }
  RobustRefs r;
  if (static_cast<int>(sizes.size()) < std::max(1, options_.quarantine_min_learners)) return r;
  r.others = static_cast<int>(sizes.size());
  r.size = UpperMedian(sizes);
  r.steps = UpperMedian(steps);
  r.tokens_per_step = UpperMedian(tps);
  r.weight = UpperMedian(weights);
  return r;
}

PushSample SyncerCore::BoundCounters(const RobustRefs& refs, Contribution& c, std::string& note) const {
  // The tokens it is credited with: at most max_tokens_per_step_factor × the others' rate per step.
  if (refs.others > 0 && options_.max_tokens_per_step_factor > 0 && c.c_steps > 0) {
    const double max_tps = options_.max_tokens_per_step_factor * refs.tokens_per_step;
    if (static_cast<double>(c.c_tokens) > max_tps * static_cast<double>(c.c_steps)) {
      const auto tokens = static_cast<int64_t>(std::floor(max_tps * static_cast<double>(c.c_steps)));
      note += fmt::format("; c_tokens {} bounded to {}", c.c_tokens, tokens);
      c.c_tokens = tokens;
    }
  }
  // The steps its size is divided by and its weight computed with: at most max_steps_factor × the
  // others' (or × H). A learner back from an outage honestly claims many; its credited tokens stay.
  int64_t steps = c.c_steps;
  const double step_ref = refs.others > 0 ? refs.steps : static_cast<double>(options_.H);
  if (options_.max_steps_factor > 0) {
    const auto max_steps = static_cast<int64_t>(std::max(1.0, std::floor(options_.max_steps_factor * step_ref)));
    if (steps > max_steps) {
      note += fmt::format("; c_steps {} counted as {} for its size and weight", steps, max_steps);
      steps = max_steps;
    }
  }
  const double tokens_at_steps =
      c.c_steps > 0 ? static_cast<double>(c.c_tokens) * static_cast<double>(steps) / static_cast<double>(c.c_steps) : 0;
  double weight =
      diloco::ContributionWeight(options_.weight_rule, static_cast<int64_t>(std::floor(tokens_at_steps)), steps);
  if (refs.others > 0 && options_.max_weight_factor > 0 && weight > options_.max_weight_factor * refs.weight) {
    weight = options_.max_weight_factor * refs.weight;
    note += fmt::format("; merge weight bounded to {:.4g}", weight);
  }
  c.max_weight = weight;
  PushSample sample;
  sample.size = c.delta_norm / std::sqrt(static_cast<double>(std::max<int64_t>(1, steps)));
  sample.steps = static_cast<double>(steps);
  sample.tokens_per_step = c.c_steps > 0 ? static_cast<double>(c.c_tokens) / static_cast<double>(c.c_steps) : 0.0;
  sample.weight = weight;
  return sample;
}

Status SyncerCore::CheckQuarantine(const FragmentState& f, double size, const RobustRefs& refs) const {
  if (!rule_->Quarantines() || options_.quarantine_factor <= 0 || size <= 1e-12) return Status::Ok();
  // A fragment's first versions are not judged: in the learning-rate warm-up an honest size grows
  // many-fold between a learner's first push and its next (the version is persisted: a restarted
  // syncer judges at once).
  if (f.version < options_.quarantine_min_history) return Status::Ok();
  double reference = refs.size;
  const char* of = "the upper median of the other learners' latest sizes";
  if (refs.others == 0) {
    if (f.recent_norms.empty() || static_cast<int>(f.recent_norms.size()) < options_.quarantine_min_history) {
      return Status::Ok();
    }
    reference = UpperMedian(f.recent_norms);
    of = "the recent median";
  }
  if (size <= options_.quarantine_factor * reference) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("quarantined: outer-gradient size {:.4g} (norm/sqrt(steps)) is {:.1f}x {} {:.4g} (limit {:.1f}x)",
                  size, size / std::max(reference, 1e-30), of, reference, options_.quarantine_factor));
}

}  // namespace atl::syncer
