// A push's influence (docs/decisions/020): how much of a fair share of its round it may move Θ_p by
// and vote with, judged against what the other learners' latest pushes of the fragment looked like
// — their sizes and, through a small sketch of each push's values, their directions. One learner
// cannot move either reference: both are upper medians over the others.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "atoll/diloco/codec.h"
#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {
namespace {

constexpr size_t kSketchRanges = 8, kSketchRange = 16;  // 128 values of each push
constexpr double kFirstSize = 0.05;  // no push of the fragment yet: 0.05 × (‖Θ_p‖ + 1) per √H steps

double Cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : NAN;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> SyncerCore::SketchRanges(size_t n) const {
  // Evenly spread contiguous ranges (every slice of a fragment is sampled); a small fragment whole.
  std::vector<std::pair<size_t, size_t>> ranges;
  if (n <= kSketchRanges * kSketchRange) {
    if (n > 0) ranges.emplace_back(0, n);
    return ranges;
  }
  for (size_t i = 0; i < kSketchRanges; ++i) {
    const size_t begin = i * (n - kSketchRange) / (kSketchRanges - 1);
    ranges.emplace_back(begin, begin + kSketchRange);
  }
  return ranges;
}

std::vector<float> SyncerCore::Sketch(std::span<const std::byte> raw, size_t n) const {
  std::vector<float> out;
  for (const auto& [begin, end] : SketchRanges(n)) {
    out.resize(out.size() + (end - begin));
    diloco::DecodeRawRange(options_.uplink, raw, n, begin, end, out.data() + out.size() - (end - begin));
  }
  return out;
}

double SyncerCore::SizeReference(const FragmentState& f, const RobustRefs& refs) const {
  if (refs.others > 0) return refs.size;
  if (!f.recent_norms.empty()) return UpperMedianOf(f.recent_norms);
  return kFirstSize * (f.theta_norm + 1) / std::sqrt(static_cast<double>(options_.H));
}

double SyncerCore::DirectionAgreement(int p, int id, const std::vector<float>& sketch, TimePoint now) const {
  // The upper median of its cosines with each other learner's latest push: an honest push agrees
  // with most of the others even when one of them is the attacker, which agrees with none.
  std::vector<double> cosines;
  for (const auto& [other, l] : learners_) {
    if (other == id || !IsReference(l, p, now)) continue;
    const PushSample& s = *l.SampleBefore(static_cast<size_t>(p), now);
    if (s.sketch.size() != sketch.size()) continue;
    const double c = Cosine(sketch, s.sketch);
    if (std::isfinite(c)) cosines.push_back(c);
  }
  if (cosines.empty() || static_cast<int>(cosines.size()) < std::max(1, options_.quarantine_min_learners)) return NAN;
  return UpperMedianOf(cosines);
}

SyncerCore::RobustRefs SyncerCore::RoundRefs(const FragmentState& f, const Contribution& c, double& agreement) const {
  // The other pushes of c's round (not zeros), with as many of them as the others' latest pushes
  // need: two honest ones among them hold both upper medians whatever a third push is.
  std::vector<double> sizes, cosines;
  for (const Contribution& o : f.pending) {
    if (o.learner == c.learner || !(o.share_size > 0)) continue;
    sizes.push_back(o.share_size);
    if (o.sketch.size() != c.sketch.size()) continue;
    const double cosine = Cosine(c.sketch, o.sketch);
    if (std::isfinite(cosine)) cosines.push_back(cosine);
  }
  RobustRefs r;
  agreement = NAN;
  const auto enough = [&](const std::vector<double>& v) {
    return !v.empty() && static_cast<int>(v.size()) >= std::max(1, options_.quarantine_min_learners);
  };
  if (!enough(sizes)) return r;
  r.others = static_cast<int>(sizes.size());
  r.size = UpperMedianOf(sizes);
  r.size_low = LowerMedianOf(sizes);
  if (enough(cosines)) agreement = UpperMedianOf(cosines);
  return r;
}

double SyncerCore::Influence(const FragmentState& f, double size, const RobustRefs& refs, double agreement,
                             bool final_sync, std::string& note) const {
  double u = 1;
  const double k = options_.influence_size_factor;
  const double ref = SizeReference(f, refs);
  if (k > 0 && ref > 0) {
    // Far below the others' sizes is a push that adds (next to) nothing, and must not count as a
    // member of a full round; the fragment's own history or scale only bound it from above. A final
    // sync is the last steps of a learner's schedule, where its learning rate decays: far below the
    // others' pushes of the run's middle by nature, it is bounded from above only (a small push
    // that counts fully in its round moves Θ_p by no more than its own size).
    if (!(size > 0)) {
      u = 0;
    } else if (size > k * ref) {
      u = k * ref / size;
    } else if (refs.others > 0 && !final_sync && size * k < refs.size_low) {
      u = size * k / refs.size_low;
    }
    if (u < 1) note += fmt::format("; size {:.4g} is {:.3g}x its reference {:.4g}", size, size / ref, ref);
  }
  const double cos0 = options_.influence_min_cosine;
  if (cos0 > 0 && u > 0 && std::isfinite(agreement) && agreement < cos0) {
    u *= std::max(0.0, agreement) / cos0;
    note += fmt::format("; its direction agrees with the others' by {:.3f} (cosine)", agreement);
  }
  if (u < 1) note += fmt::format(": influence {:.3g}", u);
  return u;
}

void SyncerCore::JudgeAtClose(int p, TimePoint now, std::string& note) {
  // Judged just after this instant: every push of the round is a reference for the others, one
  // that arrived at this very instant included (simulated time), and none judges itself.
  const TimePoint after = now + TimePoint{1};
  FragmentState& f = fragments_[static_cast<size_t>(p)];
  std::vector<const Contribution*> judged;
  for (Contribution& c : f.pending) {
    if (!c.judge_at_close) continue;
    RobustRefs refs = RefsFor(p, c.learner, after);
    double agreement = DirectionAgreement(p, c.learner, c.sketch, after);
    // Decoupled mode: a push that still has no references is judged by the other pushes of its
    // round (a fragment's first pushes, and final syncs after them, are no references); with too
    // few of those it keeps the u it had on arrival — never judged by the fragment's recent sizes
    // again, which now hold its own.
    if (!JudgesRoundsTogether() && refs.others == 0) refs = RoundRefs(f, c, agreement);
    if (JudgesRoundsTogether() || refs.others > 0) {
      std::string why;
      c.influence = Influence(f, c.share_size, refs, agreement, c.final_sync, why);
      if (!why.empty()) note += fmt::format("; learner {}'s push{}", c.learner, why);
    }
    c.max_weight *= c.influence * c.influence;
    c.judge_at_close = false;
    judged.push_back(&c);
  }
  for (Contribution& c : f.pending) c.sketch = {};
  // Only now: a learner's latest sample of this round takes its influence (TokenShare reads it,
  // and no push's judgement above did).
  for (const Contribution* c : judged) {
    auto it = learners_.find(c->learner);
    if (it == learners_.end() || it->second.samples.size() <= static_cast<size_t>(p)) continue;
    PushSample& s = it->second.samples[static_cast<size_t>(p)];
    if (s.version == f.version) s.influence = c->influence;
  }
}

double SyncerCore::TokenShare(const FragmentState& f, const std::vector<int>& live) const {
  // Tokens per step of every learner a full round would hold: the live ones and this round's.
  const size_t p = static_cast<size_t>(&f - fragments_.data());
  std::vector<int> members = live;
  double round_tps = 0;
  for (const auto& c : f.pending) {
    round_tps += c.c_steps > 0 ? static_cast<double>(c.c_tokens) / static_cast<double>(c.c_steps) : 0.0;
    if (std::find(members.begin(), members.end(), c.learner) == members.end()) members.push_back(c.learner);
  }
  const double fallback_tps = round_tps / static_cast<double>(std::max<size_t>(1, f.pending.size()));
  std::vector<double> member_tps;
  for (int id : members) {
    auto it = learners_.find(id);
    member_tps.push_back(it != learners_.end() && it->second.tokens_per_step > 0 ? it->second.tokens_per_step
                                                                                 : fallback_tps);
  }
  // Every learner moves Θ at most as a median one: its rate per step counts up to the members'
  // upper median (three or more members). A member counts for u of its latest push of the
  // fragment (a learner whose pushes count for nothing does not hold up the others' share); one
  // that pushes in this round counts in full unless its push is nothing — its u then bounds how
  // far the round moves Θ_p even when it is the only member (the last learner of a run: a full
  // round that counted its u too would cancel it, whatever the size of its push).
  const double cap = member_tps.size() >= 3 ? UpperMedianOf(member_tps) : std::numeric_limits<double>::infinity();
  double full = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    double u = -1;
    for (const auto& c : f.pending) {
      if (c.learner == members[i]) u = std::max(u, c.influence > 0 ? 1.0 : 0.0);
    }
    if (u < 0) {
      auto it = learners_.find(members[i]);
      u = it != learners_.end() && it->second.samples.size() > p ? it->second.samples[p].influence : 1.0;
    }
    full += std::min(member_tps[i], cap) * options_.H * u;
  }
  double round_tokens = 0;
  for (const auto& c : f.pending) {
    const double tps_c = c.c_steps > 0 ? static_cast<double>(c.c_tokens) / static_cast<double>(c.c_steps) : 0.0;
    // A final sync is the rest of the learner's work however short: it stands for a full span.
    const double steps = c.final_sync && c.c_steps > 0 && c.c_steps < options_.H ? options_.H : c.share_steps;
    round_tokens += steps * std::min(tps_c, cap) * c.influence;
  }
  if (!(round_tokens > 0)) return 1e-6;  // no tokens behind this round: it may not move Θ
  if (!(full > 0)) return 1.0;
  return std::clamp(round_tokens / full, 1e-6, 1.0);
}

}  // namespace atl::syncer
