// Leadership: one candidate for the leadership of one key prefix in etcd (one syncer shard of one
// run), fenced by its etcd lease.
//
// Keys under `prefix`: `candidates/<candidate_id>` (bound to the candidate's lease: one live
// process per id), `leader` ("<candidate_id> <address>", bound to the leader's lease) and `began`
// (no lease: the candidate id of the latest leader, set when it starts serving), `finished` (no
// lease: a leader finished it).
//
// Fencing. A renew thread sends one keep-alive every min(ttl/4, 250 ms). etcd cannot expire the
// lease before t_sent + ttl, where t_sent is the steady-clock time at which the latest
// acknowledged keep-alive (or the grant) was sent; Leading() is true only while this candidate
// holds the leader key and now < t_sent + ttl − ttl/4. A leader that stops renewing (paused,
// partitioned from etcd) therefore stops Leading() strictly before a standby can take the key.
// Once Leading() has been true and turns false, it stays false: the candidate is Lost(), the
// renew thread gives the leader key and the lease back (so a standby takes over at once when etcd
// still held them), and AwaitLeadership refuses. A syncer that lost its leadership exits; a new
// process may stand again.
//
// Thread-safety: Leading(), lease_deadline(), epoch(), Lost(), lost_reason(), leader_value() and
// PutReplicas() from any thread; the rest from the owner's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "atoll/coord/etcd_client.h"
#include "atoll/core/status.h"

namespace atl::coord {

struct LeadershipOptions {
  std::string endpoints;     // etcd: host:port, http://host:port or unix:/path, comma-separated
  std::string prefix;        // e.g. "/atoll/<run_id>/shard-0-of-1" (a trailing '/' is dropped)
  std::string candidate_id;  // unique among the candidates of the prefix: [A-Za-z0-9._-]+
  std::string address;       // what this candidate serves at, advertised in the leader key
  double lease_ttl_s = 2;    // whole seconds in [1, 60]
  double dial_timeout_s = 5;
};

// Checks the options as Start does (InvalidArgument naming the bad one).
Status ValidateLeadershipOptions(const LeadershipOptions& o);

class Leadership {
 public:
  ~Leadership();  // stops the renew thread and resigns
  Leadership(const Leadership&) = delete;
  Leadership& operator=(const Leadership&) = delete;

  // Connects to etcd, grants a lease and registers `<prefix>/candidates/<candidate_id>` bound to
  // it. When that key exists, waits up to one lease TTL + 1 s for it to go (a process of the same
  // id that just died); if it stays: AlreadyExists ("another syncer is running as candidate …").
  static StatusOr<std::unique_ptr<Leadership>> Start(const LeadershipOptions& opts);

  // Returns once this candidate leads: the epoch, the leader key's create revision in etcd (every
  // later leader of any prefix of the cluster gets a strictly larger one). Waits while another
  // candidate leads, polling every 100 ms, and rides out etcd being unreachable meanwhile; grants
  // a new lease and registers again if its lease expired while it waited. Cancelled when `stop`
  // becomes true; AlreadyExists when the leader key is held by this candidate id under another
  // lease (a second process with the same id); FailedPrecondition once Lost().
  StatusOr<uint64_t> AwaitLeadership(const std::atomic<bool>& stop);

  // True only while this candidate holds the leader key within its fenced lease (above).
  bool Leading() const;
  // The steady-clock instant at which Leading() turns false unless a keep-alive is acknowledged
  // before it (t_sent + ttl − ttl/4).
  std::chrono::steady_clock::time_point lease_deadline() const;
  uint64_t epoch() const { return epoch_.load(); }  // 0 before the first leadership
  bool Lost() const { return lost_.load(); }
  std::string lost_reason() const;

  // The leader key's value ("<candidate_id> <address>"); empty when no candidate leads. From any
  // thread (a standby's follower asks it).
  StatusOr<std::string> leader_value();
  // Marking the run as begun by this candidate, and reading who marked it last.
  // `began` holds the candidate id of the latest leader that marked it ("" when none did): every
  // leader marks it when it starts serving, so a candidate whose own disk holds a state knows
  // whether another leader served since that state was written.
  StatusOr<std::string> LatestLeader();
  Status MarkRunBegan();
  // The replica set (`replicas`, no lease): which standbys hold every round the leader that wrote
  // it published (docs/decisions/023), as that leader wrote it ("" when none did). Written only
  // while this candidate holds the leader key (a transaction on its lease): FailedPrecondition when
  // it no longer does.
  StatusOr<std::string> Replicas();
  Status PutReplicas(const std::string& value);
  // Whether a leader of this prefix finished the run (`finished`, no lease): a candidate that
  // leads afterwards has nothing to serve. And marking it, before the last leader resigns.
  StatusOr<bool> RunFinished();
  Status MarkRunFinished();

  // Gives the leadership up: Leading() turns false first, then the leader key (if ours) is
  // deleted and the lease revoked, so a standby takes over at once. The candidate cannot lead
  // again. Idempotent.
  void Resign();

  const LeadershipOptions& options() const { return opts_; }
  int64_t lease_ttl_s() const { return ttl_s_.load(); }  // as granted by etcd
  int64_t lease_id() const { return lease_.load(); }

  // Test hook: a paused renew thread sends no keep-alives (a process stopped or cut off from etcd).
  void PauseRenewalForTesting(bool paused) { paused_ = paused; }

 private:
  explicit Leadership(LeadershipOptions opts, std::unique_ptr<EtcdClient> client);
  Status Acquire();            // grants a lease and registers the candidate key
  Status RegisterCandidate();  // PutIfAbsent of the candidate key, waiting out a dead predecessor
  void RenewLoop();
  void RenewOnce();
  void Fence(const std::string& reason) const;  // marks Lost() when it led
  void ReleaseAfterLoss();
  StatusOr<bool> TryLead();  // one PutIfAbsent of the leader key
  Status WaitForLeaderGone(const std::atomic<bool>& stop);
  int64_t FenceNs() const;  // steady ns at which Leading() turns false
  std::string key(const char* leaf) const { return opts_.prefix + "/" + leaf; }
  static int64_t NowNs();

  LeadershipOptions opts_;
  std::unique_ptr<EtcdClient> client_;
  std::atomic<int64_t> ttl_s_{0};
  std::atomic<int64_t> lease_{0};
  std::atomic<bool> lease_gone_{false};   // a keep-alive said NotFound: grant a new one
  std::atomic<int64_t> lease_end_ns_{0};  // steady ns: t_sent + ttl of the latest acknowledged renewal
  std::atomic<bool> leader_{false};       // holds the leader key
  mutable std::atomic<bool> lost_{false};
  mutable std::mutex reason_mu_;
  mutable std::string lost_reason_;
  std::atomic<uint64_t> epoch_{0};
  bool released_ = false;  // renew thread only: key and lease given back after a loss
  bool resigned_ = false;
  std::mutex renew_mu_;  // orders the lease replacement against an acknowledged renewal
  std::mutex sleep_mu_;
  std::condition_variable sleep_cv_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  std::thread renew_;
};

}  // namespace atl::coord
