// `atoll run`: a whole cluster on this machine — one syncer (or S shards) and M learner processes
// of this binary, the chaos schedule applied to them, live progress, and the run folder with its
// summary and report. Returns a process exit code (0 ok, 1 a learner or the syncer failed, 2 bad
// input).
// Thread-safety: run once per process, from its main thread.
#pragma once

#include "atoll/runtime/run_config.h"

namespace atl::runtime {

struct RunOptions {
  RunConfig config;
  bool live = true;  // live progress table on a terminal
};
int RunLocalCluster(const RunOptions& options);

}  // namespace atl::runtime
