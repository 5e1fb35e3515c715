#include "atoll/sim/bandwidth.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/sim/svg.h"

namespace atl::sim {

Status ValidateBandwidth(const BandwidthParams& p) {
  if (!(p.params > 0)) return InvalidArgumentError("--params must be > 0");
  if (!(p.step_s > 0)) return InvalidArgumentError("--step-s must be > 0");
  if (p.sites < 2) return InvalidArgumentError("--sites must be >= 2 (one site needs no WAN)");
  if (p.inner_steps < 1) return InvalidArgumentError("--inner-steps (H) must be >= 1");
  if (p.fragments < 1) return InvalidArgumentError("--fragments (P) must be >= 1");
  if (p.fragments > p.inner_steps)
    return InvalidArgumentError(
        "--fragments (P) must be <= --inner-steps (H): each fragment is "
        "synchronised once every H steps, at most one per step");
  if (!(p.overlap > 0)) return InvalidArgumentError("--overlap (tau) must be > 0 steps");
  if (!(p.dp_bits > 0) || !(p.bits > 0)) return InvalidArgumentError("bits must be > 0");
  if (!(p.backward_fraction > 0 && p.backward_fraction <= 1))
    return InvalidArgumentError("--backward-fraction must be in (0, 1]");
  if (!(p.sync_overhead > 0 && p.sync_overhead <= 1)) return InvalidArgumentError("--sync-overhead must be in (0, 1]");
  return Status::Ok();
}

namespace {
double RingFactor(const BandwidthParams& p) { return 2.0 * (p.sites - 1) / p.sites; }
// Steps a fragment's transfer may take: the overlap τ, and no more than the H/P steps between
// two fragments (otherwise transfers pile up).
double FragmentWindowSteps(const BandwidthParams& p) {
  return std::min(p.overlap, static_cast<double>(p.inner_steps) / p.fragments);
}
double FragmentBits(const BandwidthParams& p) { return p.params / p.fragments * p.bits; }
}  // namespace

double DataParallelBps(const BandwidthParams& p) {
  return RingFactor(p) * p.params * p.dp_bits / (p.backward_fraction * p.step_s);
}
double SyncDilocoBps(const BandwidthParams& p) {
  return RingFactor(p) * p.params * p.bits / (p.sync_overhead * p.inner_steps * p.step_s);
}
double StreamingDilocoBps(const BandwidthParams& p) {
  return RingFactor(p) * FragmentBits(p) / (FragmentWindowSteps(p) * p.step_s);
}
double DecoupledDilocoBps(const BandwidthParams& p) { return FragmentBits(p) / (FragmentWindowSteps(p) * p.step_s); }

std::vector<BandwidthLine> RequiredBandwidth(const BandwidthParams& p) {
  const double s = p.sites;
  const std::string ring = fmt::format("2({:g}-1)/{:g}", s, s);
  const std::string win = fmt::format("min({:g}, {}/{})", p.overlap, p.inner_steps, p.fragments);
  std::vector<BandwidthLine> out;
  out.push_back(
      {"data-parallel", DataParallelBps(p) / 1e9, "2(S-1)/S * N*b / (f*t)",
       fmt::format("{} * {:.3g}*{:g} / ({:.3g}*{:g} s)", ring, p.params, p.dp_bits, p.backward_fraction, p.step_s)});
  out.push_back({"sync DiLoCo", SyncDilocoBps(p) / 1e9, "2(S-1)/S * N*q / (alpha*H*t)",
                 fmt::format("{} * {:.3g}*{:g} / ({:g}*{}*{:g} s)", ring, p.params, p.bits, p.sync_overhead,
                             p.inner_steps, p.step_s)});
  out.push_back(
      {"Streaming DiLoCo", StreamingDilocoBps(p) / 1e9, "2(S-1)/S * (N/P)*q / (min(tau, H/P)*t)",
       fmt::format("{} * ({:.3g}/{})*{:g} / ({}*{:g} s)", ring, p.params, p.fragments, p.bits, win, p.step_s)});
  out.push_back({"Decoupled DiLoCo (per learner link)", DecoupledDilocoBps(p) / 1e9, "(N/P)*q / (min(tau, H/P)*t)",
                 fmt::format("({:.3g}/{})*{:g} / ({}*{:g} s)", p.params, p.fragments, p.bits, win, p.step_s)});
  out.push_back(
      {"Decoupled DiLoCo (syncer ingress)", s * DecoupledDilocoBps(p) / 1e9, "M * (N/P)*q / (min(tau, H/P)*t)",
       fmt::format("{:g} * ({:.3g}/{})*{:g} / ({}*{:g} s)", s, p.params, p.fragments, p.bits, win, p.step_s)});
  return out;
}

WanStep WanStepTime(const BandwidthParams& p, double link_gbps) {
  WanStep w;
  w.link_gbps = link_gbps;
  const double bps = link_gbps * 1e9;
  const double f = p.backward_fraction, t = p.step_s;
  const double allreduce_s = RingFactor(p) * p.params * p.dp_bits / bps;
  w.dp_step_s = (1 - f) * t + std::max(f * t, allreduce_s);
  w.decoupled_step_s = std::max(t, FragmentBits(p) / bps / FragmentWindowSteps(p));
  w.speedup = w.dp_step_s / w.decoupled_step_s;
  return w;
}

std::string FormatBandwidthReport(const BandwidthParams& p, const std::vector<BandwidthLine>& l,
                                  const BandwidthParams& wan, const std::vector<WanStep>& w) {
  std::string out = fmt::format(
      "Required cross-site bandwidth: N = {:.3g} parameters, t = {:g} s/step, S = M = {} sites, "
      "H = {}, P = {}, tau = {:g}, b = {:g} bits (data-parallel), q = {:g} bits (DiLoCo), "
      "f = {:.3g} (backward share of a step), alpha = {:g}\n\n",
      p.params, p.step_s, p.sites, p.inner_steps, p.fragments, p.overlap, p.dp_bits, p.bits, p.backward_fraction,
      p.sync_overhead);
  out += fmt::format("{:<36} {:>12}  {}\n", "method", "Gbps", "formula  =  with the numbers");
  for (const auto& x : l) {
    out += fmt::format("{:<36} {:12.4g}  {}  =  {}\n", x.method, x.gbps, x.formula, x.substituted);
  }
  if (l.size() >= 4 && l[3].gbps > 0)
    out += fmt::format("\ndata-parallel / Decoupled DiLoCo per link = {:.0f}x\n", l[0].gbps / l[3].gbps);
  out += fmt::format(
      "\nTime per step over a WAN: N = {:.3g}, S = {} sites, t = {:g} s compute, b = {:g}, "
      "q = {:g}, H = {}, P = {}, tau = {:g}\n"
      "  data-parallel:    (1-f)*t + max(f*t, 2(S-1)/S*N*b / B)\n"
      "  Decoupled DiLoCo: max(t, (N/P)*q / (B*min(tau, H/P)))\n",
      wan.params, wan.sites, wan.step_s, wan.dp_bits, wan.bits, wan.inner_steps, wan.fragments, wan.overlap);
  out += fmt::format("{:>10} {:>18} {:>22} {:>10}\n", "link Gbps", "data-parallel s", "Decoupled DiLoCo s", "speed-up");
  for (const auto& x : w) {
    out += fmt::format("{:10g} {:18.4g} {:22.4g} {:9.1f}x\n", x.link_gbps, x.dp_step_s, x.decoupled_step_s, x.speedup);
  }
  return out;
}

std::string BandwidthJson(const std::vector<BandwidthLine>& l, const std::vector<WanStep>& w) {
  nlohmann::json j;
  j["required"] = nlohmann::json::array();
  for (const auto& x : l) {
    j["required"].push_back(
        {{"method", x.method}, {"gbps", x.gbps}, {"formula", x.formula}, {"substituted", x.substituted}});
  }
  j["wan"] = nlohmann::json::array();
  for (const auto& x : w) {
    j["wan"].push_back({{"link_gbps", x.link_gbps},
                        {"data_parallel_step_s", x.dp_step_s},
                        {"decoupled_step_s", x.decoupled_step_s},
                        {"speedup", x.speedup}});
  }
  return j.dump(2) + "\n";
}

std::string BandwidthSweepSvg(const BandwidthParams& p) {
  Panel panel;
  panel.title = "Required cross-site bandwidth vs sites";
  panel.x_label = "sites (= learners M)";
  panel.y_label = "Gbps per site link";
  panel.log_x = true;
  panel.log_y = true;
  for (int sites = 2; sites <= 64; sites *= 2) panel.x_ticks.push_back(sites);
  const char* names[] = {"data-parallel", "sync DiLoCo", "Streaming DiLoCo", "Decoupled DiLoCo (per link)"};
  double (*fns[])(const BandwidthParams&) = {DataParallelBps, SyncDilocoBps, StreamingDilocoBps, DecoupledDilocoBps};
  for (int k = 0; k < 4; ++k) {
    Series s;
    s.name = names[k];
    for (int sites = 2; sites <= 64; sites *= 2) {
      BandwidthParams q = p;
      q.sites = sites;
      s.x.push_back(sites);
      s.y.push_back(fns[k](q) / 1e9);
    }
    panel.series.push_back(s);
  }
  const std::string title = fmt::format(
      "atoll fleet bandwidth: {:.3g} parameters, {:g} s/step, data-parallel {:g}-bit, DiLoCo "
      "{:g}-bit, "
      "H={}, P={}, tau={:g}",
      p.params, p.step_s, p.dp_bits, p.bits, p.inner_steps, p.fragments, p.overlap);
  return RenderSvg(title, {panel});
}

}  // namespace atl::sim
