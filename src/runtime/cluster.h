// Cluster: the processes of a local run (one syncer, or S syncer shards; M learners) and the
// faults chaos applies to them. Owned and driven by `atoll run`'s monitor loop (one thread).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/chaos/schedule.h"
#include "atoll/core/child_process.h"
#include "atoll/runtime/run_config.h"
#include "chaos_control.h"
#include "jsonl.h"

namespace atl::runtime {

// A learner process as `atoll run` sees it (syncer::LearnerState is what the syncer's table says).
enum class ProcessState { kRunning, kPaused, kDown, kDone, kFailed };

struct LearnerSlot {
  ChildProcess process;
  ProcessState state = ProcessState::kRunning;
  int incarnations = 0;
  double down_since = -1;   // run time the current outage began
  double dead_seconds = 0;  // total time down (killed, before restart)
  double paused_seconds = 0;
  std::optional<double> restart_at, resume_at, restore_control_at;
  std::vector<double> restarted_at;  // run times of restarts (rejoin latency is measured from them)
  int64_t last_step = 0;             // as last reported
  ChaosControl control;              // what its control file says
};

// One syncer process: the one syncer, or a shard of a sharded one (docs/decisions/011).
struct SyncerSlot {
  ChildProcess process;
  bool started = false;
  bool down = false;  // killed by chaos, not yet restarted
  std::optional<double> restart_at;
  int port = 0, http_port = 0;  // 0 until it first listened; kept for restarts
  double rebuild_wait_s = 0;    // > 0: its next start is a --rebuild with this wait (lose_syncer)
  std::string address;
};

class Cluster {
 public:
  Cluster(RunConfig config, std::string config_path);

  // Starts every syncer shard not running: the first time on port 0, a restart on its port.
  Status StartSyncer();
  Status StartLearner(int id, bool rejoin, int64_t start_step);
  // Shard 0 (the one syncer when unsharded): the operator's status calls and the status page.
  const std::string& address() const { return shards_.front().address; }
  int port() const { return shards_.front().port; }
  int http_port() const { return shards_.front().http_port; }  // its status page (0 until it started)
  ChildProcess& syncer() { return shards_.front().process; }
  // Every shard, in shard order (one when unsharded).
  std::vector<SyncerSlot>& shards() { return shards_; }
  // The learners' --syncer: every shard's address, comma-separated in shard order.
  std::string LearnerSyncers() const;
  // Where shard k writes (its --out: the run folder when unsharded, else <run>/syncer-k) and logs.
  std::string ShardOut(int k) const;
  std::string ShardLog(int k) const;
  // Some shard is down (killed, not yet restarted).
  bool syncer_down() const;
  std::vector<LearnerSlot>& learners() { return learners_; }

  // Applies one fault now (`now` = seconds since the learners started) and logs it.
  void Inject(const chaos::FaultEvent& e, double now);
  // Restarts, resumes and restores whatever is due at `now`.
  void Tick(double now);
  void Note(double now, const std::string& kind, int target, const std::string& note);
  // kill_syncer and lose_syncer: SIGKILL the shard the event names, and for lose_syncer delete its
  // state folder and restart it with --rebuild.
  void InjectSyncerFault(const chaos::FaultEvent& e, double now);
  const nlohmann::json& fault_log() const { return fault_log_; }
  // Marks learners that exited by themselves; returns ids that exited with an error.
  std::vector<int> ReapLearners(double now);
  bool AllLearnersFinished() const;
  // The global model's progress as last reported (fragment versions; in the synchronous modes the
  // number of completed barriers / all-reduced steps).
  void set_versions(std::vector<int64_t> v) { versions_ = std::move(v); }

 private:
  Status WriteControl(int id);
  Status StartShard(int k);
  std::string LearnerLog(int id) const;

  RunConfig c_;
  std::string config_path_, self_;
  std::vector<SyncerSlot> shards_;
  std::vector<LearnerSlot> learners_;
  std::vector<int64_t> versions_;
  JsonlWriter faults_;
  nlohmann::json fault_log_ = nlohmann::json::array();
};

// The run's fault schedule applied to the cluster: time-triggered faults once their time has come
// (InjectDue, every tick), step-triggered ones once their learner reached the step as last
// reported (InjectReached, after each status poll). Each fault once.
class ChaosInjector {
 public:
  ChaosInjector(Cluster& cluster, std::vector<chaos::FaultEvent> schedule)
      : cluster_(cluster), schedule_(std::move(schedule)), done_(schedule_.size(), false) {}
  void InjectDue(double now);
  void InjectReached(double now);

 private:
  Cluster& cluster_;
  const std::vector<chaos::FaultEvent> schedule_;  // time-triggered first, in time order
  std::vector<bool> done_;
  size_t next_timed_ = 0;
};

std::string TailOf(const std::string& path, size_t lines);

}  // namespace atl::runtime
