#include "atoll/sim/goodput.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/core/format.h"
#include "atoll/core/rng.h"
#include "atoll/sim/svg.h"

namespace atl::sim {

std::string_view FleetModeName(FleetMode m) {
  switch (m) {
    case FleetMode::kDataParallel: return "data-parallel";
    case FleetMode::kElasticDataParallel: return "elastic-data-parallel";
    case FleetMode::kSyncDiloco: return "sync-diloco";
    case FleetMode::kDecoupledDiloco: return "decoupled-diloco";
  }
  return "?";
}

int ModeLearners(FleetMode m, const GoodputParams& p) {
  return (m == FleetMode::kSyncDiloco || m == FleetMode::kDecoupledDiloco) ? p.learners : 1;
}

FleetSpec ToFleetSpec(const GoodputParams& p) {
  FleetSpec f;
  f.chips = p.chips;
  f.slice_chips = p.slice_chips;
  f.mtbi_s = p.mtbi_years * kSecondsPerYear;
  f.repair_mean_s = p.repair_hours * 3600.0;
  f.repair_dist = p.repair_dist;
  f.repair_sigma = p.repair_sigma;
  f.duration_s = p.days * 86400.0;
  return f;
}

namespace {
// Stationary number of slices in repair: each slice independently with its own probability.
struct InRepair {
  double mean = 0, sd = 0;
};
InRepair SlicesInRepair(const GoodputParams& p) {
  const FleetSpec f = ToFleetSpec(p);
  InRepair r;
  double var = 0;
  for (int64_t c : SliceSizes(f)) {
    const double d = f.repair_mean_s / (f.mtbi_s / static_cast<double>(c) + f.repair_mean_s);
    r.mean += d;
    var += d * (1 - d);
  }
  r.sd = std::sqrt(var);
  return r;
}
}  // namespace

int64_t SpareSlices(const GoodputParams& p) {
  if (p.spare_slices >= 0) return p.spare_slices;
  const int64_t n = (p.chips + p.slice_chips - 1) / p.slice_chips;
  const InRepair r = SlicesInRepair(p);
  const auto spares = static_cast<int64_t>(std::ceil(r.mean + 3 * r.sd - 1e-9));
  return std::clamp<int64_t>(spares, 0, n - 1);
}

Status ValidateGoodput(const GoodputParams& p) {
  if (p.chips <= 0) return InvalidArgumentError("--chips must be > 0, got " + std::to_string(p.chips));
  if (p.slice_chips <= 0) return InvalidArgumentError("--slice-chips must be > 0");
  if (!(p.mtbi_years > 0)) return InvalidArgumentError("--mtbi-years must be > 0");
  if (p.learners < 1) return InvalidArgumentError("--learners (M) must be >= 1");
  if (p.quorum < 1 || p.quorum > p.learners)
    return InvalidArgumentError(fmt::format("--quorum (K) must be in [1, M={}], got {}", p.learners, p.quorum));
  if (!(p.restart_s >= 0) || !(p.shrink_s >= 0) || !(p.grow_s >= 0) || !(p.barrier_s >= 0) || !(p.checkpoint_s >= 0) ||
      !(p.detect_s >= 0))
    return InvalidArgumentError("pause, restart, detection, barrier and checkpoint times must be >= 0");
  if (!(p.step_s > 0)) return InvalidArgumentError("--step-s must be > 0");
  if (p.inner_steps < 1) return InvalidArgumentError("--inner-steps (H) must be >= 1");
  if (p.seeds < 1) return InvalidArgumentError("--seeds must be >= 1");
  ATOLL_RETURN_IF_ERROR(ValidateFleet(ToFleetSpec(p)));
  const int64_t slices = (p.chips + p.slice_chips - 1) / p.slice_chips;
  if (slices < p.learners)
    return InvalidArgumentError(
        fmt::format("{} slices cannot make {} learners (each needs >= 1 slice)", slices, p.learners));
  if (p.spare_slices >= slices)
    return InvalidArgumentError(
        fmt::format("--spare-slices ({}) must leave the job at least one of "
                    "the {} slices",
                    p.spare_slices, slices));
  // Guard against runs that would take hours: the cost is about 2 events per failure.
  const FleetSpec f = ToFleetSpec(p);
  const double events = 2.0 * static_cast<double>(p.chips) / f.mtbi_s * f.duration_s * p.seeds;
  if (events > 2e8)
    return ResourceExhaustedError(
        fmt::format("about {:.2g} failure events: shorten --days, fewer --seeds "
                    "or a longer --mtbi-years",
                    events));
  return Status::Ok();
}

MeanCi MeanCi95(const std::vector<double>& xs) {
  MeanCi r;
  if (xs.empty()) return r;
  for (double x : xs) r.mean += x;
  r.mean /= static_cast<double>(xs.size());
  if (xs.size() < 2) return r;
  double ss = 0;
  for (double x : xs) ss += (x - r.mean) * (x - r.mean);
  const size_t df = xs.size() - 1;
  // Student t, two-sided 95 %, for df = 1..30; the normal 1.96 beyond.
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  const double t = df <= 30 ? kT[df - 1] : 1.96;
  r.half_width = t * std::sqrt(ss / static_cast<double>(df) / static_cast<double>(xs.size()));
  return r;
}

double MeanPauseEpisode(double pause_s, double detect_s, double rate) {
  const double d = std::min(detect_s, pause_s);
  if (!(rate > 0) || d <= 0) return pause_s;
  return pause_s - d + std::expm1(rate * d) / rate;
}

namespace {
// Share of time an elastic island with slice failures and returns each at rate λ is not paused:
// events at 2λ, a pause of (Ps + Pg)/2 on average, detection averaged over the two kinds
// (exact when detect_s >= both pauses: e^{−λ(Ps+Pg)}; otherwise within a fraction of a point).
double ElasticUptime(const GoodputParams& p, double lambda) {
  const double pause = (p.shrink_s + p.grow_s) / 2;
  const double detect = (std::min(p.detect_s, p.shrink_s) + std::min(p.detect_s, p.grow_s)) / 2;
  return 1.0 / (1.0 + 2 * lambda * MeanPauseEpisode(pause, detect, 2 * lambda));
}
}  // namespace

Oracle ClosedForm(FleetMode mode, const GoodputParams& p) {
  const FleetSpec f = ToFleetSpec(p);
  const double lambda = StationarySliceFailureRate(f);
  const double down = StationaryDownFraction(f);
  Oracle o;
  switch (mode) {
    case FleetMode::kDataParallel: {
      // The job's J slices (all but the spares) are always healthy, so job failures arrive at
      // λj = J·S/MTBI. A failure while running starts a restart whose mean length E follows
      // from MeanPauseEpisode; running and restarting alternate, so the job runs a share
      // 1/(1 + λj·E). A run segment L ~ Exp(λj) loses L mod C, whose mean gives the factor
      // λj·C/(e^{λj·C} − 1). The job uses J·S of the N allocated chips. Exact while the spare
      // pool never runs dry (the default pool is sized for that); with a pool smaller than the
      // mean + 2σ of slices in repair the job waits for repairs and no closed form is given.
      const InRepair r = SlicesInRepair(p);
      if (static_cast<double>(SpareSlices(p)) < r.mean + 2 * r.sd) break;
      o.available = true;
      const double job_chips =
          static_cast<double>(p.chips) - static_cast<double>(SpareSlices(p)) * static_cast<double>(p.slice_chips);
      const double lj = job_chips / f.mtbi_s;
      o.uptime = 1.0 / (1.0 + lj * MeanPauseEpisode(p.restart_s, p.detect_s, lj));
      const double lc = lj * p.checkpoint_s;
      o.goodput = o.uptime * (lc > 0 ? lc / std::expm1(lc) : 1.0) * job_chips / static_cast<double>(p.chips);
      break;
    }
    case FleetMode::kElasticDataParallel: {
      // Failures and returns each arrive at rate λ (half the events each): pauses and
      // training alternate.
      o.available = true;
      o.uptime = ElasticUptime(p, lambda);
      o.goodput = o.uptime * (1.0 - down);
      break;
    }
    case FleetMode::kDecoupledDiloco: {
      // Each learner sees λ/M; learners are independent, so the number training is binomial.
      o.available = true;
      const int m = p.learners;
      const double q = ElasticUptime(p, lambda / m);
      o.goodput = q * (1.0 - down);
      double tail = 0;  // P(at least K of M training)
      for (int k = p.quorum; k <= m; ++k) {
        tail += std::exp(std::lgamma(m + 1.0) - std::lgamma(k + 1.0) - std::lgamma(m - k + 1.0)) * std::pow(q, k) *
                std::pow(1.0 - q, m - k);
      }
      o.uptime = std::min(1.0, tail);
      break;
    }
    case FleetMode::kSyncDiloco: break;
  }
  return o;
}

StatusOr<std::vector<ModeSummary>> RunGoodput(const GoodputParams& p, const std::vector<FleetMode>& modes) {
  ATOLL_RETURN_IF_ERROR(ValidateGoodput(p));
  const FleetSpec f = ToFleetSpec(p);
  std::vector<ModeSummary> out;
  for (FleetMode m : modes) {
    ModeSummary s;
    s.mode = m;
    s.learners = ModeLearners(m, p);
    s.chips = p.chips;
    s.oracle = ClosedForm(m, p);
    out.push_back(s);
  }
  for (int i = 0; i < p.seeds; ++i) {
    // One trace per seed, shared by every mode.
    uint64_t st = p.seed + static_cast<uint64_t>(i);
    const FailureTrace trace = GenerateTrace(f, SplitMix64(st));
    for (auto& s : out) s.runs.push_back(SimulateMode(s.mode, p, trace));
  }
  for (auto& s : out) {
    std::vector<double> g, u, fl;
    for (const auto& r : s.runs) {
      g.push_back(r.goodput);
      u.push_back(r.uptime);
      fl.push_back(static_cast<double>(r.failures));
    }
    const MeanCi gc = MeanCi95(g), uc = MeanCi95(u);
    s.goodput = gc.mean;
    s.goodput_ci95 = gc.half_width;
    s.uptime = uc.mean;
    s.uptime_ci95 = uc.half_width;
    s.failures = MeanCi95(fl).mean;
  }
  return out;
}

std::string FormatGoodputTable(const GoodputParams& p, const std::vector<ModeSummary>& s) {
  const FleetSpec f = ToFleetSpec(p);
  const auto slices = SliceSizes(f).size();
  std::string out = fmt::format(
      "fleet: {} chips in {} slices of {}, MTBI {:g} chip-years (a failure every {:.1f} s), "
      "repair {:g} h ({})\n"
      "       restart {:g} s ({} spare slices), shrink {:g} s, grow {:g} s, detect {:g} s, "
      "step {:g} s, H {}, M {}, K {}; {:g} days x {} seeds\n\n",
      Grouped(p.chips), Grouped(static_cast<int64_t>(slices)), p.slice_chips, p.mtbi_years,
      1.0 / StationarySliceFailureRate(f), p.repair_hours, RepairDistName(p.repair_dist), p.restart_s, SpareSlices(p),
      p.shrink_s, p.grow_s, p.detect_s, p.step_s, p.inner_steps, p.learners, p.quorum, p.days, p.seeds);
  out += fmt::format("{:<23} {:>8}  {:<17} {:<17} {:>10}  {}\n", "mode", "learners", "goodput (95% CI)",
                     "uptime (95% CI)", "failures", "closed form goodput / uptime");
  for (const auto& m : s) {
    std::string oracle = "-";
    if (m.oracle.available) oracle = fmt::format("{:.1f}% / {:.2f}%", 100 * m.oracle.goodput, 100 * m.oracle.uptime);
    out += fmt::format("{:<23} {:8}  {:5.1f}% +- {:<6.2f} {:6.2f}% +- {:<6.2f} {:>10}  {}\n", FleetModeName(m.mode),
                       m.learners, 100 * m.goodput, 100 * m.goodput_ci95, 100 * m.uptime, 100 * m.uptime_ci95,
                       Grouped(std::llround(m.failures)), oracle);
  }
  return out;
}

std::string GoodputJson(const GoodputParams& p, const std::vector<ModeSummary>& s) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& m : s) {
    nlohmann::json o;
    o["mode"] = FleetModeName(m.mode);
    o["learners"] = m.learners;
    o["chips"] = m.chips;
    o["goodput"] = m.goodput;
    o["goodput_ci95"] = m.goodput_ci95;
    o["uptime"] = m.uptime;
    o["uptime_ci95"] = m.uptime_ci95;
    o["failures"] = m.failures;
    o["seeds"] = p.seeds;
    o["days"] = p.days;
    if (m.oracle.available) {
      o["closed_form_goodput"] = m.oracle.goodput;
      o["closed_form_uptime"] = m.oracle.uptime;
    }
    arr.push_back(o);
  }
  return arr.dump(2) + "\n";
}

StatusOr<std::string> GoodputSweepSvg(const GoodputParams& p) {
  ATOLL_RETURN_IF_ERROR(ValidateGoodput(p));
  const double lo = static_cast<double>(std::max<int64_t>(p.learners, 4) * p.slice_chips);
  const double hi = static_cast<double>(p.chips);
  std::vector<int64_t> grid;
  constexpr int kPoints = 12;
  for (int i = 0; i < kPoints; ++i) {
    const double x = hi <= lo ? hi : lo * std::pow(hi / lo, i / double(kPoints - 1));
    // Whole slices, so that every point is a fleet the model can hold.
    const int64_t c = std::max<int64_t>(p.slice_chips, std::llround(x / p.slice_chips) * p.slice_chips);
    if (grid.empty() || c > grid.back()) grid.push_back(std::min<int64_t>(c, p.chips));
  }
  Panel gp, up;
  gp.title = "Goodput vs fleet size";
  gp.x_label = "chips";
  gp.y_label = "goodput";
  gp.log_x = up.log_x = true;
  gp.y_percent = up.y_percent = true;
  gp.y_min = up.y_min = 0;
  gp.y_max = up.y_max = 1;
  up.title = "Uptime vs fleet size";
  up.x_label = "chips";
  up.y_label = "uptime (global model advances)";
  for (FleetMode m : kAllFleetModes) {
    Series sg, su;
    sg.name = su.name =
        std::string(FleetModeName(m)) + (ModeLearners(m, p) > 1 ? fmt::format(" (M={})", ModeLearners(m, p)) : "");
    gp.series.push_back(sg);
    up.series.push_back(su);
  }
  for (int64_t c : grid) {
    GoodputParams q = p;
    q.chips = c;
    ATOLL_ASSIGN_OR_RETURN(auto res, RunGoodput(q));
    for (size_t i = 0; i < res.size(); ++i) {
      gp.series[i].x.push_back(static_cast<double>(c));
      gp.series[i].y.push_back(res[i].goodput);
      gp.series[i].y_err.push_back(res[i].goodput_ci95);
      up.series[i].x.push_back(static_cast<double>(c));
      up.series[i].y.push_back(res[i].uptime);
      up.series[i].y_err.push_back(res[i].uptime_ci95);
    }
  }
  const std::string title = fmt::format(
      "atoll fleet goodput: MTBI {:g} chip-years, slices of {}, repair {:g} h, {:g} days x {} seeds "
      "(bars: 95% CI)",
      p.mtbi_years, p.slice_chips, p.repair_hours, p.days, p.seeds);
  return RenderSvg(title, {gp, up});
}

}  // namespace atl::sim
