// ReplicaFollower: a standby candidate's copy of its leader's committed state (docs/decisions/023).
//
// While the candidate waits for the leadership, a thread asks the shard's leader (its address from
// the leader key in etcd) for the commits it lacks and writes the files into the candidate's own
// --state folder exactly as the leader wrote them: a snapshot into a temp folder beside it that
// then replaces the folder (a folder this follower did not write — an earlier leadership's state —
// is moved aside to `<state>.superseded-epoch-E`, kept), later commits file by file (each
// atomically). Its next ask acknowledges them; once it holds the leader's latest commit the leader
// publishes no round before it holds it too. When this candidate leads, Stop() ends the thread's
// writes before the syncer opens the folder.
// Private to src/runtime. Thread-safety: Start/Stop from the owner's thread; stats() from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "atoll/core/status.h"
#include "atoll/syncer/replication.h"
#include "atoll/transport/grpc_client.h"

namespace atl::runtime {

// Where a state folder that must not be resumed (an earlier leadership's) is moved aside and kept:
// `<dir>.superseded-epoch-<epoch>`, `epoch` being the leadership it gave way to.
std::string SupersededDirOf(const std::string& dir, uint64_t epoch);

struct ReplicaFollowerOptions {
  std::string candidate_id;
  std::string state_dir;
  transport::ClientOptions client;                      // credentials and TLS; the target is the leader's
  std::function<StatusOr<std::string>()> leader_value;  // "<candidate id> <address>", "" when none leads
};

class ReplicaFollower {
 public:
  explicit ReplicaFollower(ReplicaFollowerOptions options) : opt_(std::move(options)) {}
  ~ReplicaFollower() { Stop(); }
  ReplicaFollower(const ReplicaFollower&) = delete;
  ReplicaFollower& operator=(const ReplicaFollower&) = delete;

  void Start();
  // Nothing is written into the state folder after it returns; the thread is joined.
  void Stop();

  struct Stats {
    std::string leader;
    uint64_t epoch = 0;
    int64_t seq = -1;
    int64_t snapshots = 0, batches = 0, files = 0, bytes = 0;
  };
  Stats stats() const;

 private:
  void Loop();
  // One ask of the leader at `address`; applies what it returns.
  Status FollowOnce(const std::string& leader, const std::string& address);
  // The reply's sink: a snapshot's files into the temp folder, a commit's into the state folder.
  Status WriteFile(const syncer::ReplicateBatch& reply, const std::string& name, std::string bytes);
  // The snapshot's temp folder replaces the state folder.
  Status InstallSnapshot(uint64_t epoch);
  void DropTemp();  // under write_mu_

  ReplicaFollowerOptions opt_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex write_mu_;                                  // held while a file is written; Stop takes it
  std::string temp_;                                     // under write_mu_: the snapshot being received
  bool wrote_folder_ = false;                            // under write_mu_: the state folder is this follower's replica
  std::unique_ptr<transport::GrpcSyncerClient> client_;  // loop thread; cancelled under client_mu_
  std::mutex client_mu_;
  std::string target_;  // loop thread
  mutable std::mutex stats_mu_;
  Stats stats_;
};

}  // namespace atl::runtime
