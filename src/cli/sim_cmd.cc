// `atoll fleet goodput` and `atoll fleet bandwidth`, the fleet model (formerly `atoll sim`, still
// accepted): flags in, library calls out (see include/atoll/sim/ and docs/sim.md for the model
// behind every number). Not to be confused with `atoll simulate`, which runs the cluster itself on
// simulated time (runtime_cmd.cc).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "atoll/core/clock.h"
#include "atoll/core/file.h"
#include "atoll/sim/bandwidth.h"
#include "atoll/sim/goodput.h"
#include "command.h"

namespace atl::cli {
namespace {

struct GoodputFlags {
  sim::GoodputParams p;
  bool json = false;
  std::string plot;
};

struct BandwidthFlags {
  sim::BandwidthParams p;
  double wan_params = 12e9;
  int wan_sites = 4;
  double wan_step_s = 1.0;
  std::vector<double> wan_gbps = {2, 5};
  bool json = false;
  std::string plot;
};

// Validators whose errors read "--chips: must be > 0, got -5" (CLI11's Range prints ±DBL_MAX).
CLI::Validator AtLeast(double lo, bool strict) {
  const std::string what = std::string(strict ? "> " : ">= ") + CLI::detail::to_string(lo);
  return CLI::Validator(
      [lo, strict, what](std::string& in) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(in, &used);
          if (used != in.size()) return "not a number: " + in;
        } catch (const std::exception&) {
          return "not a number: " + in;
        }
        return (strict ? v > lo : v >= lo) ? "" : "must be " + what + ", got " + in;
      },
      what);
}
const CLI::Validator kPositive = AtLeast(0, true);
const CLI::Validator kNonNegative = AtLeast(0, false);

int Fail(const Status& s) {
  std::fprintf(stderr, "atoll fleet: error: %s\n", s.ToString().c_str());
  return 2;
}

int RunGoodputCommand(GoodputFlags& f) {
  RealClock& clock = RealClock::Default();
  const double t0 = clock.NowSeconds();
  auto res = sim::RunGoodput(f.p);
  if (!res.ok()) return Fail(res.status());
  const double wall = clock.NowSeconds() - t0;
  if (f.json) {
    std::fputs(sim::GoodputJson(f.p, *res).c_str(), stdout);
    std::fprintf(stderr, "wall time %.2f s\n", wall);
  } else {
    std::fputs(sim::FormatGoodputTable(f.p, *res).c_str(), stdout);
    std::printf("\nwall time %.2f s (%d seeds x 4 modes)\n", wall, f.p.seeds);
  }
  if (!f.plot.empty()) {
    auto svg = sim::GoodputSweepSvg(f.p);
    if (!svg.ok()) return Fail(svg.status());
    if (Status s = WriteFileAtomic(f.plot, *svg); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s (%.2f s total)\n", f.plot.c_str(), clock.NowSeconds() - t0);
  }
  return 0;
}

int RunBandwidthCommand(const BandwidthFlags& f) {
  if (Status s = sim::ValidateBandwidth(f.p); !s.ok()) return Fail(s);
  sim::BandwidthParams wan = f.p;
  wan.params = f.wan_params;
  wan.sites = f.wan_sites;
  wan.step_s = f.wan_step_s;
  if (Status s = sim::ValidateBandwidth(wan); !s.ok()) return Fail(s.WithContext("WAN model"));
  const auto lines = sim::RequiredBandwidth(f.p);
  std::vector<sim::WanStep> steps;
  for (double g : f.wan_gbps) steps.push_back(sim::WanStepTime(wan, g));
  if (f.json) {
    std::fputs(sim::BandwidthJson(lines, steps).c_str(), stdout);
  } else {
    std::fputs(sim::FormatBandwidthReport(f.p, lines, wan, steps).c_str(), stdout);
  }
  if (!f.plot.empty()) {
    if (Status s = WriteFileAtomic(f.plot, sim::BandwidthSweepSvg(f.p)); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s\n", f.plot.c_str());
  }
  return 0;
}

// The fleet and its failures: size, slices, failure rate, repairs.
void AddFleetFlags(CLI::App* c, GoodputFlags& flags) {
  auto& p = flags.p;
  c->add_option("--chips", p.chips, "chips in the fleet")->capture_default_str()->check(kPositive);
  c->add_option("--slice-chips", p.slice_chips, "chips per slice, the unit of failure and repair (one model replica)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--mtbi-years", p.mtbi_years, "mean time between interruptions per chip, years")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--repair-hours", p.repair_hours, "mean time a failed slice is out, hours")
      ->capture_default_str()
      ->check(kNonNegative);
  AddEnumOption(c, "--repair-dist", p.repair_dist, "repair time distribution with that mean");
  c->add_option("--repair-sigma", p.repair_sigma, "lognormal repair only: sigma of the underlying normal")
      ->capture_default_str()
      ->check(kNonNegative);
}

// How each training mode pays for a failure, and the DiLoCo shape (H, M, K).
void AddModeFlags(CLI::App* c, sim::GoodputParams& p) {
  c->add_option("--restart-s", p.restart_s, "data-parallel without elasticity: stall per failure, seconds")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("--detect-s", p.detect_s,
                "failure detection, seconds: a failure or return during a restart or pause "
                "extends it to at least this long after the event (the restart under way takes "
                "the slice in) instead of starting it again; >= the pauses: every event restarts")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("--spare-slices", p.spare_slices,
                "data-parallel without elasticity: spare slices held for restarts (-1: auto, the "
                "mean number of slices in repair + 3 standard deviations)")
      ->capture_default_str()
      ->check(AtLeast(-1, false));
  c->add_option("--checkpoint-s", p.checkpoint_s,
                "data-parallel without elasticity: seconds of progress between checkpoints; work "
                "since the last one is lost on a failure (0: none lost)")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("--shrink-s", p.shrink_s,
                "elastic modes: pause of the job/learner when one of its slices fails, seconds")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("--grow-s", p.grow_s, "elastic modes: pause of the job/learner when a slice returns, seconds")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("--step-s", p.step_s, "inner step time, seconds")->capture_default_str()->check(kPositive);
  c->add_option("-H,--inner-steps", p.inner_steps, "sync DiLoCo: inner steps between barriers (H)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--barrier-s", p.barrier_s, "sync DiLoCo: time of the outer all-reduce at each barrier, seconds")
      ->capture_default_str()
      ->check(kNonNegative);
  c->add_option("-M,--learners", p.learners, "DiLoCo learners (M), each N/M chips")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("-K,--quorum", p.quorum,
                "Decoupled DiLoCo: minimum learners training for the global model to advance (K)")
      ->capture_default_str()
      ->check(kPositive);
}

// Simulated time, seeds and output.
void AddSimulationFlags(CLI::App* c, GoodputFlags& flags) {
  auto& p = flags.p;
  c->add_option("--days", p.days, "simulated duration per seed, days")->capture_default_str()->check(kPositive);
  c->add_option("--seeds", p.seeds, "independent failure traces (confidence intervals over them)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--seed", p.seed, "first seed; trace i uses seed+i")->capture_default_str();
  c->add_flag("--json", flags.json, "print a JSON array, one object per mode, instead of the table");
  c->add_option("--plot", flags.plot,
                "also write FILE.svg: goodput and uptime vs chips for every mode (sweeps chips "
                "up to --chips)");
}

void AddGoodput(CLI::App& sim, CommandContext& ctx) {
  auto f = std::make_shared<GoodputFlags>();
  CLI::App* c =
      sim.add_subcommand("goodput",
                         "Discrete-event simulation of a fleet under chip failures: goodput (useful chip-seconds / "
                         "allocated chip-seconds) and uptime of data-parallel, elastic data-parallel, synchronous "
                         "DiLoCo and Decoupled DiLoCo over the same failure trace. See docs/sim.md.");
  AddFleetFlags(c, *f);
  AddModeFlags(c, f->p);
  AddSimulationFlags(c, *f);
  c->callback([f, &ctx] { ctx.action = [f] { return RunGoodputCommand(*f); }; });
}

void AddBandwidth(CLI::App& sim, CommandContext& ctx) {
  auto f = std::make_shared<BandwidthFlags>();
  auto& p = f->p;
  CLI::App* c =
      sim.add_subcommand("bandwidth",
                         "Closed-form cross-site bandwidth needed by data-parallel, sync DiLoCo, Streaming DiLoCo "
                         "and Decoupled DiLoCo (with the formula behind each number), and time per step over a "
                         "WAN. See docs/sim.md.");
  c->add_option("--params", p.params, "model parameters (N)")->capture_default_str()->check(kPositive);
  c->add_option("--step-s", p.step_s, "compute time per inner step (t), seconds")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--sites", p.sites, "data centres = learners (S = M)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  c->add_option("-H,--inner-steps", p.inner_steps, "inner steps between two synchronisations of a parameter (H)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("-P,--fragments", p.fragments, "fragments the parameters are split into (P <= H)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--overlap", p.overlap, "tau: steps a fragment's transfer may overlap with compute")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--dp-bits", p.dp_bits, "data-parallel gradient bits per value (b)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--bits", p.bits, "DiLoCo outer-gradient/fragment bits per value (q)")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--backward-fraction", p.backward_fraction,
                "f: share of a step taken by the backward pass, under which the data-parallel "
                "all-reduce must hide")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  c->add_option("--sync-overhead", p.sync_overhead,
                "alpha: share of a round sync DiLoCo's blocking all-reduce may take")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  c->add_option("--wan-params", f->wan_params, "WAN model: parameters")->capture_default_str()->check(kPositive);
  c->add_option("--wan-sites", f->wan_sites, "WAN model: sites")->capture_default_str()->check(CLI::Range(2, 1 << 20));
  c->add_option("--wan-step-s", f->wan_step_s, "WAN model: compute time per step, seconds")
      ->capture_default_str()
      ->check(kPositive);
  c->add_option("--wan-gbps", f->wan_gbps, "WAN model: link bandwidths per site to compare, Gbps")
      ->capture_default_str()
      ->check(kPositive)
      ->delimiter(',');
  c->add_flag("--json", f->json, "print JSON instead of the tables");
  c->add_option("--plot", f->plot, "also write FILE.svg: required bandwidth vs sites");
  c->callback([f, &ctx] { ctx.action = [f] { return RunBandwidthCommand(*f); }; });
}

void RegisterFleet(CLI::App& app, CommandContext& ctx) {
  CLI::App* fleet = app.add_subcommand(
      "fleet",
      "Fleet model: goodput under chip failures and cross-site bandwidth, for fleets of any size (no GPU "
      "needed; `atoll simulate` runs the cluster itself)");
  fleet->alias("sim");
  RenamedCommands().push_back({"sim", "fleet"});
  fleet->require_subcommand(1);
  AddGoodput(*fleet, ctx);
  AddBandwidth(*fleet, ctx);
}

}  // namespace

ATOLL_COMMAND(50, RegisterFleet);

}  // namespace atl::cli
