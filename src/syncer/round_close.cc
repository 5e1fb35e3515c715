// Closing a round of fragment p: one tiled pass over the fragment on the core's pool that decodes
// the pushes, merges them, takes the outer step into the core's scratch Θ and the public copy's
// next values into its scratch Φ (the optimizer's state moves in place, the old values of every
// tile saved first); numeric safety then commits the round (the scratch buffers are swapped in) or
// refuses it (the saved values are put back: nothing changed). docs/decisions/018.
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

// A scratch buffer of n values: reserved for the largest fragment once (pages are touched only as
// the rounds use them), so a round never allocates.
void Size(std::vector<float>& v, size_t n, size_t capacity) {
  if (v.capacity() < capacity) v.reserve(capacity);
  v.resize(n);
}

void Save(const float* from, size_t begin, size_t end, std::vector<float>& to) {
  std::copy(from + begin, from + end, to.begin() + static_cast<std::ptrdiff_t>(begin));
}

}  // namespace

// What a round's pass works with and measures.
struct SyncerCore::RoundPass {
  std::vector<double> weights;                    // per pending contribution
  std::map<int64_t, std::vector<float>> bases;    // Φ_p at older versions that contributions were computed against
  std::vector<std::span<const float>> base_of;    // per contribution (empty: kBase or ddp)
  std::optional<diloco::OuterStepKernel> kernel;  // outer rules; ddp moves Θ whole
  bool accum_sized = false, start_sized = false, writes_momentum = false, fuse_lattice = false;
  size_t vetted_out = 0;
  // Per reduction chunk of the fragment: Σ Θ_before², Σ Θ_after², Σ (Θ_after − Θ_before)², Σ momentum².
  std::vector<double> before2, after2, step2, momentum2;
  std::vector<uint64_t> phi_checksums;  // per tile: the fused lattice step's next Φ
  std::vector<int64_t> saturated;       // per tile
  std::vector<char> finite;             // per tile: kThetaFinite | kMomentumFinite | kSweepFinite
  std::vector<float> merged;            // ddp only (its hook moves Θ whole)
  std::vector<std::byte> delta;
  bool started = false, lattice_unfused = false;  // the pass has moved values / the lattice step ran whole
  RoundNorms norms;
  double merged_norm = 0;
};

RoundReport SyncerCore::CloseRound(int p, const RoundDecision& d, TimePoint now, const Clock& clock) {
  const TimePoint t0 = clock.Now();
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  RoundReport report;
  report.fragment = p;
  report.round = f.version;  // round r makes version r + 1
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
  if (!st.ok()) {
    RestoreRoundPass(p, pass);
    return RefuseRound(p, std::move(report), st);
  }
  if (pass.kernel) report.sweep_completed = pass.kernel->completes_sweep();
  CommitRoundPass(p, pass);
  report.version = f.version;
  if (pass.vetted_out > 0) {
    report.reason += fmt::format(" ({} contribution(s) left out: outer gradient beyond the bound)", pass.vetted_out);
  }
  for (const auto& c : f.pending) {
    auto it = learners_.find(c.learner);
    if (it == learners_.end()) continue;
    LearnerRecord& l = it->second;
    l.rounds_joined += 1;
    l.tokens_merged += static_cast<double>(c.c_tokens) / plan_.num_fragments();
    l.merged_versions.resize(fragments_.size(), -1);
    l.merged_versions[static_cast<size_t>(p)] = f.version;
    if (c.held_steps > 0) {
      l.held.resize(fragments_.size());
      l.held[static_cast<size_t>(p)].steps += c.held_steps;
      l.held[static_cast<size_t>(p)].tokens += c.held_tokens;
      ReleaseHeldCredit(l, now);  // its last heartbeat may already count them (a learner that left)
    }
  }
  f.pending.clear();
  f.opened_at.reset();
  f.quorum_at.reset();
  rounds_closed_ += 1;
  report.close_seconds = ToSeconds(clock.Now() - t0);
  estimates_.sync_seconds = Ema(estimates_.sync_seconds, report.close_seconds);
  return report;
}

Status SyncerCore::PrepareRoundPass(int p, RoundPass& pass, RoundReport& report) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const size_t n = f.theta.size();
  const size_t capacity = plan_.largest_numel();
  // Φ_p at the versions late pushes were computed against (each once, a copy: Φ_p itself moves in
  // the pass): exact, from the history.
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
      auto again = rule_->Kernel(report.token_share, diloco::SweepState{}, !f.momentum.empty());
      if (!again->ok()) return again->status();
      pass.kernel = std::move(**again);
    }
    // The momentum moves every round under kRound, at a sweep's end otherwise (else it is only read).
    pass.writes_momentum = pass.kernel->keeps_momentum() &&
                           (options_.outer_step == OuterStepRule::kRound || pass.kernel->completes_sweep());
    pass.start_sized = f.sweep.start.size() == n;
    // Buffers a sweep's first round creates (a refused round drops them again).
    if (pass.kernel->keeps_accum() && !pass.accum_sized) f.sweep.accum.assign(n, 0.0f);
    if (pass.kernel->keeps_start() && !pass.start_sized) f.sweep.start.assign(f.theta.begin(), f.theta.end());
  }
  Size(scratch_.theta, n, capacity);
  Size(scratch_.phi, n, capacity);
  if (pass.writes_momentum) Size(scratch_.momentum, n, capacity);
  if (pass.kernel && pass.kernel->keeps_accum()) Size(scratch_.accum, n, capacity);
  if (pass.kernel && pass.kernel->keeps_start()) Size(scratch_.start, n, capacity);
  return Status::Ok();
}

// The outer step, numeric safety's sums and the lattice step of one tile whose merged values are
// `merged`: Θ's next values into scratch (Θ itself is the pass's reference until the commit), the
// optimizer's state in place (old values saved first).
void SyncerCore::ApplyTile(int p, RoundPass& pass, size_t t, size_t b, size_t e, std::span<const float> merged) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const diloco::OuterStepSpans spans = {.theta = f.theta.data(),
                                        .theta_out = scratch_.theta.data(),
                                        .momentum = f.momentum.empty() ? nullptr : f.momentum.data(),
                                        .momentum_out = f.momentum.empty() ? nullptr : f.momentum.data(),
                                        .accum = pass.kernel->keeps_accum() ? f.sweep.accum.data() : nullptr,
                                        .accum_out = pass.kernel->keeps_accum() ? f.sweep.accum.data() : nullptr,
                                        .start = pass.kernel->keeps_start() ? f.sweep.start.data() : nullptr,
                                        .start_out = pass.kernel->keeps_start() ? f.sweep.start.data() : nullptr};
  if (pass.writes_momentum) Save(f.momentum.data(), b, e, scratch_.momentum);
  if (spans.accum != nullptr) Save(spans.accum, b, e, scratch_.accum);
  if (spans.start != nullptr) Save(spans.start, b, e, scratch_.start);
  bool theta = true, momentum = true, sweep = true;
  for (size_t c = b; c < e; c += diloco::kReduceChunk) {
    const size_t ce = std::min(e, c + diloco::kReduceChunk), k = c / diloco::kReduceChunk;
    const auto measures = pass.kernel->ApplyMeasured(c, ce, merged.data() + (c - b), spans, nullptr);
    pass.step2[k] = measures.step2;
    pass.before2[k] = measures.before2;
    pass.after2[k] = measures.after2;
    theta &= std::isfinite(pass.after2[k]) && measures.finite;
    if (pass.writes_momentum) {
      pass.momentum2[k] = diloco::SumSquares(f.momentum.data() + c, ce - c);
      momentum &= Finite(f.momentum.data() + c, ce - c);
    }
    if (spans.accum != nullptr) sweep &= Finite(spans.accum + c, ce - c);
    if (spans.start != nullptr) sweep &= Finite(spans.start + c, ce - c);
  }
  pass.finite[t] =
      static_cast<char>((theta ? kThetaFinite : 0) | (momentum ? kMomentumFinite : 0) | (sweep ? kSweepFinite : 0));
  if (theta && pass.fuse_lattice) {
    // Φ's next values into scratch (swapped in at the commit; a refused round leaves Φ as it was),
    // checksummed while the tile is in cache (a tile is one checksum piece).
    const size_t block = static_cast<size_t>(f.copy->lattice().block);
    exchange::EncodeLatticeStepBlocks(f.copy->lattice(), f.copy->options().qmax, b / block, (e + block - 1) / block,
                                      scratch_.theta, f.copy->values(), scratch_.phi, scratch_.delta_parts[t],
                                      &pass.saturated[t]);
    pass.phi_checksums[t] = exchange::PieceChecksum(std::span<const float>(scratch_.phi).subspan(b, e - b));
  }
}

Status SyncerCore::RunRoundPass(int p, RoundPass& pass, RoundReport& report) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const size_t n = f.theta.size();
  ATOLL_RETURN_IF_ERROR(PrepareRoundPass(p, pass, report));
  auto merger = diloco::FragmentMerger::Create(plan_.fragments[static_cast<size_t>(p)], rule_->merge_rule(),
                                               pass.weights, pool_.get());
  if (!merger.ok()) return merger.status().WithContext("merge");
  if (const size_t capacity = plan_.largest_numel(); scratch_.sums.capacity() < capacity)
    scratch_.sums.reserve(capacity);
  merger->KeepSums(&scratch_.sums);
  for (size_t m = 0; m < f.pending.size(); ++m) {
    if (f.pending[m].norm >= 0) merger->GiveNorms(m, f.pending[m].slice_norms, f.pending[m].norm);
  }
  const diloco::SegmentGrid& grid = merger->grid();
  pass.fuse_lattice = pass.kernel.has_value() &&
                      grid.tile_values() % static_cast<size_t>(f.copy->lattice().block) == 0 &&
                      grid.tile_values() == exchange::kChecksumPieceValues;
  const size_t chunks = (n + diloco::kReduceChunk - 1) / diloco::kReduceChunk;
  for (auto* v : {&pass.before2, &pass.after2, &pass.step2, &pass.momentum2}) v->assign(chunks, 0.0);
  // Per tile, joined in order at the end; kept between rounds (cleared, their capacity stays).
  if (scratch_.delta_parts.size() < grid.num_tiles()) scratch_.delta_parts.resize(grid.num_tiles());
  for (auto& part : scratch_.delta_parts) part.clear();
  pass.phi_checksums.assign(grid.num_tiles(), 0);
  pass.saturated.assign(grid.num_tiles(), 0);
  pass.finite.assign(grid.num_tiles(), kThetaFinite | kMomentumFinite | kSweepFinite);
  if (!pass.kernel) pass.merged.resize(n);  // the ddp step moves Θ whole from it
  pass.started = true;

  std::vector<diloco::EncodedGradients::Push> pushes;
  for (size_t m = 0; m < f.pending.size(); ++m) {
    pushes.push_back({.raw = f.pending[m].raw, .base = pass.base_of[m].empty() ? nullptr : pass.base_of[m].data()});
  }
  const diloco::EncodedGradients source(options_.uplink, n, rule_->Reference(f.theta, f.sweep).data(),
                                        std::move(pushes));
  diloco::FragmentMerger::Vet vet;
  if (pass.kernel) {
    vet = [&](size_t, double norm) {
      const bool ok = CheckOuterGradientBound(norm, f.theta_norm, options_.max_gradient_ratio).ok();
      if (!ok) pass.vetted_out += 1;
      return ok;
    };
  }
  merger->Run(
      source,
      [&](size_t t, size_t b, size_t e, std::span<const float> merged) {
        if (!pass.merged.empty())
          std::copy(merged.begin(), merged.end(), pass.merged.begin() + static_cast<std::ptrdiff_t>(b));
        if (pass.kernel) ApplyTile(p, pass, t, b, e, merged);
      },
      vet);
  report.weights = merger->weights();
  pass.merged_norm = merger->merged_norm();
  return FinishRoundPass(p, pass);
}

// What the tiles leave to do: the ddp step (the hook moves Θ whole), numeric safety's norms, the
// lattice step when it could not be fused (a block that does not divide the tiles).
Status SyncerCore::FinishRoundPass(int p, RoundPass& pass) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const size_t n = f.theta.size();
  if (!pass.kernel) {
    std::copy(f.theta.begin(), f.theta.end(), scratch_.theta.begin());
    ATOLL_RETURN_IF_ERROR(rule_->Step(pass.merged, f.theta));
    pass.norms = MeasureRound(std::span<const float>(scratch_.theta.data(), n), f.theta, {}, f.sweep);
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
    // Into the buffer a history let go at an earlier commit (no fresh pages when it is as large).
    size_t bytes = 0;
    for (const auto& part : scratch_.delta_parts) bytes += part.size();
    pass.delta = std::move(scratch_.delta);
    pass.delta.clear();
    pass.delta.reserve(bytes);
    for (const auto& part : scratch_.delta_parts) pass.delta.insert(pass.delta.end(), part.begin(), part.end());
    return Status::Ok();
  }
  const std::span<float> phi = f.copy->values_for_advance();
  std::copy(phi.begin(), phi.end(), scratch_.phi.begin());
  exchange::LatticeStepStats stats;
  pass.lattice_unfused = true;
  const std::vector<float>& next_theta = pass.kernel ? scratch_.theta : f.theta;
  ATOLL_RETURN_IF_ERROR(exchange::EncodeLatticeStep(f.copy->lattice(), f.copy->options().qmax, next_theta, phi,
                                                    pass.delta, &stats, pool_.get()));
  pass.saturated.assign(1, stats.saturated);
  return Status::Ok();
}

void SyncerCore::CommitRoundPass(int p, RoundPass& pass) {
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  if (pass.kernel) {
    pass.kernel->Finish(f.sweep);
    f.theta.swap(scratch_.theta);  // both hold the largest fragment's capacity: nothing is allocated
  }
  int64_t saturated = 0;
  for (int64_t s : pass.saturated) saturated += s;
  std::vector<std::byte> spare;
  if (pass.fuse_lattice) {
    spare = f.copy->Commit(scratch_.phi, std::move(pass.delta), f.version + 1, saturated,
                           exchange::CombinePieceChecksums(pass.phi_checksums, f.theta.size()));
  } else {
    spare = f.copy->CommitInPlace(std::move(pass.delta), f.version + 1, saturated);
  }
  if (spare.capacity() > scratch_.delta.capacity()) scratch_.delta = std::move(spare);
  f.version += 1;
  f.theta_norm = pass.kernel ? std::sqrt(diloco::SegmentGrid::Total(pass.after2)) : diloco::L2Norm(f.theta);
}

// A refused round: the saved values go back where the pass moved them.
void SyncerCore::RestoreRoundPass(int p, RoundPass& pass) {
  if (!pass.started) return;
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  const size_t n = f.theta.size();
  const auto back = [n](const std::vector<float>& saved, float* to) {
    std::copy(saved.begin(), saved.begin() + static_cast<std::ptrdiff_t>(n), to);
  };
  if (!pass.kernel) back(scratch_.theta, f.theta.data());  // ddp moved Θ in place; the kernel wrote scratch
  if (pass.writes_momentum) back(scratch_.momentum, f.momentum.data());
  if (pass.kernel && pass.kernel->keeps_accum()) {
    if (pass.accum_sized) back(scratch_.accum, f.sweep.accum.data());
    else f.sweep.accum.clear();
  }
  if (pass.kernel && pass.kernel->keeps_start()) {
    if (pass.start_sized) back(scratch_.start, f.sweep.start.data());
    else f.sweep.start.clear();
  }
  // Φ moved in place only when the lattice step ran whole (not fused: the fused step writes the
  // next values into scratch, and a refused round never swaps them in).
  if (pass.lattice_unfused) back(scratch_.phi, f.copy->values_for_advance().data());
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
