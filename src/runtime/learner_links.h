// SyncerLinks: a learner process's connections to the syncer — one gRPC client per syncer shard
// (one when unsharded), each behind a WAN shaper that is a no-op unless the run file or chaos sets
// bandwidth, latency, loss or a partition (each shard's connection is shaped on its own).
// Thread-safety: built and re-shaped (Apply) on the training thread; the clients and shapers are
// safe to call from the agents' threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "atoll/core/clock.h"
#include "atoll/learner/failover_api.h"
#include "atoll/learner/wan_shaper.h"
#include "atoll/runtime/learner_process.h"
#include "atoll/transport/grpc_client.h"
#include "chaos_control.h"

namespace atl::runtime {

// --syncer: one host:port, or a sharded syncer's shards' addresses, comma-separated in shard order
// (shard i of S owns the fragments p ≡ i mod S). A shard served by a leader and standbys
// (atoll syncer --etcd) lists its candidates separated by '|' ("a:7070|b:7070"): the learner
// follows whichever leads (learner::FailoverSyncerApi). InvalidArgument for an empty entry or
// candidate, or more shards than the run has fragments (every shard owns one).
StatusOr<std::vector<std::string>> SyncerAddresses(const std::string& text, int fragments);

class SyncerLinks {
 public:
  // Connects to every address (in shard order) with the process's credentials and TLS files.
  // InvalidArgument for an unreadable token file or bad TLS settings.
  static StatusOr<SyncerLinks> Connect(const std::vector<std::string>& addresses, const LearnerProcessOptions& options,
                                       const RunConfig& config, Clock& clock);

  // The shaped APIs the agents talk through, in shard order.
  std::vector<syncer::SyncerApi*> apis() const;
  syncer::SyncerApi& front() { return *shaped_.front(); }
  // A chaos control's partition and bandwidth cap, on every shard's link.
  void Apply(const ChaosControl& control);
  // Bytes on the wire to (up) or from the syncer, over every shard's connection.
  int64_t WireBytes(bool up) const;

 private:
  learner::ShaperOptions base_;                                        // the run file's link
  std::vector<std::unique_ptr<transport::GrpcSyncerClient>> clients_;  // every candidate of every shard
  std::vector<std::unique_ptr<learner::FailoverSyncerApi>> failover_;  // shards with several candidates
  std::vector<std::unique_ptr<learner::ShapedSyncerApi>> shaped_;
};

}  // namespace atl::runtime
