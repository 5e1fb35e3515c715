// Replicator: a leader's side of replicated commits (docs/decisions/023). After each commit's
// files are on its disk and before the round is published, Committed() records the commit in the
// ReplicationLog the standbys follow and waits until every tracked standby holds it; a standby
// that does not acknowledge within the timeout is dropped from the replica set, and the set is
// recorded in etcd (`replicas`: the leader, its epoch and the standbys that hold every published
// round) before the round is published. A standby named there may resume from its own folder
// when it takes over; any other rebuilds from the learners.
// Private to src/runtime. Thread-safety: Committed on the loop thread; the rest from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/status.h"
#include "atoll/syncer/replication.h"

namespace atl::runtime {

struct ReplicatorOptions {
  std::string leader;  // this candidate's id
  uint64_t epoch = 0;
  double timeout_s = 2;                                    // a tracked standby's acknowledgement
  std::function<Status(const std::string&)> put_replicas;  // the set's JSON into etcd
  std::function<bool()> leading;                           // still within the lease
};

// The `replicas` value: {"leader", "epoch", "in_sync": [...]}; and what a candidate reads from it.
std::string ReplicaSetJson(const std::string& leader, uint64_t epoch, const std::vector<std::string>& in_sync);
// Whether `candidate` may resume its own folder: the set was written by `latest_leader` (the run's
// latest leader, from `began`) and names it.
bool InReplicaSet(const std::string& replicas_json, const std::string& latest_leader, const std::string& candidate);

class Replicator {
 public:
  Replicator(std::shared_ptr<syncer::ReplicationLog> log, ReplicatorOptions options);

  // The empty set under this leader, before it serves (a standby of an earlier leader is in sync
  // with that leader only).
  Status Reset();
  // Loop thread: the commit that rewrote `files` is on disk; returns once the round may be published.
  void Committed(std::vector<std::string> files);
  // {"in_sync", "commits", "wait_ms_mean", "wait_ms_max", "dropped", "followers"} for the summary.
  nlohmann::json Stats() const;
  const std::shared_ptr<syncer::ReplicationLog>& log() const { return log_; }

 private:
  // Writes the tracked set when it changed since the last write (serialized).
  Status Publish();

  std::shared_ptr<syncer::ReplicationLog> log_;
  ReplicatorOptions opt_;
  std::mutex publish_mu_;
  uint64_t published_generation_ = ~uint64_t{0};  // under publish_mu_
  mutable std::mutex stats_mu_;
  int64_t commits_ = 0, dropped_ = 0;
  double wait_ms_sum_ = 0, wait_ms_max_ = 0;
};

}  // namespace atl::runtime
