// The syncer's round policy for one fragment, as a pure function:
//   Decide(now, round state, estimates, options) → decision + reason.
// No clocks, threads or sockets: the syncer's event loop calls it whenever something changes
// (a contribution arrives, a deadline passes) and the tests drive it with a manual clock.
//
// A round of fragment p:
//   1. waits until at least K learners have contributed (the minimum quorum);
//   2. then waits an adaptive grace window for more:
//        grace = clamp(γ · (τ·t_step − t_quorum − t_sync), 0, cap)
//      t_step: the learners' inner-step time (EMA), t_quorum: time from the round's first
//      contribution to quorum, t_sync: the time to merge and publish (EMA). It only spends slack
//      the τ-step overlap already hides, so it costs no goodput;
//   3. closes early when every live learner has contributed.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "atoll/core/clock.h"

namespace atl::syncer {

struct RoundOptions {
  int quorum = 1;            // K ≥ 1
  bool grace = true;         // adaptive grace window on/off
  double gamma = 0.5;        // γ ∈ [0, 1]
  double grace_cap_s = 5.0;  // upper clamp of the window, seconds
  int tau = 2;               // overlap in inner steps
};

struct RoundEstimates {
  double step_seconds = 0;  // t_step (EMA over learners' heartbeats)
  double sync_seconds = 0;  // t_sync (EMA of merge + publish)
};

struct RoundView {
  std::optional<TimePoint> opened_at;  // first contribution of this round
  std::optional<TimePoint> quorum_at;  // when the K-th contribution arrived
  std::vector<int> contributors;       // learner ids with a contribution in this round
  std::vector<int> live;               // learners currently alive (heartbeat within timeout)
};

enum class RoundAction { kWait, kClose };

struct RoundDecision {
  RoundAction action = RoundAction::kWait;
  std::optional<TimePoint> wake_at;  // when to call Decide again (grace deadline), if waiting
  double grace_seconds = 0;          // the window computed for this round (0 before quorum)
  std::vector<int> missing;          // live learners not (yet) in the round
  std::string reason;
};

// grace = clamp(γ·(τ·t_step − t_quorum − t_sync), 0, cap); 0 when grace is off.
double GraceSeconds(const RoundOptions& options, const RoundEstimates& estimates, double quorum_seconds);

RoundDecision DecideRound(TimePoint now, const RoundView& round, const RoundEstimates& estimates,
                          const RoundOptions& options);

}  // namespace atl::syncer
