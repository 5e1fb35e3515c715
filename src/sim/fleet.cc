#include "atoll/sim/fleet.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "atoll/core/rng.h"
#include "atoll/sim/event_queue.h"

namespace atl::sim {

Status ValidateFleet(const FleetSpec& s) {
  if (s.chips <= 0) return InvalidArgumentError("chips must be > 0");
  if (s.slice_chips <= 0) return InvalidArgumentError("slice size must be > 0 chips");
  if (s.slice_chips > s.chips)
    return InvalidArgumentError("slice size (" + std::to_string(s.slice_chips) + ") exceeds the fleet (" +
                                std::to_string(s.chips) + " chips)");
  if ((s.chips + s.slice_chips - 1) / s.slice_chips > std::numeric_limits<int32_t>::max())
    return InvalidArgumentError("too many slices");
  if (!(s.mtbi_s > 0) || !std::isfinite(s.mtbi_s)) return InvalidArgumentError("MTBI must be > 0");
  if (!(s.repair_mean_s >= 0) || !std::isfinite(s.repair_mean_s))
    return InvalidArgumentError("repair time must be >= 0");
  if (!(s.repair_sigma >= 0)) return InvalidArgumentError("repair sigma must be >= 0");
  if (!(s.duration_s > 0) || !std::isfinite(s.duration_s))
    return InvalidArgumentError("simulated duration must be > 0");
  return Status::Ok();
}

std::vector<int64_t> SliceSizes(const FleetSpec& s) {
  std::vector<int64_t> sizes(static_cast<size_t>(s.chips / s.slice_chips), s.slice_chips);
  if (s.chips % s.slice_chips != 0) sizes.push_back(s.chips % s.slice_chips);
  return sizes;
}

int64_t FailureTrace::chips() const {
  int64_t n = 0;
  for (int64_t c : slice_chips) n += c;
  return n;
}

namespace {

double DrawRepair(const FleetSpec& s, Rng& rng) {
  if (s.repair_mean_s == 0) return 0;
  switch (s.repair_dist) {
    case RepairDist::kFixed: return s.repair_mean_s;
    case RepairDist::kExponential: return rng.Exponential(s.repair_mean_s);
    case RepairDist::kLogNormal: {
      // Parameterised by its mean so that every distribution keeps the same down fraction.
      const double median = s.repair_mean_s * std::exp(-0.5 * s.repair_sigma * s.repair_sigma);
      return rng.LogNormal(median, s.repair_sigma);
    }
  }
  return s.repair_mean_s;
}

// Remaining repair time of a slice found in repair at a random instant: the length-biased repair
// time times a uniform fraction. Length-biased fixed = fixed; exponential = exponential
// (memoryless); log-normal(median m, σ) = log-normal(m·e^{σ²}, σ).
double DrawResidualRepair(const FleetSpec& s, Rng& rng) {
  if (s.repair_mean_s == 0) return 0;
  switch (s.repair_dist) {
    case RepairDist::kFixed: return rng.Uniform() * s.repair_mean_s;
    case RepairDist::kExponential: return rng.Exponential(s.repair_mean_s);
    case RepairDist::kLogNormal: {
      const double sig2 = s.repair_sigma * s.repair_sigma;
      const double median = s.repair_mean_s * std::exp(-0.5 * sig2);
      return rng.Uniform() * rng.LogNormal(median * std::exp(sig2), s.repair_sigma);
    }
  }
  return 0;
}

constexpr int kReturn = 1;

// The fleet while a trace is drawn: which slices are up, and the repairs in progress.
struct FleetState {
  // healthy: ids of the slices that are up, in no particular order (swap-remove).
  std::vector<int32_t> healthy;
  int64_t healthy_chips = 0;
  EventQueue returns;  // repairs in progress (kind kReturn, a = slice)
};

// Each slice starts down with its stationary probability (repair share of its failure cycle),
// with the residual of a repair in progress.
FleetState StationaryStart(const FleetSpec& spec, FailureTrace& tr, Rng& rng) {
  const size_t n = tr.slice_chips.size();
  tr.down_at_start.assign(n, 0);
  FleetState s;
  s.healthy.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const double c = static_cast<double>(tr.slice_chips[i]);
    const double p_down = spec.repair_mean_s / (spec.mtbi_s / c + spec.repair_mean_s);
    if (rng.Bernoulli(p_down)) {
      tr.down_at_start[i] = 1;
      s.returns.Push(DrawResidualRepair(spec, rng), kReturn, static_cast<int64_t>(i));
    } else {
      s.healthy.push_back(static_cast<int32_t>(i));
      s.healthy_chips += tr.slice_chips[i];
    }
  }
  return s;
}

// Victim: uniform among healthy slices, accepted in proportion to its chips (only the last
// slice can be smaller, so the rejection loop almost never repeats). Returns its index in
// `healthy`.
size_t PickVictim(const std::vector<int32_t>& healthy, const std::vector<int64_t>& slice_chips, int64_t max_slice,
                  Rng& rng) {
  size_t k;
  do {
    k = static_cast<size_t>(rng.UniformInt(healthy.size()));
  } while (slice_chips[static_cast<size_t>(healthy[k])] < max_slice &&
           rng.Uniform() * static_cast<double>(max_slice) >=
               static_cast<double>(slice_chips[static_cast<size_t>(healthy[k])]));
  return k;
}

}  // namespace

FailureTrace GenerateTrace(const FleetSpec& spec, uint64_t seed) {
  FailureTrace tr;
  tr.slice_chips = SliceSizes(spec);
  tr.duration_s = spec.duration_s;
  Rng rng(seed);
  FleetState s = StationaryStart(spec, tr, rng);
  const int64_t max_slice = *std::max_element(tr.slice_chips.begin(), tr.slice_chips.end());
  constexpr double kInf = std::numeric_limits<double>::infinity();

  double t = 0;
  while (true) {
    // The superposition of the healthy chips' Poisson processes is Poisson with rate
    // healthy_chips/MTBI; by memorylessness it is redrawn after every event.
    const double next_failure =
        s.healthy_chips > 0 ? t + rng.Exponential(spec.mtbi_s / static_cast<double>(s.healthy_chips)) : kInf;
    const double next_return = s.returns.empty() ? kInf : s.returns.Top().time;
    if (std::min(next_failure, next_return) > spec.duration_s) break;
    if (next_return <= next_failure) {
      const Event e = s.returns.Pop();
      t = e.time;
      const size_t i = static_cast<size_t>(e.a);
      s.healthy.push_back(static_cast<int32_t>(i));
      s.healthy_chips += tr.slice_chips[i];
      tr.events.push_back({t, static_cast<int32_t>(i), true});
      continue;
    }
    t = next_failure;
    const size_t k = PickVictim(s.healthy, tr.slice_chips, max_slice, rng);
    const int32_t victim = s.healthy[k];
    s.healthy[k] = s.healthy.back();
    s.healthy.pop_back();
    s.healthy_chips -= tr.slice_chips[static_cast<size_t>(victim)];
    tr.events.push_back({t, victim, false});
    ++tr.failures;
    s.returns.Push(t + DrawRepair(spec, rng), kReturn, victim);
  }
  return tr;
}

double StationarySliceFailureRate(const FleetSpec& spec) {
  double rate = 0;
  for (int64_t c : SliceSizes(spec)) rate += 1.0 / (spec.mtbi_s / static_cast<double>(c) + spec.repair_mean_s);
  return rate;
}

double StationaryDownFraction(const FleetSpec& spec) {
  double down = 0;
  for (int64_t c : SliceSizes(spec)) {
    const double cd = static_cast<double>(c);
    down += cd * spec.repair_mean_s / (spec.mtbi_s / cd + spec.repair_mean_s);
  }
  return down / static_cast<double>(spec.chips);
}

}  // namespace atl::sim
