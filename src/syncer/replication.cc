#include "atoll/syncer/replication.h"

#include <algorithm>
#include <cmath>

namespace atl::syncer {

ReplicationLog::ReplicationLog(uint64_t epoch, std::vector<std::string> snapshot_files, size_t keep,
                               std::chrono::milliseconds retry_after)
    : epoch_(epoch),
      snapshot_files_(std::move(snapshot_files)),
      keep_(std::max<size_t>(keep, 1)),
      retry_after_(retry_after) {}

int64_t ReplicationLog::Append(std::vector<std::string> files) {
  std::lock_guard<std::mutex> lock(mu_);
  records_.emplace_back(++latest_, std::move(files));
  while (records_.size() > keep_) records_.pop_front();
  changed_.notify_all();
  return latest_;
}

int64_t ReplicationLog::latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

std::vector<std::string> ReplicationLog::AwaitFollowers(int64_t seq, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto behind = [&] {
    std::vector<std::string> ids;
    for (const auto& [id, f] : followers_) {
      if (f.waited && f.acked < seq) ids.push_back(id);
    }
    return ids;
  };
  changed_.wait_for(lock, timeout, [&] { return closed_ || behind().empty(); });
  std::vector<std::string> dropped = behind();
  for (const auto& id : dropped) {
    FollowerStats& f = followers_[id];
    if (f.tracked) ++generation_;
    f.waited = f.tracked = false;
    f.retry_at = std::chrono::steady_clock::now() + retry_after_;
    ++f.drops;
  }
  return dropped;
}

bool ReplicationLog::Acknowledge(FollowerStats& f, int64_t applied) {
  f.acked = applied;
  if (!f.waited && latest_ - applied <= kCatchUpLag && std::chrono::steady_clock::now() >= f.retry_at) {
    f.waited = true;  // every later commit waits for it
    f.since = latest_;
  }
  if (!f.waited || f.tracked || applied < f.since) return false;
  f.tracked = true;  // it holds every commit up to `since`, and each later one was waited for
  ++generation_;
  return true;
}

bool ReplicationLog::NeedsSnapshot(const ReplicateAsk& ask) const {
  if (ask.epoch != epoch_ || ask.applied_seq < 0 || ask.applied_seq > latest_) return true;
  // Every commit after applied_seq must still be remembered.
  return ask.applied_seq < latest_ && (records_.empty() || records_.front().first > ask.applied_seq + 1);
}

std::vector<std::string> ReplicationLog::FilesAfter(int64_t seq) const {
  std::vector<std::string> files;
  for (const auto& [s, names] : records_) {
    if (s <= seq) continue;
    for (const auto& n : names) {
      if (std::find(files.begin(), files.end(), n) == files.end()) files.push_back(n);
    }
  }
  return files;
}

StatusOr<ReplicateBatch> ReplicationLog::Follow(const ReplicateAsk& ask) {
  if (ask.candidate.empty()) return InvalidArgumentError("replicate: the follower must name its candidate id");
  if (!std::isfinite(ask.wait_seconds) || ask.wait_seconds < 0) {
    return InvalidArgumentError("replicate: wait_seconds must be a finite value ≥ 0");
  }
  std::function<void()> grew;
  ReplicateBatch batch;
  {
    std::unique_lock<std::mutex> lock(mu_);
    FollowerStats& f = followers_[ask.candidate];
    const bool snapshot = NeedsSnapshot(ask);
    if (snapshot) {  // restarted, or another epoch's: it holds no usable copy now
      if (f.tracked) ++generation_;
      f.acked = -1;
      f.waited = f.tracked = false;
    } else if (Acknowledge(f, ask.applied_seq)) {
      grew = on_grew_;
    }
    changed_.notify_all();  // an AwaitFollowers may be waiting for this acknowledgement
    batch.epoch = epoch_;
    if (snapshot) {
      ++f.snapshots;
      batch.snapshot = true;
      batch.seq = latest_;  // the files read after this are at least this commit
      batch.files = snapshot_files_;
    } else {
      const auto wait = std::chrono::duration<double>(std::min(ask.wait_seconds, 10.0));
      changed_.wait_for(lock, wait, [&] { return closed_ || latest_ > ask.applied_seq; });
      batch.seq = latest_;
      batch.files = FilesAfter(ask.applied_seq);
    }
  }
  if (grew) grew();
  return batch;
}

std::vector<std::string> ReplicationLog::Tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [id, f] : followers_) {
    if (f.tracked) ids.push_back(id);
  }
  return ids;
}

uint64_t ReplicationLog::tracked_generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void ReplicationLog::OnTrackedGrew(std::function<void()> f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_grew_ = std::move(f);
}

void ReplicationLog::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  changed_.notify_all();
}

std::map<std::string, ReplicationLog::FollowerStats> ReplicationLog::followers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return followers_;
}

}  // namespace atl::syncer
