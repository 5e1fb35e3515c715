// Chaos schedules: the faults a run injects on purpose, as a list of events that is a pure
// function of (options, seed, learners, duration) — the same seed gives the same list, so a
// chaos run can be replayed exactly. Either random (per-learner failures with a mean time
// between failures and a repair-time distribution, straggler episodes, network faults, optional
// syncer crashes) or an explicit event list.
//
// Events are applied by the runtime (src/runtime/cluster.cc): kill = SIGKILL then restart after
// `duration_s`; pause = SIGSTOP then SIGCONT; slow = the learner trains at `value` × its speed;
// partition = the learner cannot reach the syncer; bandwidth = its link is capped at `value`
// Mbit/s; kill_syncer = SIGKILL the syncer, restart after `duration_s` from its durable state;
// lose_syncer = the syncer's host lost: SIGKILL, its state folder deleted, restart after
// `duration_s` with --rebuild (docs/decisions/021; `value` its --rebuild-wait in seconds, 0: 30).
// Thread-safety: pure functions and values.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"

namespace atl::chaos {

enum class FaultKind { kKill, kPause, kSlow, kPartition, kBandwidth, kKillSyncer, kLoseSyncer };
inline constexpr EnumNames<FaultKind, 7> kFaultKindNames{"fault kind",
                                                         {{{FaultKind::kKill, "kill"},
                                                           {FaultKind::kPause, "pause"},
                                                           {FaultKind::kSlow, "slow"},
                                                           {FaultKind::kPartition, "partition"},
                                                           {FaultKind::kBandwidth, "bandwidth"},
                                                           {FaultKind::kKillSyncer, "kill_syncer"},
                                                           {FaultKind::kLoseSyncer, "lose_syncer"}}}};
// Whether a fault of this kind hits a syncer (its `learner` field names the shard), not a learner.
inline bool TargetsSyncer(FaultKind kind) { return kind == FaultKind::kKillSyncer || kind == FaultKind::kLoseSyncer; }
constexpr const auto& NamesOf(FaultKind) { return kFaultKindNames; }
inline const char* FaultKindName(FaultKind kind) { return kFaultKindNames.Name(kind); }
inline StatusOr<FaultKind> ParseFaultKind(std::string_view name) { return kFaultKindNames.Parse(name); }

// Where a run's faults come from: none, drawn at random from RandomChaos, or the explicit list.
enum class ChaosMode { kNone, kRandom, kEvents };
inline constexpr EnumNames<ChaosMode, 3> kChaosModeNames{
    "chaos mode", {{{ChaosMode::kNone, "none"}, {ChaosMode::kRandom, "random"}, {ChaosMode::kEvents, "events"}}}};
constexpr const auto& NamesOf(ChaosMode) { return kChaosModeNames; }
inline const char* ChaosModeName(ChaosMode m) { return kChaosModeNames.Name(m); }
inline StatusOr<ChaosMode> ParseChaosMode(std::string_view s) { return kChaosModeNames.Parse(s); }

// A killed learner's repair time: exponential or fixed with mean `repair`, or log-normal with
// median `repair` and sigma 0.5. (sim::RepairDist is the fleet model's, parameterised by its mean.)
enum class RepairDist { kExponential, kFixed, kLogNormal };
inline constexpr EnumNames<RepairDist, 3> kRepairDistNames{"repair_dist",
                                                           {{{RepairDist::kExponential, "exponential"},
                                                             {RepairDist::kFixed, "fixed"},
                                                             {RepairDist::kLogNormal, "lognormal"}}}};
constexpr const auto& NamesOf(RepairDist) { return kRepairDistNames; }
inline const char* RepairDistName(RepairDist d) { return kRepairDistNames.Name(d); }
inline StatusOr<RepairDist> ParseRepairDist(std::string_view s) { return kRepairDistNames.Parse(s); }

struct FaultEvent {
  double at_s = 0;   // seconds after the learners started (ignored when at_step ≥ 0)
  int at_step = -1;  // or: when the target learner reaches this inner step
  FaultKind kind = FaultKind::kKill;
  int target = 0;         // learner id; kill_syncer: the syncer shard (< 0: shard 0)
  double duration_s = 0;  // repair time / pause / episode length; 0 = permanent (kill: never back)
  double value = 0;       // slow: speed factor in (0,1]; bandwidth: Mbit/s

  nlohmann::json ToJson() const;
  bool operator==(const FaultEvent& o) const = default;
};

struct RandomChaos {
  double learner_mtbf_s = 120;  // mean time between failures of one learner (exponential)
  double repair_s = 10;         // mean (or fixed) repair time
  RepairDist repair_dist = RepairDist::kExponential;
  double straggler_every_s = 0;  // mean time between straggler episodes per learner; 0 = none
  double straggler_factor = 0.3;
  double straggler_s = 10;
  double partition_every_s = 0;  // mean time between partitions per learner; 0 = none
  double partition_s = 5;
  double syncer_mtbf_s = 0;  // 0 = the syncer never crashes
  double syncer_restart_s = 3;
  double start_after_s = 5;  // no faults before this (let the cluster form)
};

struct ChaosConfig {
  ChaosMode mode = ChaosMode::kNone;
  uint64_t seed = 0;
  RandomChaos random;
  std::vector<FaultEvent> events;
};

// InvalidArgument naming the bad field.
Status ValidateChaos(const ChaosConfig& config, int learners);

// The fault list for a run of `learners` learners lasting about `duration_s` seconds, sorted by
// time (time-triggered first, then step-triggered in list order). Deterministic in the seed.
// A learner is never killed again while it is down (its next failure is drawn after repair).
StatusOr<std::vector<FaultEvent>> BuildSchedule(const ChaosConfig& config, int learners, double duration_s);

nlohmann::json ToJson(const ChaosConfig& config);
// Reads the [chaos] table (as JSON). Unknown keys are an error.
StatusOr<ChaosConfig> ChaosFromJson(const nlohmann::json& j);

}  // namespace atl::chaos
