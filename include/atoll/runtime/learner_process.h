// `atoll learner`: one learner — its model, optimizer and data shard, trained on its own clock,
// exchanging fragments with the syncer in the background (LearnerAgent); with --ranks R a unit of
// R processes. Returns a process exit code (0 ok, 1 runtime failure, 2 bad input) after printing
// a clear message; it never calls exit().
// Thread-safety: run once per process, from its main thread.
#pragma once

#include <cstdint>
#include <string>

#include "atoll/runtime/run_config.h"
#include "atoll/runtime/secrets.h"

namespace atl::runtime {

struct LearnerProcessOptions {
  RunConfig config;
  int id = 0;
  std::string syncer;   // host:port, or every syncer shard's, comma-separated in shard order
  std::string out_dir;  // metrics-learner-<id>.jsonl, learner-<id>.json
  bool rejoin = false;
  int64_t start_step = 0;  // a restarted learner continues its step count from here
  // Chaos control file (JSON: speed, partition, bandwidth_mbps), polled every step; "" = none.
  std::string control_file;
  std::string token_file;  // this learner's token (per-learner credentials); "" = the config's token
  TlsFiles tls;
  // A multi-rank learner unit (`--ranks R`, R ≥ 2): R processes train one learner synchronously
  // data-parallel; rank 0 talks to the syncer. rank -1: the unit's supervisor (it starts the
  // ranks); unit_store: the ranks' rendezvous file (set by the supervisor).
  int ranks = 1;
  int rank = -1;
  std::string unit_store;
};
// One learner; with ranks ≥ 2 the unit's supervisor or one of its ranks (learner_unit.cc).
int RunLearnerProcess(const LearnerProcessOptions& options);

}  // namespace atl::runtime
