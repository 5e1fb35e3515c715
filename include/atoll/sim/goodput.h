// Goodput simulator: how much useful work a fleet does under failures, for four ways of training.
//
// All modes replay the same FailureTrace (same seed → same trace → same result):
//   data-parallel          no elasticity: the job holds a fixed number of slices and the rest of
//                          the fleet is its pool of spares (sized to cover the slices in repair,
//                          see SpareSlices). A failure of a job slice stalls the whole job for
//                          restart_s while a healthy spare takes its place (if none is healthy,
//                          the job waits for a repair first). Optionally the work since the last
//                          checkpoint (every checkpoint_s of progress) is lost.
//   elastic-data-parallel  a failure costs a global pause of shrink_s, the job runs on the
//                          healthy slices, and a slice's return costs a global pause of grow_s.
//   sync-diloco            M learners, each an elastic island of N/M chips (slices dealt
//                          round-robin); every H·step_s of training they meet at a barrier
//                          (plus barrier_s), and the barrier waits for the slowest learner.
//   decoupled-diloco       M elastic learners that never wait; the global model advances while
//                          at least K learners are training.
// A failure (or return) while a restart or pause is already under way does not start it again:
// the one in progress takes the slice in once the failure is detected, so the pause ends at
// max(current end, t + min(detect_s, pause)). detect_s >= every pause is the older model in which
// each failure starts its restart again (pause ends max(current end, t + pause)).
// goodput = useful chip-seconds / (chips × duration); uptime = share of time the global model
// advances (DP: running; elastic: not paused; sync DiLoCo: all M learners training; Decoupled:
// ≥ K learners training). See docs/sim.md for the model and the reasoning behind each default.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/sim/fleet.h"

namespace atl::sim {

inline constexpr double kSecondsPerYear = 365.25 * 86400.0;

// Defaults are documented, with their sources, in docs/sim.md. restart_s, shrink_s + grow_s and
// slice_chips × repair_hours are the three values calibrated to the paper's 1.2 M-chip row
// (27/58/88 %); its 300 k and 2.4 M rows are predictions.
struct GoodputParams {
  int64_t chips = 1'200'000;
  int64_t slice_chips = 256;  // one model replica: the failure and repair unit
  double mtbi_years = 1.0;    // per chip
  double repair_hours = 2.0;  // mean time a failed slice is out
  RepairDist repair_dist = RepairDist::kFixed;
  double repair_sigma = 1.0;
  double restart_s = 70.0;    // non-elastic restart
  double detect_s = 5.0;      // failure detection: what a failure during a restart/pause adds
  int64_t spare_slices = -1;  // non-elastic spare pool; -1: auto (see SpareSlices)
  double checkpoint_s = 0.0;  // 0: state survives every step (no work lost beyond the restart)
  double shrink_s = 12.0;     // elastic pause on a failure
  double grow_s = 4.0;        // elastic pause when a slice returns
  double step_s = 1.0;
  int64_t inner_steps = 24;  // H
  double barrier_s = 0.0;    // sync DiLoCo outer all-reduce time per barrier
  int learners = 8;          // M
  int quorum = 1;            // K
  double days = 3.0;
  int seeds = 5;
  uint64_t seed = 1;
};

Status ValidateGoodput(const GoodputParams& p);
FleetSpec ToFleetSpec(const GoodputParams& p);

// Spare slices the non-elastic job keeps: p.spare_slices if >= 0, else the stationary mean of
// slices in repair plus three standard deviations (binomial), rounded up, at most slices − 1.
int64_t SpareSlices(const GoodputParams& p);

// The training modes the fleet model compares (diloco::Mode is a run's mode).
enum class FleetMode { kDataParallel, kElasticDataParallel, kSyncDiloco, kDecoupledDiloco };
inline constexpr FleetMode kAllFleetModes[] = {FleetMode::kDataParallel, FleetMode::kElasticDataParallel,
                                               FleetMode::kSyncDiloco, FleetMode::kDecoupledDiloco};
std::string_view FleetModeName(FleetMode m);
int ModeLearners(FleetMode m, const GoodputParams& p);  // 1 for the data-parallel modes

struct RunResult {
  double goodput = 0;
  double uptime = 0;
  int64_t failures = 0;
};

// Simulates one mode over one trace (p must be valid and match the trace's fleet).
RunResult SimulateMode(FleetMode mode, const GoodputParams& p, const FailureTrace& trace);

// Closed-form long-run values. Data-parallel: exact for the model given the stationary failure
// rate (a pause of length P with events at rate r and detection δ = min(detect_s, P) lasts
// P − δ + (e^{rδ} − 1)/r on average; uptime 1/(1 + r·that)). Elastic and Decoupled: assume a learner's pause state and its down slices are
// independent (good when a learner has many slices). Sync DiLoCo: none (available = false).
struct Oracle {
  bool available = false;
  double goodput = 0;
  double uptime = 0;
};
Oracle ClosedForm(FleetMode mode, const GoodputParams& p);

// Mean length of a pause (restart) of `pause_s` that events arriving at `rate` per second extend
// to at least min(detect_s, pause_s) after each of them: pause − δ + (e^{rate·δ} − 1)/rate.
double MeanPauseEpisode(double pause_s, double detect_s, double rate);

struct ModeSummary {
  FleetMode mode = FleetMode::kDataParallel;
  int learners = 1;
  int64_t chips = 0;
  double goodput = 0, goodput_ci95 = 0;  // mean over seeds, half-width of the 95 % CI
  double uptime = 0, uptime_ci95 = 0;
  double failures = 0;  // mean per run
  Oracle oracle;
  std::vector<RunResult> runs;  // one per seed
};

// Runs every mode in `modes` over `p.seeds` traces. InvalidArgument for bad parameters.
StatusOr<std::vector<ModeSummary>> RunGoodput(const GoodputParams& p,
                                              const std::vector<FleetMode>& modes = {std::begin(kAllFleetModes),
                                                                                     std::end(kAllFleetModes)});

// Mean and 95 % confidence half-width (Student t) of xs; half-width 0 for fewer than 2 values.
struct MeanCi {
  double mean = 0;
  double half_width = 0;
};
MeanCi MeanCi95(const std::vector<double>& xs);

// Presentation: the human table and the machine JSON (an array, one object per mode).
std::string FormatGoodputTable(const GoodputParams& p, const std::vector<ModeSummary>& s);
std::string GoodputJson(const GoodputParams& p, const std::vector<ModeSummary>& s);

// goodput vs chips for every mode (and uptime in a second panel), as an SVG document.
// Sweeps chips log-spaced from the smallest fleet that holds M slices up to p.chips (at least
// 12 points); each point runs p.seeds seeds of p.days.
StatusOr<std::string> GoodputSweepSvg(const GoodputParams& p);

}  // namespace atl::sim
