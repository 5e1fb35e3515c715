// The references a push is judged against (docs/decisions/016): the other learners' latest
// pushes of the fragment, the bounds on its claimed counters, and the quarantine of outliers.
#include "atoll/syncer/syncer_core.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atoll/diloco/merge.h"

namespace atl::syncer {

double UpperMedianOf(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double LowerMedianOf(std::vector<double> v) {
  const size_t k = (v.size() - 1) / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(k), v.end());
  return v[k];
}

const PushSample* LearnerRecord::SampleBefore(size_t p, TimePoint now) const {
  if (p >= samples.size()) return nullptr;
  if (samples[p].at < now) return &samples[p];
  return p < earlier_samples.size() ? &earlier_samples[p] : nullptr;
}

double LearnerRecord::TokensPerStepBefore(TimePoint now) const {
  return tokens_per_step_at < now ? tokens_per_step : tokens_per_step_before;
}

double LearnerRecord::StepRateBefore(size_t p, TimePoint now) const {
  if (p >= allowances.size()) return 0;
  return allowances[p].since < now ? allowances[p].rate : allowances[p].rate_before;
}

void SyncerCore::RecordSample(LearnerRecord& l, int p, PushSample sample, int64_t version, TimePoint now) const {
  const size_t n = fragments_.size();
  l.samples.resize(n);
  l.earlier_samples.resize(n);
  PushSample& latest = l.samples[static_cast<size_t>(p)];
  if (latest.at < now) l.earlier_samples[static_cast<size_t>(p)] = latest;
  if (version >= 0) {  // zero pushes never lower anyone's reference; they only count for nothing
    sample.version = version;
    latest = std::move(sample);
  } else {
    latest.influence = 0;
  }
  latest.at = now;
}

bool SyncerCore::IsReference(const LearnerRecord& l, int p, TimePoint now) const {
  // A live learner's latest push counts however many rounds others closed since (a flood of
  // rounds must not age the honest references out); a departed learner's for the window.
  const PushSample* s = l.SampleBefore(static_cast<size_t>(p), now);
  if (s == nullptr) return false;
  const bool live = l.state != LearnerState::kDone && now - l.last_seen <= FromSeconds(options_.learner_timeout_s);
  return s->version >= 0 &&
         (live || s->version >= fragments_[static_cast<size_t>(p)].version - options_.quarantine_window);
}

SyncerCore::RobustRefs SyncerCore::RefsFor(int p, int id, TimePoint now) const {
  std::vector<double> sizes, steps, tps, weights;
  for (const auto& [other, l] : learners_) {
    if (other == id || !IsReference(l, p, now)) continue;
    const PushSample& s = *l.SampleBefore(static_cast<size_t>(p), now);
    sizes.push_back(s.size);
    steps.push_back(s.steps);
    tps.push_back(s.tokens_per_step);
    weights.push_back(s.weight);
  }
  RobustRefs r;
  if (static_cast<int>(sizes.size()) < std::max(1, options_.quarantine_min_learners)) return r;
  r.others = static_cast<int>(sizes.size());
  r.size = UpperMedianOf(sizes);
  r.size_low = LowerMedianOf(sizes);
  r.steps = UpperMedianOf(steps);
  r.tokens_per_step = UpperMedianOf(tps);
  r.weight = UpperMedianOf(weights);
  return r;
}

SyncerCore::FleetRefs SyncerCore::FleetRefsFor(int id, int p, TimePoint now) const {
  // Every other learner that has a rate, live or not: a departed honest learner's rates stay what
  // an honest learner does, and one learner's own values never count for it.
  std::vector<double> tps, rates;
  for (const auto& [other, l] : learners_) {
    if (other == id) continue;
    if (l.TokensPerStepBefore(now) > 0) tps.push_back(l.TokensPerStepBefore(now));
    if (p >= 0 && l.StepRateBefore(static_cast<size_t>(p), now) > 0)
      rates.push_back(l.StepRateBefore(static_cast<size_t>(p), now));
  }
  const auto enough = [&](const std::vector<double>& v) {
    return !v.empty() && static_cast<int>(v.size()) >= std::max(1, options_.quarantine_min_learners);
  };
  FleetRefs r;
  if (enough(tps)) r.tokens_per_step = UpperMedianOf(tps);
  if (enough(rates)) r.step_rate = UpperMedianOf(rates);
  return r;
}

void SyncerCore::UpdatePace(LearnerRecord& l, const LearnerProgress& progress, TimePoint now) {
  constexpr double kWindowSeconds = 2.0;
  LearnerRecord::Pace& pace = l.pace;
  if (progress.step < pace.latest_step) std::fill(l.paced_steps.begin(), l.paced_steps.end(), 0.0);  // a new process
  pace.latest_step = progress.step;
  pace.latest_at = now;
  if (pace.step < 0 || progress.step < pace.step || progress.tokens < pace.tokens) {
    pace.at = now;  // its first heartbeat, or a restarted process: a new window starts here
    pace.step = progress.step;
    pace.tokens = progress.tokens;
    return;
  }
  const double dt = ToSeconds(now - pace.at);
  if (dt < kWindowSeconds) return;
  const int64_t steps = progress.step - pace.step;
  if (steps > 0) {  // a window without steps (a barrier, a pause) says nothing of its pace
    pace.step_rate = Ema(pace.step_rate, static_cast<double>(steps) / dt);
    pace.tokens_per_step = Ema(pace.tokens_per_step, static_cast<double>(progress.tokens - pace.tokens) / steps);
  }
  pace.at = now;
  pace.step = progress.step;
  pace.tokens = progress.tokens;
}

void SyncerCore::BoundTokensPerStep(double reference, double own, Contribution& c, std::string& note) const {
  // The tokens it is credited with: at most max_tokens_per_step_factor × the others' rate per step,
  // and pace_slack × its own as its heartbeats measured it.
  double max_tps = std::numeric_limits<double>::infinity();
  if (reference > 0 && options_.max_tokens_per_step_factor > 0)
    max_tps = options_.max_tokens_per_step_factor * reference;
  if (own > 0 && options_.pace_slack > 0) max_tps = std::min(max_tps, options_.pace_slack * own);
  if (!std::isfinite(max_tps) || c.c_steps <= 0) return;
  if (static_cast<double>(c.c_tokens) <= max_tps * static_cast<double>(c.c_steps)) return;
  const auto tokens = static_cast<int64_t>(std::floor(max_tps * static_cast<double>(c.c_steps)));
  note += fmt::format("; c_tokens {} bounded to {}", c.c_tokens, tokens);
  c.c_tokens = tokens;
}

double SyncerCore::PacedStepsLeft(const LearnerRecord& l, int p, TimePoint now) const {
  const LearnerRecord::Pace& pace = l.pace;
  // Until a first window measured its pace, the steps since its latest heartbeat are unknown.
  if (!(options_.pace_slack > 0) || pace.latest_step < 0 || !(pace.step_rate > 0)) {
    return std::numeric_limits<double>::infinity();
  }
  const double counted =
      static_cast<double>(pace.latest_step) + pace.step_rate * std::max(0.0, ToSeconds(now - pace.latest_at));
  const double credited = l.paced_steps.size() > static_cast<size_t>(p) ? l.paced_steps[static_cast<size_t>(p)] : 0.0;
  return options_.pace_slack * counted + options_.H - credited;
}

void SyncerCore::ReleaseHeldCredit(LearnerRecord& l, TimePoint now) const {
  for (size_t p = 0; p < std::min(l.held.size(), fragments_.size()); ++p) {
    LearnerRecord::Held& h = l.held[p];
    if (!(h.steps > 0)) continue;
    const double left = PacedStepsLeft(l, static_cast<int>(p), now);
    if (!std::isfinite(left) || !(left > 0)) continue;  // its pace unmeasured, or nothing counted yet
    const double steps = std::min(h.steps, std::floor(left));
    if (!(steps > 0)) continue;
    const double tokens = h.tokens * steps / h.steps;
    l.tokens_merged += tokens / plan_.num_fragments();
    l.paced_steps.resize(fragments_.size(), 0.0);
    l.paced_steps[p] += steps;
    h.steps -= steps;
    h.tokens -= tokens;
  }
}

StepAllowance SyncerCore::CreditSteps(const FleetRefs& fleet, double own_rate, double paced_left,
                                      const StepAllowance& a, Contribution& c, TimePoint now, std::string& note) const {
  // The steps the time since the previous push allows at max_step_rate_factor × the others' rate
  // (and pace_slack × its own while its heartbeats have counted no steps), plus what earlier
  // pushes left unused (H in hand from the first join); at most what its own heartbeats allow.
  // Without a rate: max_steps_factor × H per push.
  double allowed = options_.max_steps_factor > 0 ? std::max(1.0, options_.max_steps_factor * options_.H)
                                                 : std::numeric_limits<double>::infinity();
  double rate = std::numeric_limits<double>::infinity();
  if (fleet.step_rate > 0 && options_.max_step_rate_factor > 0) rate = options_.max_step_rate_factor * fleet.step_rate;
  const bool counted = std::isfinite(paced_left);
  if (!counted && own_rate > 0 && options_.pace_slack > 0) rate = std::min(rate, options_.pace_slack * own_rate);
  const bool timed = std::isfinite(rate);
  if (timed) allowed = a.carried + rate * std::max(0.0, ToSeconds(now - a.since));
  const bool by_pace = counted && paced_left < allowed;
  const double credit = by_pace ? std::max(0.0, paced_left) : allowed;
  if (static_cast<double>(c.c_steps) > credit) {
    const auto tokens_of = [&c](int64_t steps) {
      return static_cast<int64_t>(
          std::floor(static_cast<double>(c.c_tokens) * static_cast<double>(steps) / static_cast<double>(c.c_steps)));
    };
    const auto steps = static_cast<int64_t>(std::floor(credit));
    const int64_t tokens = tokens_of(steps);
    std::string held;
    if (by_pace) {
      // What the time allows beyond what its heartbeats counted is held, not dropped: a heartbeat
      // can lag the learner's pushes by seconds (LearnerRecord::held).
      const auto timely = static_cast<int64_t>(std::floor(std::min(static_cast<double>(c.c_steps), allowed)));
      c.held_steps = static_cast<double>(std::max<int64_t>(0, timely - steps));
      c.held_tokens = static_cast<double>(std::max<int64_t>(0, tokens_of(timely) - tokens));
      held = fmt::format(" (the other {:.0f} held until they do)", c.held_steps);
    }
    note += fmt::format("; credited {} of its {} claimed steps ({} tokens){}{}", steps, c.c_steps, tokens,
                        by_pace ? ": its heartbeats counted no more"
                        : timed ? ": the time since its previous push allows no more"
                                : "",
                        held);
    c.c_steps = steps;
    c.c_tokens = tokens;
  }
  // What it may count in its round's share: at the others' step rate itself (a learner faster than
  // the others' upper median moves Θ as often as they do), or one push's worth without a rate.
  const auto H = static_cast<double>(options_.H);
  const auto steps = static_cast<double>(c.c_steps);
  StepAllowance left{now, 0.0, a.rate, 0.0};
  // What it did not use stays its own: the bound is on the steps credited since its first join
  // (at the rates as they stood), not per push — an honest learner that speeds up (others finish
  // and free their cores) spends what its slower pushes left, an attacker gains nothing by waiting.
  // A push no rate could judge yet leaves what was in hand for the next.
  left.carried = timed ? allowed - steps : a.carried;
  if (!(fleet.step_rate > 0)) {
    c.share_steps = std::min(steps, H);
    return left;
  }
  const double share_allowed = a.share_carried + fleet.step_rate * std::max(0.0, ToSeconds(now - a.since));
  c.share_steps = std::min(steps, share_allowed);
  left.share_carried = std::min(share_allowed - c.share_steps, H);
  return left;
}

SyncerCore::Credit SyncerCore::BoundCounters(const RobustRefs& refs, const FleetRefs& fleet, const LearnerRecord& l,
                                             int p, Contribution& c, TimePoint now, std::string& note) const {
  const double tps_ref = refs.others > 0 ? refs.tokens_per_step : fleet.tokens_per_step;
  c.judged = tps_ref > 0 || l.pace.tokens_per_step > 0;
  BoundTokensPerStep(tps_ref, l.pace.tokens_per_step, c, note);
  const int64_t claimed_steps = c.c_steps;
  Credit credit;
  const StepAllowance a =
      static_cast<int>(l.allowances.size()) > p ? l.allowances[static_cast<size_t>(p)] : StepAllowance{};
  credit.allowance = CreditSteps(fleet, l.pace.step_rate, PacedStepsLeft(l, p, now), a, c, now, note);
  const double dt = ToSeconds(now - a.since);
  if (dt > 1e-3 && c.c_steps > 0) {
    double rate = static_cast<double>(c.c_steps) / dt;
    if (fleet.step_rate > 0 && options_.max_step_rate_factor > 0) {
      rate = std::min(rate, options_.max_step_rate_factor * fleet.step_rate);
    }
    credit.allowance.rate = Ema(a.rate, rate);
  }
  // The steps its size is divided by and its weight computed with: at most max_steps_factor × the
  // others' (or × H). Its size counts the steps it claims within that bound (a push credited with
  // fewer steps after a restart is not quarantined for it); its weight the steps it is credited with.
  const double step_ref = refs.others > 0 ? refs.steps : static_cast<double>(options_.H);
  int64_t size_steps = claimed_steps;
  if (options_.max_steps_factor > 0) {
    const auto max_steps = static_cast<int64_t>(std::max(1.0, std::floor(options_.max_steps_factor * step_ref)));
    if (size_steps > max_steps) {
      note += fmt::format("; c_steps {} counted as {} for its size", size_steps, max_steps);
      size_steps = max_steps;
    }
  }
  double weight = rule_->Weight(c.c_tokens, c.c_steps);
  if (refs.others > 0 && options_.max_weight_factor > 0 && weight > options_.max_weight_factor * refs.weight) {
    weight = options_.max_weight_factor * refs.weight;
    note += fmt::format("; merge weight bounded to {:.4g}", weight);
  }
  c.max_weight = weight;
  PushSample& sample = credit.sample;
  sample.size = c.delta_norm / std::sqrt(static_cast<double>(std::max<int64_t>(1, size_steps)));
  sample.steps = static_cast<double>(std::min(size_steps, std::max<int64_t>(c.c_steps, 1)));
  sample.tokens_per_step = c.c_steps > 0 ? static_cast<double>(c.c_tokens) / static_cast<double>(c.c_steps) : 0.0;
  sample.weight = weight;
  return credit;
}

void SyncerCore::JudgeLateCounters(FragmentState& f) const {
  for (Contribution& c : f.pending) {
    if (c.judged) continue;
    const double tps_ref = FleetRefsFor(c.learner, -1, TimePoint::max()).tokens_per_step;
    if (!(tps_ref > 0)) continue;  // still nothing to judge it by (a run of one or two learners)
    std::string note;
    BoundTokensPerStep(tps_ref, 0, c, note);
    c.max_weight = std::min(c.max_weight, rule_->Weight(c.c_tokens, c.c_steps));
    c.judged = true;
  }
}

void SyncerCore::SettleUnjudgedCredit() {
  for (auto& [id, l] : learners_) {
    if (!(l.unjudged_steps > 0)) continue;
    double max_tps = std::numeric_limits<double>::infinity();
    const double tps_ref = FleetRefsFor(id, -1, TimePoint::max()).tokens_per_step;
    if (tps_ref > 0 && options_.max_tokens_per_step_factor > 0) max_tps = options_.max_tokens_per_step_factor * tps_ref;
    if (l.pace.tokens_per_step > 0 && options_.pace_slack > 0) {
      max_tps = std::min(max_tps, options_.pace_slack * l.pace.tokens_per_step);
    }
    if (!std::isfinite(max_tps)) continue;  // nothing to judge by yet
    l.tokens_merged -= std::max(0.0, l.unjudged_tokens - max_tps * l.unjudged_steps);
    l.unjudged_tokens = l.unjudged_steps = 0;
  }
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
    reference = UpperMedianOf(f.recent_norms);
    of = "the recent median";
  }
  if (size <= options_.quarantine_factor * reference) return Status::Ok();
  return InvalidArgumentError(
      fmt::format("quarantined: outer-gradient size {:.4g} (norm/sqrt(steps)) is {:.1f}x {} {:.4g} (limit {:.1f}x)",
                  size, size / std::max(reference, 1e-30), of, reference, options_.quarantine_factor));
}

}  // namespace atl::syncer
