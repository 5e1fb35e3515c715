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
// behind than the log remembers gets a snapshot: every state file. A follower that acknowledges
// the log's latest seq becomes *tracked*: from then on every commit waits for its acknowledgement
// before the round is published (AwaitFollowers), so a tracked follower holds every published
// round. A tracked follower that does not acknowledge within the wait is dropped (untracked) and
// the caller must record that (the replica set in etcd) before it publishes; it is tracked again
// once it catches up.
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
  ReplicationLog(uint64_t epoch, std::vector<std::string> snapshot_files, size_t keep = 4096);

  uint64_t epoch() const { return epoch_; }
  // Records a commit that rewrote `files` (already on disk); returns its seq. Wakes followers.
  int64_t Append(std::vector<std::string> files);
  int64_t latest() const;

  // Waits until every tracked follower has acknowledged `seq`, or until `timeout`; the followers
  // that had not are untracked and returned (empty: every tracked follower holds `seq`).
  std::vector<std::string> AwaitFollowers(int64_t seq, std::chrono::milliseconds timeout);

  // A follower's ask (handler thread): records its acknowledgement, tracks it when it holds the
  // latest commit, then returns what brings it forward, waiting up to ask.wait_seconds (≤ 10) for
  // a commit when it has everything. InvalidArgument for an empty candidate id or a negative wait.
  StatusOr<ReplicateBatch> Follow(const ReplicateAsk& ask);

  // The tracked followers (sorted), and a counter that moves whenever that set changes.
  std::vector<std::string> Tracked() const;
  uint64_t tracked_generation() const;
  // Called (outside the log's lock, on the thread that changed it) whenever the tracked set grows.
  void OnTrackedGrew(std::function<void()> f);
  // Ends every waiting Follow (the server is stopping).
  void Close();

  struct FollowerStats {
    int64_t acked = -1;
    bool tracked = false;
    int64_t snapshots = 0;
  };
  std::map<std::string, FollowerStats> followers() const;

 private:
  bool NeedsSnapshot(const ReplicateAsk& ask) const;       // under mu_
  std::vector<std::string> FilesAfter(int64_t seq) const;  // under mu_: the union, in first-write order

  const uint64_t epoch_;
  const std::vector<std::string> snapshot_files_;
  const size_t keep_;
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
