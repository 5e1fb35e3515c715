#include "atoll/syncer/round_policy.h"

#include <algorithm>
#include <cstdio>

namespace atl::syncer {
namespace {

std::string Ids(const std::vector<int>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::string Secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3fs", s);
  return buf;
}

}  // namespace

double GraceSeconds(const RoundOptions& options, const RoundEstimates& estimates, double quorum_seconds) {
  if (!options.grace) return 0.0;
  double slack = options.tau * estimates.step_seconds - quorum_seconds - estimates.sync_seconds;
  return std::clamp(options.gamma * slack, 0.0, options.grace_cap_s);
}

RoundDecision DecideRound(TimePoint now, const RoundView& round, const RoundEstimates& estimates,
                          const RoundOptions& options) {
  RoundDecision d;
  for (int id : round.live) {
    if (std::find(round.contributors.begin(), round.contributors.end(), id) == round.contributors.end()) {
      d.missing.push_back(id);
    }
  }
  const int have = static_cast<int>(round.contributors.size());
  if (have < options.quorum || !round.quorum_at) {
    d.reason = "waiting for quorum: " + std::to_string(have) + "/" + std::to_string(options.quorum);
    return d;
  }
  const double t_quorum = round.opened_at ? ToSeconds(*round.quorum_at - *round.opened_at) : 0.0;
  d.grace_seconds = GraceSeconds(options, estimates, t_quorum);
  if (d.missing.empty()) {
    d.action = RoundAction::kClose;
    d.reason = "all " + std::to_string(have) + " live learners reported " + Ids(round.contributors);
    return d;
  }
  const TimePoint deadline = *round.quorum_at + FromSeconds(d.grace_seconds);
  if (now >= deadline) {
    d.action = RoundAction::kClose;
    d.reason = "quorum " + std::to_string(have) + "/" + std::to_string(options.quorum) + " " + Ids(round.contributors) +
               ", grace " + Secs(d.grace_seconds) + (options.grace ? " expired" : " off") + ", late " + Ids(d.missing);
    return d;
  }
  d.wake_at = deadline;
  d.reason = "quorum reached, in grace window of " + Secs(d.grace_seconds) + ", waiting for " + Ids(d.missing);
  return d;
}

}  // namespace atl::syncer
