#include "syncer_leadership.h"

#include "replicator.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace atl::runtime {

std::string LeadershipPrefix(const std::string& run_id, const syncer::ShardSpec& shard) {
  return fmt::format("/atoll/{}/shard-{}-of-{}", run_id, shard.index, shard.count);
}

namespace {

std::string DefaultCandidateId() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return fmt::format("{}-{}", host, ::getpid());
}

int ExitCodeOf(const Status& st) {
  const StatusCode c = st.code();
  return c == StatusCode::kInvalidArgument || c == StatusCode::kAlreadyExists ? 2 : 1;
}

}  // namespace

int SyncerLeadership::Campaign(const SyncerProcessOptions& opt, const std::string& run_id,
                               const syncer::ShardSpec& shard, const std::string& address,
                               std::optional<ReplicaFollowerOptions> follow, const std::atomic<bool>& stop) {
  coord::LeadershipOptions lo;
  lo.endpoints = opt.etcd;
  lo.prefix = LeadershipPrefix(run_id, shard);
  lo.candidate_id = candidate_id_ = opt.candidate_id.empty() ? DefaultCandidateId() : opt.candidate_id;
  lo.address = address;
  lo.lease_ttl_s = opt.lease_ttl_s;
  auto started = coord::Leadership::Start(lo);  // waits out a dead process of the same id
  if (!started.ok()) {
    std::fprintf(stderr, "atoll syncer: error: leadership: %s\n", started.status().ToString().c_str());
    return ExitCodeOf(started.status());
  }
  lead_ = std::move(*started);
  std::printf("syncer: candidate %s for shard %s of run %s: waiting for the leadership (etcd %s, lease %g s)\n",
              candidate_id_.c_str(), shard.ToString().c_str(), run_id.c_str(), opt.etcd.c_str(), opt.lease_ttl_s);
  std::fflush(stdout);
  std::unique_ptr<ReplicaFollower> follower;
  if (follow) {
    follow->candidate_id = candidate_id_;
    follow->leader_value = [l = lead_.get()] { return l->leader_value(); };
    follower = std::make_unique<ReplicaFollower>(std::move(*follow));
    follower->Start();
  }
  auto epoch = lead_->AwaitLeadership(stop);
  if (follower) follower->Stop();  // nothing is written into --state from here on
  if (!epoch.ok()) {
    if (epoch.status().code() == StatusCode::kCancelled) {
      std::printf("syncer: candidate %s stopped while a standby\n", candidate_id_.c_str());
      return 0;
    }
    std::fprintf(stderr, "atoll syncer: error: leadership: %s\n", epoch.status().ToString().c_str());
    return ExitCodeOf(epoch.status());
  }
  auto finished = ReadRunKeys(follower != nullptr);
  if (!finished.ok()) {
    std::fprintf(stderr, "atoll syncer: error: leadership: %s\n", finished.status().ToString().c_str());
    return 1;
  }
  if (*finished) {
    std::printf("syncer: candidate %s leads shard %s, but the run already finished: nothing to serve\n",
                candidate_id_.c_str(), shard.ToString().c_str());
    lead_->Resign();
    lead_.reset();
    return 0;
  }
  std::printf("syncer: candidate %s leads shard %s (epoch %llu)%s%s\n", candidate_id_.c_str(), shard.ToString().c_str(),
              static_cast<unsigned long long>(*epoch), run_began_ ? ", taking over the run" : "",
              from_replica_ ? " from the leader's commits it followed (in the replica set)" : "");
  std::fflush(stdout);
  return 0;
}

StatusOr<bool> SyncerLeadership::ReadRunKeys(bool followed) {
  ATOLL_ASSIGN_OR_RETURN(const std::string latest, lead_->LatestLeader());
  ATOLL_ASSIGN_OR_RETURN(const bool finished, lead_->RunFinished());
  ATOLL_ASSIGN_OR_RETURN(const std::string replicas, lead_->Replicas());
  run_began_ = !latest.empty();
  from_replica_ = run_began_ && latest != candidate_id_ && followed && InReplicaSet(replicas, latest, candidate_id_);
  another_led_ = run_began_ && latest != candidate_id_ && !from_replica_;
  return finished;
}

Status SyncerLeadership::MarkBegan() { return lead_ == nullptr ? Status::Ok() : lead_->MarkRunBegan(); }

void SyncerLeadership::MarkFinishedAndResign() {
  if (lead_ == nullptr) return;
  if (Status st = lead_->MarkRunFinished(); !st.ok()) {
    std::fprintf(stderr, "syncer: leadership: could not record the finish in etcd: %s\n", st.ToString().c_str());
  }
  lead_->Resign();
}

std::string SyncerLeadership::Describe() const {
  if (lead_ == nullptr) return "";
  const std::string why = lead_->Lost() ? ": " + lead_->lost_reason() : "";
  return fmt::format("candidate {}, epoch {}{}", candidate_id_, lead_->epoch(), why);
}

}  // namespace atl::runtime
