// What a SyncerCore reports of itself: the buffers it holds (the memory bound's test counts them)
// and the Status JSON (the status page, `atoll status`, the Status RPC).
#include <algorithm>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/syncer/syncer_core.h"

namespace atl::syncer {

SyncerCore::HeldBytes SyncerCore::held_bytes() const {
  HeldBytes b;
  for (const FragmentState& f : fragments_) {
    b.theta += f.theta.capacity() * sizeof(float);
    b.momentum += f.momentum.capacity() * sizeof(float);
    b.sweep += (f.sweep.accum.capacity() + f.sweep.start.capacity()) * sizeof(float);
    if (f.copy) b.public_copies += f.copy->HeldBytes();
    for (const Contribution& c : f.pending) b.pending += c.raw.capacity();
  }
  b.scratch = (scratch_.theta.capacity() + scratch_.momentum.capacity() + scratch_.accum.capacity() +
               scratch_.start.capacity() + scratch_.phi.capacity() + scratch_.sums.capacity()) *
                  sizeof(float) +
              scratch_.delta.capacity();
  for (const auto& part : scratch_.delta_parts) b.scratch += part.capacity();
  for (const auto& [id, l] : learners_)
    b.learners += sizeof(l) + l.host.capacity() + l.merged_versions.capacity() * sizeof(int64_t);
  return b;
}

double SyncerCore::tokens_merged() const {
  double t = 0;
  for (const auto& [id, l] : learners_) t += l.tokens_merged;
  return t;
}

nlohmann::json SyncerCore::StatusJson(TimePoint now) const {
  nlohmann::json j;
  j["run_id"] = options_.run_id;
  j["mode"] = diloco::ModeName(options_.mode);
  j["fragments"] = plan_.num_fragments();
  if (options_.shard.count > 1) {  // unsharded: the document is as before shards existed
    j["shard"] = options_.shard.ToString();
    std::vector<int> owned;
    for (int p = 0; p < plan_.num_fragments(); ++p) {
      if (owns(p)) owned.push_back(p);
    }
    j["owned_fragments"] = owned;
  }
  j["params"] = plan_.total_numel;
  j["rounds"] = rounds_closed_;
  j["rounds_refused"] = rounds_refused_;
  int64_t saturated = 0;
  for (const auto& f : fragments_) saturated += f.copy ? f.copy->saturated() : 0;
  j["public_copy_saturated"] = saturated;  // values held at the lattice's edge (docs/decisions/014)
  j["versions"] = versions();
  j["t_step_s"] = estimates_.step_seconds;
  j["t_sync_s"] = estimates_.sync_seconds;
  j["live"] = LiveLearners(now);
  if (global_eval_loss_ >= 0) {
    j["global_eval_loss"] = global_eval_loss_;
    j["global_eval_rounds"] = global_eval_rounds_;
  }
  int64_t up = 0, down = 0;
  nlohmann::json ls = nlohmann::json::array();
  for (const auto& [id, l] : learners_) {
    up += l.bytes_up;
    down += l.bytes_down;
    ls.push_back(LearnerStatusJson(id, l, now));
  }
  j["learners"] = ls;
  j["bytes_up"] = up;
  j["bytes_down"] = down;
  if (rebuild_until_) j["rebuilt"] = RebuildJson(now);
  if (options_.leadership.epoch != 0) {
    j["leadership"] = {{"epoch", options_.leadership.epoch},
                       {"candidate", options_.leadership.candidate_id},
                       {"took_over", options_.leadership.took_over},
                       {"from_replica", options_.leadership.from_replica}};
  }
  return j;
}

nlohmann::json SyncerCore::LearnerStatusJson(int id, const LearnerRecord& l, TimePoint now) {
  double influence = 0;  // its latest pushes' influence, the mean over the fragments it pushed
  int pushed = 0;
  for (const PushSample& sample : l.samples) {
    if (sample.version < 0 && sample.influence == 1) continue;
    influence += sample.influence;
    ++pushed;
  }
  double tokens_held = 0;  // held credit (LearnerRecord::held), ÷ P as tokens_merged: held has P entries
  for (const auto& h : l.held) tokens_held += h.tokens / static_cast<double>(l.held.size());
  return {{"id", id},
          {"host", l.host},
          {"state", LearnerStateName(l.state)},
          {"joins", l.joins},
          {"step", l.step},
          {"tokens", l.tokens},
          {"loss", l.loss},
          {"version_held", l.version_held},
          {"tokens_per_second", l.tokens_per_second},
          {"step_seconds", l.step_seconds},
          {"bytes_up", l.bytes_up},
          {"bytes_down", l.bytes_down},
          {"pushes", l.pushes},
          {"pushes_rejected", l.pushes_rejected},
          {"quarantined", l.quarantined},
          {"contributions_refused", l.contributions_refused},
          {"telemetry_rejected", l.telemetry_rejected},
          {"disconnected", l.banned_until > TimePoint{} && now < l.banned_until},
          {"rounds_joined", l.rounds_joined},
          {"replays_refused", l.replays_refused},
          {"influence", pushed > 0 ? influence / pushed : 1.0},
          {"late_folded", l.late_folded},
          {"tokens_merged", l.tokens_merged},
          {"tokens_held", tokens_held},
          {"seconds_since_seen", ToSeconds(now - l.last_seen)}};
}

}  // namespace atl::syncer
