// Bandwidth model: the cross-site bandwidth each training method needs, and the time per step
// it achieves over a given wide-area link. Closed-form; every number comes with its formula.
//
// Notation: N parameters, t step time (s), S sites (= M learners), H inner steps between
// synchronisations of a parameter, P fragments, τ overlap steps, b bits per gradient value for
// data-parallel, q bits per value for DiLoCo's outer gradients and fragments.
//   data-parallel       ring all-reduce of the gradient every step that must hide under the
//                       backward pass (fraction f of the step):  2(S−1)/S · N·b / (f·t)
//   sync DiLoCo         blocking ring all-reduce of the full outer gradient every H steps that
//                       may cost at most a fraction α of the round:  2(S−1)/S · N·q / (α·H·t)
//   Streaming DiLoCo    ring all-reduce of one fragment (N/P values) every H/P steps, which must
//                       finish within τ steps:  2(S−1)/S · (N/P)·q / (min(τ, H/P)·t)
//   Decoupled DiLoCo    per learner↔syncer link, each direction, one fragment every H/P steps
//                       within τ steps:  (N/P)·q / (min(τ, H/P)·t); the syncer's ingress
//                       is S times that (or spread over sites when the syncer is sharded).
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::sim {

struct BandwidthParams {
  double params = 5e9;
  double step_s = 1.0;
  int sites = 8;
  int inner_steps = 24;                  // H
  int fragments = 24;                    // P
  double overlap = 2;                    // τ, steps
  double dp_bits = 16;                   // bf16 gradients
  double bits = 4;                       // int4 outer gradients / fragments
  double backward_fraction = 2.0 / 3.0;  // backward ≈ 2× forward
  double sync_overhead = 0.05;           // α: sync DiLoCo's blocking all-reduce ≤ 5 % of a round
};

Status ValidateBandwidth(const BandwidthParams& p);

struct BandwidthLine {
  std::string method;
  double gbps = 0;
  std::string formula;      // symbolic
  std::string substituted;  // with the numbers
};

// One line each: data-parallel, sync DiLoCo, Streaming DiLoCo, Decoupled DiLoCo (per link),
// Decoupled DiLoCo (syncer ingress). p must be valid.
std::vector<BandwidthLine> RequiredBandwidth(const BandwidthParams& p);

// Individual formulas (bits per second), for tests and sweeps.
double DataParallelBps(const BandwidthParams& p);
double SyncDilocoBps(const BandwidthParams& p);
double StreamingDilocoBps(const BandwidthParams& p);
double DecoupledDilocoBps(const BandwidthParams& p);  // per learner link, one direction

// Time per step over a WAN of `link_gbps` per site:
//   data-parallel:     (1−f)·t + max(f·t, 2(S−1)/S·N·b / B)   (the all-reduce overlaps backward)
//   Decoupled DiLoCo:  max(t, (N/P)·q / (B·min(τ, H/P)))      (fragments overlap compute)
struct WanStep {
  double link_gbps = 0;
  double dp_step_s = 0;
  double decoupled_step_s = 0;
  double speedup = 0;  // dp / decoupled
};
WanStep WanStepTime(const BandwidthParams& p, double link_gbps);

std::string FormatBandwidthReport(const BandwidthParams& p, const std::vector<BandwidthLine>& l,
                                  const BandwidthParams& wan, const std::vector<WanStep>& w);
std::string BandwidthJson(const std::vector<BandwidthLine>& l, const std::vector<WanStep>& w);

// Required bandwidth vs sites (2..64) for each method, log scale, as an SVG document.
std::string BandwidthSweepSvg(const BandwidthParams& p);

}  // namespace atl::sim
