#include "atoll/chaos/schedule.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "atoll/core/rng.h"

namespace atl::chaos {

nlohmann::json FaultEvent::ToJson() const {
  nlohmann::json j = {{"kind", FaultKindName(kind)}, {"duration_s", duration_s}};
  if (at_step >= 0) {
    j["at_step"] = at_step;
  } else {
    j["at_s"] = at_s;
  }
  // kill_syncer: the syncer shard to kill, said only when not shard 0 (a sharded syncer).
  if (!TargetsSyncer(kind) || target > 0) j["learner"] = target;
  if (kind == FaultKind::kSlow || kind == FaultKind::kBandwidth || kind == FaultKind::kLoseSyncer) j["value"] = value;
  return j;
}

Status ValidateChaos(const ChaosConfig& c, int learners) {
  auto bad = [](const std::string& m) { return InvalidArgumentError("chaos: " + m); };
  const RandomChaos& r = c.random;
  if (c.mode == ChaosMode::kRandom) {
    if (!(r.learner_mtbf_s > 0)) return bad("learner_mtbf must be > 0 seconds");
    if (!(r.repair_s >= 0)) return bad("repair must be ≥ 0 seconds");
    if (r.straggler_every_s < 0 || r.partition_every_s < 0 || r.syncer_mtbf_s < 0)
      return bad("rates must be ≥ 0 (0 = off)");
    if (!(r.straggler_factor > 0 && r.straggler_factor <= 1)) return bad("straggler_factor must be in (0, 1]");
    if (r.straggler_s < 0 || r.partition_s < 0 || r.syncer_restart_s < 0 || r.start_after_s < 0)
      return bad("durations must be ≥ 0");
  }
  for (size_t i = 0; i < c.events.size(); ++i) {
    const FaultEvent& e = c.events[i];
    const std::string where = "event " + std::to_string(i) + ": ";
    if (!TargetsSyncer(e.kind) && (e.target < 0 || e.target >= learners))
      return bad(where + "learner " + std::to_string(e.target) + " out of range [0, " + std::to_string(learners) + ")");
    if (e.at_step < 0 && !(e.at_s >= 0)) return bad(where + "needs at_s ≥ 0 or at_step ≥ 0");
    if (!(e.duration_s >= 0)) return bad(where + "duration must be ≥ 0");
    if (e.kind == FaultKind::kSlow && !(e.value > 0 && e.value <= 1)) return bad(where + "slow needs value in (0, 1]");
    if (e.kind == FaultKind::kBandwidth && !(e.value > 0)) return bad(where + "bandwidth needs value > 0 (Mbit/s)");
    if (e.kind == FaultKind::kLoseSyncer && !(e.value >= 0 && e.value <= 3600))
      return bad(where + "lose_syncer's value (its --rebuild-wait) must be in [0, 3600] seconds (0: 30)");
    if ((e.kind == FaultKind::kPause || e.kind == FaultKind::kSlow || e.kind == FaultKind::kPartition ||
         e.kind == FaultKind::kBandwidth) &&
        e.duration_s <= 0)
      return bad(where + std::string(FaultKindName(e.kind)) + " needs a duration > 0");
  }
  return Status::Ok();
}

StatusOr<std::vector<FaultEvent>> BuildSchedule(const ChaosConfig& c, int learners, double duration_s) {
  ATOLL_RETURN_IF_ERROR(ValidateChaos(c, learners));
  std::vector<FaultEvent> out;
  if (c.mode == ChaosMode::kEvents) {
    out = c.events;
  } else if (c.mode == ChaosMode::kRandom) {
    const RandomChaos& r = c.random;
    Rng root(c.seed);
    auto repair = [&](Rng& rng) {
      switch (r.repair_dist) {
        case RepairDist::kFixed: return r.repair_s;
        case RepairDist::kLogNormal: return r.repair_s > 0 ? rng.LogNormal(r.repair_s, 0.5) : 0.0;
        case RepairDist::kExponential: break;
      }
      return r.repair_s > 0 ? rng.Exponential(r.repair_s) : 0.0;
    };
    for (int i = 0; i < learners; ++i) {
      // One independent stream per learner and fault type: adding a learner or a fault type
      // does not change the other learners' schedules.
      Rng fail = root.Fork(static_cast<uint64_t>(i) * 16 + 1);
      for (double t = r.start_after_s + fail.Exponential(r.learner_mtbf_s); t < duration_s;) {
        const double d = repair(fail);
        out.push_back({t, -1, FaultKind::kKill, i, d, 0});
        t += d + fail.Exponential(r.learner_mtbf_s);
      }
      if (r.straggler_every_s > 0) {
        Rng s = root.Fork(static_cast<uint64_t>(i) * 16 + 2);
        for (double t = r.start_after_s + s.Exponential(r.straggler_every_s); t < duration_s;
             t += r.straggler_s + s.Exponential(r.straggler_every_s)) {
          out.push_back({t, -1, FaultKind::kSlow, i, r.straggler_s, r.straggler_factor});
        }
      }
      if (r.partition_every_s > 0) {
        Rng s = root.Fork(static_cast<uint64_t>(i) * 16 + 3);
        for (double t = r.start_after_s + s.Exponential(r.partition_every_s); t < duration_s;
             t += r.partition_s + s.Exponential(r.partition_every_s)) {
          out.push_back({t, -1, FaultKind::kPartition, i, r.partition_s, 0});
        }
      }
    }
    if (r.syncer_mtbf_s > 0) {
      Rng s = root.Fork(1'000'003);
      for (double t = r.start_after_s + s.Exponential(r.syncer_mtbf_s); t < duration_s;
           t += r.syncer_restart_s + s.Exponential(r.syncer_mtbf_s)) {
        out.push_back({t, -1, FaultKind::kKillSyncer, -1, r.syncer_restart_s, 0});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const FaultEvent& a, const FaultEvent& b) {
    if ((a.at_step >= 0) != (b.at_step >= 0)) return a.at_step < 0;  // time-triggered first
    if (a.at_step < 0) return a.at_s < b.at_s;
    return false;
  });
  return out;
}

nlohmann::json ToJson(const ChaosConfig& c) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : c.events) events.push_back(e.ToJson());
  const RandomChaos& r = c.random;
  return {{"mode", ChaosModeName(c.mode)},
          {"seed", c.seed},
          {"learner_mtbf", r.learner_mtbf_s},
          {"repair", r.repair_s},
          {"repair_dist", RepairDistName(r.repair_dist)},
          {"straggler_every", r.straggler_every_s},
          {"straggler_factor", r.straggler_factor},
          {"straggler_duration", r.straggler_s},
          {"partition_every", r.partition_every_s},
          {"partition_duration", r.partition_s},
          {"syncer_mtbf", r.syncer_mtbf_s},
          {"syncer_restart", r.syncer_restart_s},
          {"start_after", r.start_after_s},
          {"events", events}};
}

namespace {

// The random schedule's keys of the [chaos] table; throws on a wrong type.
Status RandomFromJson(const nlohmann::json& j, RandomChaos& r) {
  r.learner_mtbf_s = j.value("learner_mtbf", r.learner_mtbf_s);
  r.repair_s = j.value("repair", r.repair_s);
  ATOLL_ASSIGN_OR_RETURN(r.repair_dist,
                         ParseRepairDist(j.value("repair_dist", std::string(RepairDistName(r.repair_dist)))));
  r.straggler_every_s = j.value("straggler_every", r.straggler_every_s);
  r.straggler_factor = j.value("straggler_factor", r.straggler_factor);
  r.straggler_s = j.value("straggler_duration", r.straggler_s);
  r.partition_every_s = j.value("partition_every", r.partition_every_s);
  r.partition_s = j.value("partition_duration", r.partition_s);
  r.syncer_mtbf_s = j.value("syncer_mtbf", r.syncer_mtbf_s);
  r.syncer_restart_s = j.value("syncer_restart", r.syncer_restart_s);
  r.start_after_s = j.value("start_after", r.start_after_s);
  return Status::Ok();
}

// One entry of the events list; throws on a wrong type.
StatusOr<FaultEvent> EventFromJson(const nlohmann::json& e) {
  static const std::set<std::string> ek = {"kind", "at_s", "at_step", "learner", "duration_s", "value"};
  for (const auto& [k, v] : e.items()) {
    if (!ek.count(k)) return InvalidArgumentError("unknown event key '" + k + "'");
  }
  FaultEvent ev;
  ATOLL_ASSIGN_OR_RETURN(ev.kind, ParseFaultKind(e.value("kind", std::string("?"))));
  ev.at_s = e.value("at_s", 0.0);
  ev.at_step = e.value("at_step", -1);
  ev.target = e.value("learner", TargetsSyncer(ev.kind) ? -1 : 0);
  ev.duration_s = e.value("duration_s", 0.0);
  ev.value = e.value("value", 0.0);
  return ev;
}

StatusOr<ChaosConfig> ChaosFromJsonOrThrow(const nlohmann::json& j) {
  ChaosConfig c;
  ATOLL_ASSIGN_OR_RETURN(c.mode, ParseChaosMode(j.value("mode", std::string(ChaosModeName(c.mode)))));
  c.seed = j.value("seed", c.seed);
  ATOLL_RETURN_IF_ERROR(RandomFromJson(j, c.random));
  for (const auto& e : j.value("events", nlohmann::json::array())) {
    ATOLL_ASSIGN_OR_RETURN(FaultEvent ev, EventFromJson(e));
    c.events.push_back(ev);
  }
  return c;
}

}  // namespace

StatusOr<ChaosConfig> ChaosFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgumentError("chaos: must be a table");
  static const std::set<std::string> known = {"mode",
                                              "seed",
                                              "learner_mtbf",
                                              "repair",
                                              "repair_dist",
                                              "straggler_every",
                                              "straggler_factor",
                                              "straggler_duration",
                                              "partition_every",
                                              "partition_duration",
                                              "syncer_mtbf",
                                              "syncer_restart",
                                              "start_after",
                                              "events"};
  for (const auto& [k, v] : j.items()) {
    if (!known.count(k)) return InvalidArgumentError("chaos: unknown key '" + k + "'");
  }
  try {
    auto c = ChaosFromJsonOrThrow(j);
    if (!c.ok()) return c.status().WithContext("chaos");
    return c;
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("chaos: wrong type: ") + e.what());
  }
}

}  // namespace atl::chaos
