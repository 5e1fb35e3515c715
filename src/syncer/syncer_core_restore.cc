// A SyncerCore's fragments and learner table as the durable state saves and restores them.
#include "atoll/syncer/syncer_core.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "atoll/diloco/merge.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {

SyncerCore::FragmentSnapshot SyncerCore::SnapshotFragment(int fragment) const {
  const FragmentState& f = fragments_[static_cast<size_t>(fragment)];
  FragmentSnapshot s{f.version, f.theta, f.momentum, {}, {}, f.sweep.share};
  if (f.copy) {
    s.public_values.assign(f.copy->values().begin(), f.copy->values().end());
    s.lattice_exp = f.copy->lattice().exp;
  }
  return s;
}

Status SyncerCore::RestoreFragment(int fragment, FragmentSnapshot snap) {
  if (fragment < 0 || fragment >= plan_.num_fragments()) return InvalidArgumentError("restore: bad fragment");
  FragmentState& f = fragments_[static_cast<size_t>(fragment)];
  if (!f.copy)
    return InvalidArgumentError("restore: fragment " + std::to_string(fragment) + " belongs to another shard");
  const size_t n = f.theta.size();
  if (snap.theta.size() != n || (!snap.momentum.empty() && snap.momentum.size() != n) ||
      (!snap.public_values.empty() && snap.public_values.size() != n)) {
    return InvalidArgumentError("restore: fragment " + std::to_string(fragment) + " has " +
                                std::to_string(snap.theta.size()) + " values, the plan " + std::to_string(n));
  }
  if (!exchange::AllFinite(snap.theta) || !exchange::AllFinite(snap.momentum) ||
      !exchange::AllFinite(snap.public_values) || snap.version < 0 || !std::isfinite(snap.sweep_share) ||
      snap.sweep_share < 0 || snap.sweep_share > 1) {
    return InvalidArgumentError("restore: fragment " + std::to_string(fragment) + " holds invalid values");
  }
  exchange::Lattice lattice = f.copy->lattice();
  std::vector<float> values = std::move(snap.public_values);
  if (!values.empty()) {
    if (snap.lattice_exp.size() != lattice.exp.size()) {
      return InvalidArgumentError("restore: fragment " + std::to_string(fragment) + " has a lattice of " +
                                  std::to_string(snap.lattice_exp.size()) + " blocks, the plan " +
                                  std::to_string(lattice.exp.size()));
    }
    lattice.exp = std::move(snap.lattice_exp);
  } else {  // no public copy saved: Φ from Θ on the initial lattice; every learner fetches in full
    values = snap.theta;
    exchange::SnapToLattice(lattice, values);
  }
  auto copy = PublicCopy::Restore(std::move(lattice), std::move(values), snap.version, CopyOptions(n));
  if (!copy.ok()) return copy.status().WithContext("restore: fragment " + std::to_string(fragment));
  f.theta = std::move(snap.theta);
  f.theta.reserve(plan_.largest_numel());  // swapped with the round's scratch (round_close.cc)
  f.theta_norm = diloco::L2Norm(f.theta);
  if (KeepsMomentum()) {
    f.momentum = snap.momentum.empty() ? std::vector<float>(n, 0.0f) : std::move(snap.momentum);
  } else {
    f.momentum.clear();
  }
  f.copy.emplace(std::move(*copy));
  f.version = snap.version;
  f.sweep = {};  // a partial sweep's accumulator is not persisted: its rounds are in Θ already
  f.sweep.share = f.momentum.empty() ? snap.sweep_share : 0;
  f.pending.clear();
  f.opened_at.reset();
  f.quorum_at.reset();
  return Status::Ok();
}

void SyncerCore::RestoreLearners(const std::map<int, LearnerRecord>& learners, TimePoint now) {
  for (const auto& [id, l] : learners) {
    LearnerRecord r = l;
    r.last_seen = now;
    if (r.state != LearnerState::kDone) r.state = LearnerState::kJoining;
    // The table is written just before the fragments at a commit: a kill between the two leaves
    // a merge recorded here for a version the restored fragment never reached. That push is not
    // in Θ, so it must not count as merged for the learner's rejoin (it is pushed again).
    r.merged_versions.resize(fragments_.size(), -1);
    for (size_t p = 0; p < fragments_.size(); ++p) {
      if (r.merged_versions[p] > fragments_[p].version) r.merged_versions[p] = -1;
    }
    // Its latest pushes, for the robust references: none from a version the fragment never reached.
    r.samples.resize(fragments_.size());
    for (size_t p = 0; p < fragments_.size(); ++p) {
      if (r.samples[p].version > fragments_[p].version) r.samples[p] = PushSample{};
    }
    // Its allowances count from now, and how long the syncer was down (while the learner trained
    // on) is not known: its first push of each fragment may be credited what a push without any
    // rate may (max_steps_factor × H steps), the time bound holding from the next one on. Its
    // share carries one full push's worth. Its push session ended with the old process: it joins again.
    const auto H = static_cast<double>(options_.H);
    const double carried = std::max(H, options_.max_steps_factor * H);
    r.allowances.resize(fragments_.size());
    for (StepAllowance& a : r.allowances) a = {now, carried, a.rate, H, a.rate};
    r.push_session = 0;
    r.push_seq = 0;
    learners_[id] = r;
  }
}

}  // namespace atl::syncer
