// FailoverSyncerApi: one syncer shard served by several candidate processes, of which the one
// holding the shard's etcd leadership serves (docs/decisions/022). A SyncerApi decorator over one
// client per candidate: calls go to the current candidate; a call that fails UNAVAILABLE (the
// candidate is down, a standby or a fenced former leader) or DEADLINE_EXCEEDED (a paused process
// whose port still accepts) moves the next call to the next candidate, so the learner's own retries (a rejoin with backoff) find the leader by themselves.
// Every reply carries the leadership epoch of the syncer that sent it: a reply whose epoch is
// below one already seen comes from a former leader and is refused UNAVAILABLE, never used.
// Thread-safety: all methods may be called from any thread (the agents' exchange and heartbeat
// threads); the candidate index and the highest epoch are atomics.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "atoll/syncer/api.h"

namespace atl::learner {

class FailoverSyncerApi final : public syncer::SyncerApi {
 public:
  // `candidates` (at least one; they must outlive this) and their addresses, for messages.
  FailoverSyncerApi(std::vector<syncer::SyncerApi*> candidates, std::vector<std::string> names);

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& request) override;
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int learner_id, const syncer::LearnerProgress& progress) override;
  Status Leave(int learner_id) override;
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& header, std::span<const std::byte> payload) override;
  StatusOr<syncer::PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                     int64_t want_version) override;

  // The candidate the next call goes to, and the highest leadership epoch seen in a reply.
  size_t current() const { return current_.load(); }
  uint64_t highest_epoch() const { return highest_epoch_.load(); }
  // Replies refused for an epoch below the highest seen.
  int64_t stale_replies() const { return stale_replies_.load(); }

 private:
  // Runs `call` on the current candidate; moves on after an UNAVAILABLE and checks the epoch of
  // what came back (`epoch_of`).
  template <typename T, typename Call, typename EpochOf>
  StatusOr<T> Route(Call&& call, EpochOf&& epoch_of);
  void MoveOn(size_t from);
  Status CheckEpoch(uint64_t epoch, size_t from);

  std::vector<syncer::SyncerApi*> candidates_;
  std::vector<std::string> names_;
  std::atomic<size_t> current_{0};
  std::atomic<uint64_t> highest_epoch_{0};
  std::atomic<int64_t> stale_replies_{0};
};

}  // namespace atl::learner
