// Cluster: the processes of a local run (one syncer, M learners) and the faults chaos applies to
// them. Owned and driven by `atoll run`'s monitor loop (one thread).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/chaos/schedule.h"
#include "atoll/core/child_process.h"
#include "atoll/runtime/run_config.h"
#include "jsonl.h"

namespace atl::runtime {

enum class LearnerState { kRunning, kPaused, kDown, kDone, kFailed };

struct LearnerSlot {
  ChildProcess process;
  LearnerState state = LearnerState::kRunning;
  int incarnations = 0;
  double down_since = -1;         // run time the current outage began
  double dead_seconds = 0;        // total time down (killed, before restart)
  double paused_seconds = 0;
  std::optional<double> restart_at, resume_at, restore_control_at;
  std::vector<double> restarted_at;  // run times of restarts (rejoin latency is measured from them)
  int64_t last_step = 0;          // as last reported
  nlohmann::json control = nlohmann::json::object();
};

class Cluster {
 public:
  Cluster(RunConfig config, std::string config_path);

  Status StartSyncer();                  // first start (port 0) or restart on the same port
  Status StartLearner(int id, bool rejoin, int64_t start_step);
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  int http_port() const { return http_port_; }  // the syncer's status page (0 until it started)
  ChildProcess& syncer() { return syncer_; }
  bool syncer_down() const { return syncer_down_; }
  std::vector<LearnerSlot>& learners() { return learners_; }

  // Applies one fault now (`now` = seconds since the learners started) and logs it.
  void Inject(const chaos::FaultEvent& e, double now);
  // Restarts, resumes and restores whatever is due at `now`.
  void Tick(double now);
  void Note(double now, const std::string& kind, int target, const std::string& note);
  const nlohmann::json& fault_log() const { return fault_log_; }
  // Marks learners that exited by themselves; returns ids that exited with an error.
  std::vector<int> ReapLearners(double now);
  bool AllLearnersFinished() const;
  // The global model's progress as last reported (fragment versions; in the synchronous modes the
  // number of completed barriers / all-reduced steps).
  void set_versions(std::vector<int64_t> v) { versions_ = std::move(v); }

 private:
  Status WriteControl(int id);
  std::string LearnerLog(int id) const;

  RunConfig c_;
  std::string config_path_, self_;
  ChildProcess syncer_;
  bool syncer_down_ = false;
  std::optional<double> syncer_restart_at_;
  int port_ = 0;
  int http_port_ = 0;
  std::string address_;
  std::vector<LearnerSlot> learners_;
  std::vector<int64_t> versions_;
  JsonlWriter faults_;
  nlohmann::json fault_log_ = nlohmann::json::array();
};

std::string TailOf(const std::string& path, size_t lines);

// Per-learner credentials of a run (docs/security.md): a fresh random secret in
// <out>/secrets/run.secret and learner m's token in <out>/secrets/learner-<m>.token (folder 0700,
// files 0600). Returns the operator token. The Cluster passes these files to its children.
StatusOr<std::string> WriteRunCredentials(const RunConfig& c);
std::string SecretsDir(const RunConfig& c);

}  // namespace atl::runtime
