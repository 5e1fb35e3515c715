// RankGroup: the R processes of one multi-rank learner unit (`atoll learner --ranks R`), joined
// by c10d's ProcessGroupGloo (libtorch) over a FileStore rendezvous. Synchronous data-parallel
// inside the unit: gradients are averaged across ranks before each AdamW step, and rank 0 (the
// only rank that talks to the syncer) broadcasts what the syncer changed. Torch-free header.
//
// Every call is a collective: all ranks call the same sequence with the same sizes. A dead peer
// makes a call fail after `timeout_s` (Unavailable) instead of hanging; the unit's supervisor
// restarts the whole unit then (learner_unit.cc).
// Thread-safety: one thread (the training thread) per rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::runtime {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  // Rendezvous through the file `store_path` (the same for every rank of one incarnation of the
  // unit, absent before the first rank starts). InvalidArgument for rank ∉ [0, ranks) or ranks < 2.
  static StatusOr<std::unique_ptr<RankGroup>> Create(const std::string& store_path, int rank, int ranks,
                                                     double timeout_s);
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Every rank's `values` become the element-wise mean over the ranks.
  virtual Status AllReduceMean(const std::vector<std::span<float>>& values) = 0;
  // Every rank's `values` become rank 0's.
  virtual Status Broadcast(const std::vector<std::span<float>>& values) = 0;
  virtual Status BroadcastInts(std::span<int64_t> values) = 0;
};

}  // namespace atl::runtime
