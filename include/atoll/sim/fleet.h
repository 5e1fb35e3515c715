// Fleet failure traces: when each slice of a fleet fails and when it comes back from repair.
//
// The fleet is N chips grouped into slices of S chips (the last one may be smaller); a slice is
// the unit of failure and repair (one chip failing takes its slice down). Each chip fails as a
// Poisson process with mean time between interruptions MTBI, so a healthy slice of c chips fails
// at rate c/MTBI and the healthy fleet as a whole at rate (healthy chips)/MTBI. A failed slice
// returns after a repair time (fixed, exponential or log-normal, all with the same mean).
//
// GenerateTrace draws the trace event by event from the aggregate Poisson process (one
// exponential draw per event, victim chosen in proportion to its chips), so its cost grows with
// failures + repairs, not with chips × time. The fleet starts in its stationary state: each
// slice is down with probability repair/(MTBI/c + repair), with a residual repair time drawn
// from the equilibrium (length-biased) distribution; there is no warm-up transient.
// Every training mode replays the same trace, so the modes are compared on identical failures.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"

namespace atl::sim {

enum class RepairDist { kFixed, kExponential, kLogNormal };
inline constexpr EnumNames<RepairDist, 4> kRepairDistNames{"repair distribution",
                                                           {{{RepairDist::kFixed, "fixed"},
                                                             {RepairDist::kExponential, "exp"},
                                                             {RepairDist::kExponential, "exponential"},
                                                             {RepairDist::kLogNormal, "lognormal"}}}};
constexpr const auto& NamesOf(RepairDist) { return kRepairDistNames; }
inline std::string_view RepairDistName(RepairDist d) { return kRepairDistNames.Name(d); }
inline StatusOr<RepairDist> ParseRepairDist(std::string_view name) { return kRepairDistNames.Parse(name); }

struct FleetSpec {
  int64_t chips = 0;
  int64_t slice_chips = 0;
  double mtbi_s = 0;         // per chip, seconds
  double repair_mean_s = 0;  // seconds; 0 means a failed slice returns at once
  RepairDist repair_dist = RepairDist::kFixed;
  double repair_sigma = 1.0;  // log-normal only: sigma of the underlying normal
  double duration_s = 0;
};

Status ValidateFleet(const FleetSpec& spec);

// Sizes of the slices, in order: all slice_chips except possibly a smaller last one.
std::vector<int64_t> SliceSizes(const FleetSpec& spec);

struct SliceEvent {
  double time = 0;
  int32_t slice = 0;
  bool up = false;  // false: the slice failed; true: it returned from repair
};

struct FailureTrace {
  std::vector<int64_t> slice_chips;
  std::vector<uint8_t> down_at_start;  // 1 if the slice is in repair at t = 0
  std::vector<SliceEvent> events;      // in time order, all within [0, duration_s]
  double duration_s = 0;
  int64_t failures = 0;  // number of !up events
  int64_t chips() const;
};

// Draws a trace for spec (which must be valid) with the given seed.
FailureTrace GenerateTrace(const FleetSpec& spec, uint64_t seed);

// Long-run (stationary) properties of the alternating up/repair process, from renewal theory:
// each slice alternates Exp(MTBI/c) up and a repair of the given mean.
double StationarySliceFailureRate(const FleetSpec& spec);  // failures per second, whole fleet
double StationaryDownFraction(const FleetSpec& spec);      // share of chips in repair

}  // namespace atl::sim
