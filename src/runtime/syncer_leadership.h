// A syncer process as one candidate for its shard's leadership (`atoll syncer --etcd`,
// docs/decisions/022): connects to etcd, waits for the shard's lease, and tells what the new leader
// starts from — its own committed state when its --state folder holds one, else (the run began
// under an earlier leader and this disk never held its state) a rebuild from the learners' copies.
// Private to src/runtime. Thread-safety: Campaign on the main thread; leading() from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "atoll/coord/leadership.h"
#include "atoll/runtime/syncer_process.h"
#include "atoll/syncer/api.h"
#include "replica_follower.h"

namespace atl::runtime {

// The etcd key prefix of a run's shard: /atoll/<run id>/shard-<i>-of-<S>.
std::string LeadershipPrefix(const std::string& run_id, const syncer::ShardSpec& shard);

class SyncerLeadership {
 public:
  // Connects and registers the candidate (advertising `address`), then waits until it leads or
  // `stop` is set, following the leader's commits meanwhile when `follow` is given (its
  // leader_value is filled in here; the follower stops before this returns). Returns 0 when
  // leading; else the exit code after a message: 0 for a stop while waiting or a run that already
  // finished, 2 for bad endpoints, a bad TTL or a candidate id in use, 1 when etcd does not answer.
  int Campaign(const SyncerProcessOptions& opt, const std::string& run_id, const syncer::ShardSpec& shard,
               const std::string& address, std::optional<ReplicaFollowerOptions> follow, const std::atomic<bool>& stop);
  bool active() const { return lead_ != nullptr; }
  // True only while the lease surely holds (coord::Leadership::Leading); true without --etcd.
  bool leading() const { return lead_ == nullptr || lead_->Leading(); }
  // The lease lapsed after this process led: it must stop serving and close no round.
  bool lost() const { return lead_ != nullptr && lead_->Lost(); }
  uint64_t epoch() const { return lead_ == nullptr ? 0 : lead_->epoch(); }
  const std::string& candidate_id() const { return candidate_id_; }
  // An earlier leader began this run (its state may be on another disk).
  bool run_began() const { return run_began_; }
  // The latest leader before this one was another candidate: a state on this disk predates rounds
  // it served (or, committed after this candidate's own lease lapsed, was never served) and must
  // not be resumed.
  bool another_led() const { return another_led_; }
  // The latest leader named this candidate in its replica set: its --state folder holds every round
  // that leader published (docs/decisions/023), and it resumes from it.
  bool from_replica() const { return from_replica_; }
  // The replica set in etcd (JSON, Replicator); FailedPrecondition once this candidate no longer leads.
  Status PutReplicas(const std::string& value) { return lead_->PutReplicas(value); }
  // This candidate serves the run from now on (recorded as the latest leader).
  Status MarkBegan();
  // The run is over: later leaders have nothing to serve. Then resigns (a standby is told at once).
  void MarkFinishedAndResign();
  std::string Describe() const;

 private:
  // The run's keys once leading: who led last, whether this candidate is in that leader's replica
  // set (only when it `followed`), and whether the run finished (returned).
  StatusOr<bool> ReadRunKeys(bool followed);

  std::unique_ptr<coord::Leadership> lead_;
  std::string candidate_id_;
  bool run_began_ = false;
  bool another_led_ = false;
  bool from_replica_ = false;
};

}  // namespace atl::runtime
