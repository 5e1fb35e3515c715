#include "replicator.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace atl::runtime {

std::string ReplicaSetJson(const std::string& leader, uint64_t epoch, const std::vector<std::string>& in_sync) {
  return nlohmann::json{{"leader", leader}, {"epoch", epoch}, {"in_sync", in_sync}}.dump();
}

bool InReplicaSet(const std::string& replicas_json, const std::string& latest_leader, const std::string& candidate) {
  const auto j = nlohmann::json::parse(replicas_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("leader") || !j["leader"].is_string() || !j.contains("in_sync") ||
      !j["in_sync"].is_array() || j["leader"].get<std::string>() != latest_leader) {
    return false;
  }
  return std::any_of(j["in_sync"].begin(), j["in_sync"].end(),
                     [&](const nlohmann::json& id) { return id.is_string() && id.get<std::string>() == candidate; });
}

Replicator::Replicator(std::shared_ptr<syncer::ReplicationLog> log, ReplicatorOptions options)
    : log_(std::move(log)), opt_(std::move(options)) {
  // A standby that catches up is recorded at once (best effort: the next commit retries).
  log_->OnTrackedGrew([this] { (void)Publish(); });
}

Status Replicator::Reset() {
  std::lock_guard<std::mutex> lock(publish_mu_);
  // Before the leader serves no standby can be in sync: the empty set is the log's current one.
  const uint64_t generation = log_->tracked_generation();
  ATOLL_RETURN_IF_ERROR(opt_.put_replicas(ReplicaSetJson(opt_.leader, opt_.epoch, {})));
  published_generation_ = generation;
  return Status::Ok();
}

Status Replicator::Publish() {
  std::lock_guard<std::mutex> lock(publish_mu_);
  const uint64_t generation = log_->tracked_generation();
  if (generation == published_generation_) return Status::Ok();
  ATOLL_RETURN_IF_ERROR(opt_.put_replicas(ReplicaSetJson(opt_.leader, opt_.epoch, log_->Tracked())));
  published_generation_ = generation;
  return Status::Ok();
}

void Replicator::Committed(std::vector<std::string> files) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t seq = log_->Append(std::move(files));
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt_.timeout_s * 1000));
  const std::vector<std::string> dropped = log_->AwaitFollowers(seq, timeout);
  for (const auto& id : dropped) {
    std::fprintf(stderr,
                 "syncer: standby %s did not acknowledge commit %lld within %g s: dropped from the replica set (it "
                 "rejoins once it catches up)\n",
                 id.c_str(), static_cast<long long>(seq), opt_.timeout_s);
  }
  // The set in etcd must not name a standby that lacks this round before the round is published.
  // While etcd does not answer the lease runs out too: a leader that no longer leads publishes
  // nothing (its server is fenced), so the loop gives up then.
  for (Status st = Publish(); !st.ok() && opt_.leading(); st = Publish()) {
    std::fprintf(stderr, "syncer: recording the replica set in etcd: %s (retrying)\n", st.ToString().c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++commits_;
  dropped_ += static_cast<int64_t>(dropped.size());
  wait_ms_sum_ += ms;
  wait_ms_max_ = std::max(wait_ms_max_, ms);
}

nlohmann::json Replicator::Stats() const {
  nlohmann::json followers = nlohmann::json::object();
  for (const auto& [id, f] : log_->followers()) {
    followers[id] = {{"acked", f.acked},
                     {"waited_for", f.waited},
                     {"in_sync", f.tracked},
                     {"snapshots", f.snapshots},
                     {"drops", f.drops}};
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  return {{"in_sync", log_->Tracked()},
          {"commits", commits_},
          {"wait_ms_mean", commits_ > 0 ? wait_ms_sum_ / static_cast<double>(commits_) : 0.0},
          {"wait_ms_max", wait_ms_max_},
          {"dropped", dropped_},
          {"followers", followers}};
}

}  // namespace atl::runtime
