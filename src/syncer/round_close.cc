// Closing a round of fragment p: one tiled pass over the fragment on the core's pool that decodes
// the pushes, merges them, takes the outer step and advances the public copy Φ_p, writing the next
// values into the core's scratch buffers; numeric safety then commits them (swapped in) or
// refuses the round (nothing changed). docs/decisions/017.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_merger.h"
#include "atoll/diloco/reduce.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/exchange/lattice.h"
#include "atoll/syncer/guards.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {
namespace {

constexpr char kThetaFinite = 1, kMomentumFinite = 2, kSweepFinite = 4;

bool Finite(const float* x, size_t n) {
  bool ok = true;
  for (size_t i = 0; i < n; ++i) ok &= std::isfinite(x[i]);
  return ok;
}

// `v` sized n for this round, keeping the capacity of the largest fragment (so that the buffers a
// commit swaps between fragments are reallocated at most once each).
void Size(std::vector<float>& v, size_t n, size_t capacity) {
  if (v.capacity() < capacity) {
    std::vector<float> fresh;
    fresh.reserve(capacity);
    v.swap(fresh);
  }
  v.resize(n);
}

}  // namespace

// What a round's pass works with and measures.
struct SyncerCore::RoundPass {
  std::vector<double> weights;                   // per pending contribution
  std::map<int64_t, std::vector<float>> bases;   // Φ_p at older versions that contributions were computed against
  std::vector<std::span<const float>> base_of;   // per contribution (empty: kBase or ddp)
  std::optional<diloco::OuterStepKernel> kernel;  // outer rules; ddp moves Θ whole
  bool accum_sized = false, writes_momentum = false, fuse_lattice = false;
  size_t vetted_out = 0;
  // Per reduction chunk of the fragment: Σ Θ_before², Σ Θ_after², Σ (Θ_after − Θ_before)², Σ momentum².
  std::vector<double> before2, after2, step2, momentum2;
  std::vector<std::vector<std::byte>> delta_parts;  // per tile, joined in order
  std::vector<int64_t> saturated;                   // per tile
  std::vector<char> finite;                         // per tile: kThetaFinite | kMomentumFinite | kSweepFinite
  std::vector<float> merged;                        // ddp and the unfused lattice step only
  std::vector<std::byte> delta;
  RoundNorms norms;
  double merged_norm = 0;
};

RoundReport SyncerCore::CloseRound(int p, const RoundDecision& d, TimePoint now, const Clock& clock) {
  const TimePoint t0 = clock.Now();
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  RoundReport report;
  report.fragment = p;
  report.round = f.round;
  report.grace_seconds = d.grace_seconds;
  report.late = d.missing;
  report.reason = d.reason;
  report.closed_at = now;
  RoundPass pass;
  for (const Contribution& c : f.pending) {
    pass.weights.push_back(std::min(c.max_weight, rule_->Weight(c.c_tokens, c.c_steps)));
    report.contributors.push_back(c.learner);
    report.tokens_merged += static_cast<double>(c.c_tokens) / plan_.num_fragments();
  }
  report.token_share = TokenShare(f, LiveLearners(now));
  Status st = RunRoundPass(p, pass, report);
  report.merged_norm = pass.merged_norm;
  report.step_norm = pass.norms.step;
  // Numeric safety before anything is committed (syncer/guards.h).
  if (st.ok()) st = CheckRoundResult(pass.norms, options_.max_step_ratio);
  if (!st.ok()) return RefuseRound(p, std::move(report), st);
  if (pass.kernel) report.sweep_completed = pass.kernel->completes_sweep();
  CommitRoundPass(p, pass);
  report.version = f.version;
  if (pass.vetted_out > 0) {
    report.reason += fmt::format(" ({} contribution(s) left out: outer gradient beyond the bound)", pass.vetted_out);
  }
  for (const auto& c : f.pending) {
    auto it = learners_.find(c.learner);
    if (it == learners_.end()) continue;
    it->second.rounds_joined += 1;
    it->second.tokens_merged += static_cast<double>(c.c_tokens) / plan_.num_fragments();
    it->second.merged_versions.resize(fragments_.size(), -1);
    it->second.merged_versions[static_cast<size_t>(p)] = f.version;
  }
  f.pending.clear();
  f.opened_at.reset();
  f.quorum_at.reset();
  f.round += 1;
  rounds_closed_ += 1;
  estimates_.sync_seconds = Ema(estimates_.sync_seconds, ToSeconds(clock.Now() - t0));
  return report;
}

Status SyncerCore::RunRoundPass(int p, RoundPass& pass, RoundReport& report) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const diloco::Fragment& fragment = plan_.fragments[static_cast<size_t>(p)];
  const size_t n = f.theta.size();
  size_t capacity = 0;
  for (const diloco::Fragment& g : plan_.fragments) capacity = std::max(capacity, static_cast<size_t>(g.numel));
  // Φ_p at the versions late pushes were computed against (each once): exact, from the history.
  for (const Contribution& c : f.pending) {
    std::span<const float> base;
    if (rule_->NeedsBase()) {
      if (c.base_version == f.version) {
        base = f.copy->values();
      } else {
        auto [it, fresh] = pass.bases.try_emplace(c.base_version);
        if (fresh) ATOLL_RETURN_IF_ERROR(f.copy->ValuesAt(c.base_version, it->second).WithContext("round"));
        base = it->second;
      }
    }
    pass.base_of.push_back(base);
  }
  if (auto kernel = rule_->Kernel(report.token_share, f.sweep, !f.momentum.empty())) {
    if (!kernel->ok()) return kernel->status();
    pass.kernel = std::move(**kernel);
    pass.accum_sized = f.sweep.accum.size() == n;
    if (pass.kernel->keeps_accum() && !pass.accum_sized) {  // a sweep's first round: S starts at 0
      diloco::SweepState fresh;
      auto again = rule_->Kernel(report.token_share, fresh, !f.momentum.empty());
      if (!again->ok()) return again->status();
      pass.kernel = std::move(**again);
    }
    // The momentum moves every round under kRound, at a sweep's end otherwise (else it is read in place).
    pass.writes_momentum = pass.kernel->keeps_momentum() &&
                           (options_.outer_step == OuterStepRule::kRound || pass.kernel->completes_sweep());
  }
  Size(scratch_.theta, n, capacity);
  if (pass.writes_momentum) Size(scratch_.momentum, n, capacity);
  if (pass.kernel && pass.kernel->keeps_accum()) Size(scratch_.accum, n, capacity);
  if (pass.kernel && pass.kernel->keeps_start()) Size(scratch_.start, n, capacity);
  Size(scratch_.phi, n, capacity);
  const size_t block = static_cast<size_t>(f.copy->lattice().block);
  auto merger = diloco::FragmentMerger::Create(fragment, rule_->merge_rule(), pass.weights, pool_.get());
  if (!merger.ok()) return merger.status().WithContext("merge");
  const diloco::SegmentGrid& grid = merger->grid();
  pass.fuse_lattice = pass.kernel.has_value() && grid.tile_values() % block == 0;
  const size_t chunks = (n + diloco::kReduceChunk - 1) / diloco::kReduceChunk;
  pass.before2.assign(chunks, 0.0);
  pass.after2.assign(chunks, 0.0);
  pass.step2.assign(chunks, 0.0);
  pass.momentum2.assign(chunks, 0.0);
  pass.delta_parts.assign(grid.num_tiles(), {});
  pass.saturated.assign(grid.num_tiles(), 0);
  pass.finite.assign(grid.num_tiles(), kThetaFinite | kMomentumFinite | kSweepFinite);
  if (!pass.kernel || !pass.fuse_lattice) pass.merged.resize(n);

  const std::span<const float> reference = rule_->Reference(f.theta, f.sweep);
  const diloco::FragmentMerger::Source source = [&](size_t m, size_t b, size_t e, float* out) {
    const Contribution& c = f.pending[m];
    diloco::DecodeRawRange(options_.uplink, c.raw, n, b, e, out);
    rule_->VectorizeRange(pass.base_of[m], reference, b, e, out);
  };
  diloco::FragmentMerger::Vet vet;
  if (pass.kernel) {
    vet = [&](size_t, double norm) {
      const bool ok = CheckOuterGradientBound(norm, f.theta_norm, options_.max_gradient_ratio).ok();
      if (!ok) pass.vetted_out += 1;
      return ok;
    };
  }
  const diloco::OuterStepSpans spans = {
      .theta = f.theta.data(), .theta_out = scratch_.theta.data(),
      .momentum = f.momentum.empty() ? nullptr : f.momentum.data(),
      .momentum_out = pass.writes_momentum ? scratch_.momentum.data() : (f.momentum.empty() ? nullptr : f.momentum.data()),
      .accum = pass.accum_sized ? f.sweep.accum.data() : nullptr,
      .accum_out = scratch_.accum.empty() || !pass.kernel || !pass.kernel->keeps_accum() ? nullptr : scratch_.accum.data(),
      .start = f.sweep.start.size() == n ? f.sweep.start.data() : nullptr,
      .start_out = pass.kernel && pass.kernel->keeps_start() ? scratch_.start.data() : nullptr};
  const diloco::FragmentMerger::Sink sink = [&](size_t t, size_t b, size_t e, std::span<const float> merged) {
    if (!pass.kernel || !pass.fuse_lattice) std::copy(merged.begin(), merged.end(), pass.merged.begin() + static_cast<std::ptrdiff_t>(b));
    if (!pass.kernel) return;
    bool theta = true, momentum = true, sweep = true;
    for (size_t c = b; c < e; c += diloco::kReduceChunk) {
      const size_t ce = std::min(e, c + diloco::kReduceChunk), k = c / diloco::kReduceChunk;
      pass.step2[k] = pass.kernel->Apply(c, ce, merged.data() + (c - b), spans);
      pass.before2[k] = diloco::SumSquares(f.theta.data() + c, ce - c);
      pass.after2[k] = diloco::SumSquares(scratch_.theta.data() + c, ce - c);
      theta &= std::isfinite(pass.after2[k]) && Finite(scratch_.theta.data() + c, ce - c);
      if (pass.writes_momentum) {
        pass.momentum2[k] = diloco::SumSquares(scratch_.momentum.data() + c, ce - c);
        momentum &= Finite(scratch_.momentum.data() + c, ce - c);
      }
      if (spans.accum_out != nullptr) sweep &= Finite(spans.accum_out + c, ce - c);
      if (spans.start_out != nullptr) sweep &= Finite(spans.start_out + c, ce - c);
    }
    pass.finite[t] = static_cast<char>((theta ? kThetaFinite : 0) | (momentum ? kMomentumFinite : 0) | (sweep ? kSweepFinite : 0));
    if (theta && pass.fuse_lattice) {
      exchange::EncodeLatticeStepBlocks(f.copy->lattice(), f.copy->options().qmax, b / block, (e + block - 1) / block,
                                        scratch_.theta, f.copy->values(), scratch_.phi, pass.delta_parts[t],
                                        &pass.saturated[t]);
    }
  };
  merger->Run(source, sink, vet);
  report.weights = merger->weights();
  pass.merged_norm = merger->merged_norm();
  if (!pass.kernel) {  // ddp: the optimizer hook moves Θ whole
    std::copy(f.theta.begin(), f.theta.end(), scratch_.theta.begin());
    ATOLL_RETURN_IF_ERROR(rule_->Step(pass.merged, std::span<float>(scratch_.theta.data(), n)));
    pass.norms = MeasureRound(f.theta, std::span<const float>(scratch_.theta.data(), n), {}, f.sweep);
  } else {
    pass.norms.theta_before = std::sqrt(diloco::SegmentGrid::Total(pass.before2));
    pass.norms.step = std::sqrt(diloco::SegmentGrid::Total(pass.step2));
    pass.norms.momentum = std::sqrt(diloco::SegmentGrid::Total(pass.momentum2));
    for (char ok : pass.finite) {
      pass.norms.theta_finite &= (ok & kThetaFinite) != 0;
      pass.norms.momentum_finite &= (ok & kMomentumFinite) != 0;
      pass.norms.sweep_finite &= (ok & kSweepFinite) != 0;
    }
  }
  if (!pass.norms.theta_finite) return Status::Ok();  // refused by numeric safety
  if (pass.fuse_lattice) {
    for (auto& part : pass.delta_parts) pass.delta.insert(pass.delta.end(), part.begin(), part.end());
    return Status::Ok();
  }
  std::copy(f.copy->values().begin(), f.copy->values().end(), scratch_.phi.begin());
  exchange::LatticeStepStats stats;
  ATOLL_RETURN_IF_ERROR(exchange::EncodeLatticeStep(f.copy->lattice(), f.copy->options().qmax,
                                                    std::span<const float>(scratch_.theta.data(), n),
                                                    std::span<float>(scratch_.phi.data(), n), pass.delta, &stats,
                                                    pool_.get()));
  pass.saturated.assign(1, stats.saturated);
  return Status::Ok();
}

void SyncerCore::CommitRoundPass(int p, RoundPass& pass) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  f.theta.swap(scratch_.theta);
  if (pass.writes_momentum) f.momentum.swap(scratch_.momentum);
  if (pass.kernel && pass.kernel->keeps_accum()) f.sweep.accum.swap(scratch_.accum);
  if (pass.kernel && pass.kernel->keeps_start()) f.sweep.start.swap(scratch_.start);
  if (pass.kernel) pass.kernel->Finish(f.sweep);
  int64_t saturated = 0;
  for (int64_t s : pass.saturated) saturated += s;
  f.copy->Commit(scratch_.phi, std::move(pass.delta), f.version + 1, saturated);
  f.version += 1;
  f.theta_norm = pass.kernel ? std::sqrt(diloco::SegmentGrid::Total(pass.after2)) : diloco::L2Norm(f.theta);
}

RoundReport SyncerCore::RefuseRound(int p, RoundReport report, const Status& why) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  // Its contributions are dropped: kept, they would make the next close fail the same way.
  for (const auto& c : f.pending) {
    auto it = learners_.find(c.learner);
    if (it != learners_.end()) it->second.contributions_refused += 1;
  }
  f.pending.clear();
  f.opened_at.reset();
  f.quorum_at.reset();
  rounds_refused_ += 1;
  report.version = f.version;
  report.refused = true;
  report.refusal = why.message();
  report.reason = "refused: " + why.message() + " (" + report.reason + ")";
  return report;
}

}  // namespace atl::syncer
