// ReplicationLog: a leading syncer's commits as its standbys follow them (docs/decisions/023).
//
// Every committed round rewrites whole files of the durable state (learners.json and one
// fragment file: DurableState). The log numbers those commits (seq 1, 2, …) and remembers which
// files each one rewrote; it holds no file contents — a follower is sent the files as they are on
// the leader's disk when its reply is written, which is the commit it asked for or a later one
// (a file is only ever replaced whole, by rename, so applying a newer copy is safe).
//
// Followers. A standby asks with the last seq it holds durably (Follow). Its ask acknowledges that
// seq. A follower whose epoch differs from the log's, that holds nothing (-1) or that is further
// behind than the log remembers gets a snapshot: every state file. A follower within kCatchUpLag
// commits of the latest is *waited for*: every later commit waits for its acknowledgement before
// the round is published (AwaitFollowers) — a leader that commits faster than a standby follows
// would otherwise never let it catch up. Once it acknowledges the commit that was the latest when
// the waiting began, it holds every published round: it is *in sync* (Tracked(), what the caller
// records as the replica set in etcd). A waited-for follower that does not acknowledge within the
// wait is dropped (neither waited for nor in sync; the caller must record the smaller set before it
// publishes) and is not waited for again for `retry_after` (a slow standby costs a commit the
// timeout at most that often).
//
// Thread-safety: every method may be called from any thread (Append and AwaitFollowers from the
// syncer's loop thread, Follow from gRPC handler threads).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "atoll/core/status.h"

namespace atl::syncer {

// A standby's request: who it is, the leader epoch its files came from (0: none), the last seq
// it holds durably (-1: none), and how long the leader may wait for a newer commit.
struct ReplicateAsk {
  std::string candidate;
  uint64_t epoch = 0;
  int64_t applied_seq = -1;
  double wait_seconds = 0;
};

// What a follower is sent: the files (names in the state folder, in the order they must be
// written) that bring it to `seq` of `epoch`. A snapshot replaces its whole state folder; an
// empty list with seq == applied_seq is "nothing new within the wait".
struct ReplicateBatch {
  uint64_t epoch = 0;
  int64_t seq = 0;
  bool snapshot = false;
  std::vector<std::string> files;
};

class ReplicationLog {
 public:
  // `snapshot_files`: the state files a snapshot sends, in write order (meta.json last). `keep`:
  // how many commits' file lists are remembered (a follower further behind gets a snapshot).
  static constexpr int64_t kCatchUpLag = 8;
  ReplicationLog(uint64_t epoch, std::vector<std::string> snapshot_files, size_t keep = 4096,
                 std::chrono::milliseconds retry_after = std::chrono::seconds(10));

  uint64_t epoch() const { return epoch_; }
  // Records a commit that rewrote `files` (already on disk); returns its seq. Wakes followers.
  int64_t Append(std::vector<std::string> files);
  int64_t latest() const;

  // Waits until every waited-for follower has acknowledged `seq`, or until `timeout`; the
  // followers that had not are dropped and returned (empty: every one holds `seq`).
  std::vector<std::string> AwaitFollowers(int64_t seq, std::chrono::milliseconds timeout);

  // A follower's ask (handler thread): records its acknowledgement (waiting for it from now on
  // when it is close enough, in sync once it holds every published round), then returns what
  // brings it forward, waiting up to ask.wait_seconds (≤ 10) for a commit when it has everything.
  // InvalidArgument for an empty candidate id or a negative wait.
  StatusOr<ReplicateBatch> Follow(const ReplicateAsk& ask);

  // The followers in sync (sorted), and a counter that moves whenever that set changes.
  std::vector<std::string> Tracked() const;
  uint64_t tracked_generation() const;
  // Called (outside the log's lock, on the thread that changed it) whenever the set in sync grows.
  void OnTrackedGrew(std::function<void()> f);
  // Ends every waiting Follow (the server is stopping).
  void Close();

  struct FollowerStats {
    int64_t acked = -1;
    bool waited = false;   // commits wait for its acknowledgement
    int64_t since = 0;     // the latest commit when the waiting began
    bool tracked = false;  // in sync: it holds every published round
    int64_t snapshots = 0, drops = 0;
    std::chrono::steady_clock::time_point retry_at{};  // not waited for again before
  };
  std::map<std::string, FollowerStats> followers() const;

 private:
  bool NeedsSnapshot(const ReplicateAsk& ask) const;       // under mu_
  std::vector<std::string> FilesAfter(int64_t seq) const;  // under mu_: the union, in first-write order
  // Under mu_: records an acknowledgement; true when the follower has just come in sync.
  bool Acknowledge(FollowerStats& f, int64_t applied);

  const uint64_t epoch_;
  const std::vector<std::string> snapshot_files_;
  const size_t keep_;
  const std::chrono::milliseconds retry_after_;
  mutable std::mutex mu_;
  std::condition_variable changed_;                                   // a commit, an acknowledgement, or Close
  std::deque<std::pair<int64_t, std::vector<std::string>>> records_;  // the latest `keep_` commits
  int64_t latest_ = 0;
  std::map<std::string, FollowerStats> followers_;
  uint64_t generation_ = 0;
  bool closed_ = false;
  std::function<void()> on_grew_;
};

}  // namespace atl::syncer
