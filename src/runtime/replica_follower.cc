#include "replica_follower.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "atoll/core/file.h"

namespace atl::runtime {
namespace fs = std::filesystem;

namespace {
constexpr double kAskWaitSeconds = 1.0;  // how long one ask may wait for a commit
constexpr auto kRepeatEvery = std::chrono::seconds(10);
}  // namespace

std::string SupersededDirOf(const std::string& dir, uint64_t epoch) {
  return fmt::format("{}.superseded-epoch-{}", dir, epoch);
}

void ReplicaFollower::Start() {
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void ReplicaFollower::Stop() {
  {
    std::lock_guard<std::mutex> lock(write_mu_);  // a file being written is finished first
    stop_ = true;
    DropTemp();
  }
  {
    std::lock_guard<std::mutex> lock(client_mu_);
    if (client_) client_->CancelReplicate();
  }
  if (thread_.joinable()) thread_.join();
}

ReplicaFollower::Stats ReplicaFollower::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void ReplicaFollower::Loop() {
  std::string last_error, leader, address;  // the leader is looked up again after any failure
  auto last_print = std::chrono::steady_clock::now();
  int64_t repeats = 0;
  while (!stop_) {
    Status st;
    if (leader.empty()) {
      auto value = opt_.leader_value();
      const std::string v = value.ok() ? *value : std::string();
      const size_t space = v.find(' ');
      st = !value.ok()                               ? value.status()
           : space == v.npos                         ? UnavailableError("no leader to follow")
           : v.substr(0, space) == opt_.candidate_id ? UnavailableError("this candidate leads")
                                                     : Status::Ok();
      if (st.ok()) {
        leader = v.substr(0, space);
        address = v.substr(space + 1);
      }
    }
    if (st.ok()) st = FollowOnce(leader, address);
    if (st.ok()) {
      last_error.clear();
      repeats = 0;
      continue;
    }
    leader.clear();
    if (stop_) break;
    // A new error at once, the same one again every 10 s with how often it recurred.
    const auto now = std::chrono::steady_clock::now();
    ++repeats;
    if (st.code() != StatusCode::kCancelled && (st.message() != last_error || now - last_print > kRepeatEvery)) {
      std::printf(
          "syncer: standby: not following the leader's commits: %s (retrying%s)\n", st.ToString().c_str(),
          st.message() == last_error ? fmt::format("; {} failures since the last report", repeats).c_str() : "");
      std::fflush(stdout);
      last_error = st.message();
      last_print = now;
      repeats = 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status ReplicaFollower::FollowOnce(const std::string& leader, const std::string& address) {
  if (address != target_) {
    transport::ClientOptions co = opt_.client;
    co.target = address;
    ATOLL_ASSIGN_OR_RETURN(auto client, transport::GrpcSyncerClient::Connect(co));
    std::lock_guard<std::mutex> lock(client_mu_);
    if (stop_) return CancelledError("stopped");
    client_ = std::move(client);
    target_ = address;
  }
  const Stats before = stats();
  const bool first = before.leader != leader || before.epoch == 0;
  syncer::ReplicateAsk ask{opt_.candidate_id, before.epoch, before.seq, kAskWaitSeconds};
  auto reply = client_->Replicate(ask, [this](const syncer::ReplicateBatch& r, const std::string& name,
                                              std::string bytes) { return WriteFile(r, name, std::move(bytes)); });
  if (!reply.ok()) {
    std::lock_guard<std::mutex> lock(write_mu_);
    DropTemp();
    return reply.status();
  }
  if (reply->snapshot) ATOLL_RETURN_IF_ERROR(InstallSnapshot(reply->epoch));
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.leader = leader;
    stats_.epoch = reply->epoch;
    stats_.seq = reply->seq;
    stats_.snapshots += reply->snapshot ? 1 : 0;
    stats_.batches += reply->files.empty() ? 0 : 1;
  }
  if (reply->snapshot || first) {
    std::printf("syncer: standby: following leader %s (epoch %llu): %s at commit %lld\n", leader.c_str(),
                static_cast<unsigned long long>(reply->epoch), reply->snapshot ? "snapshot installed" : "caught up",
                static_cast<long long>(reply->seq));
    std::fflush(stdout);
  }
  return Status::Ok();
}

Status ReplicaFollower::WriteFile(const syncer::ReplicateBatch& reply, const std::string& name, std::string bytes) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stop_) return CancelledError("stopped");
  std::string dir = opt_.state_dir;
  if (reply.snapshot) {
    if (temp_.empty()) {
      const fs::path target = fs::path(opt_.state_dir).lexically_normal();
      const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
      ATOLL_RETURN_IF_ERROR(MakeDirs(parent.string()));
      // The name DurableState::RemoveStaleTempFiles removes when a killed process left it.
      std::string tmp = (parent / ("." + target.filename().string() + ".init-XXXXXX")).string();
      if (::mkdtemp(tmp.data()) == nullptr) return InternalError("mkdtemp " + tmp + ": " + std::strerror(errno));
      temp_ = tmp;
    }
    dir = temp_;
  } else {
    if (!wrote_folder_) return FailedPreconditionError("a commit arrived before any snapshot");
  }
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name, std::string_view(bytes)));
  std::lock_guard<std::mutex> s(stats_mu_);
  ++stats_.files;
  stats_.bytes += static_cast<int64_t>(bytes.size());
  return Status::Ok();
}

Status ReplicaFollower::InstallSnapshot(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stop_) return CancelledError("stopped");
  if (temp_.empty()) return DataLossError("a snapshot without files");
  const fs::path target = fs::path(opt_.state_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(target, ec) && !fs::is_empty(target, ec)) {
    if (wrote_folder_) {
      fs::remove_all(target, ec);
    } else {  // an earlier leadership's state: kept, never resumed
      const std::string aside = SupersededDirOf(target.string(), epoch);
      fs::rename(target, aside, ec);
      if (!ec) std::printf("syncer: standby: moved %s aside to %s (kept)\n", target.c_str(), aside.c_str());
    }
    if (ec) return InternalError("replacing " + target.string() + ": " + ec.message());
  } else {
    fs::remove(target, ec);  // an empty folder
  }
  if (::rename(temp_.c_str(), target.c_str()) != 0) {
    return InternalError("installing the snapshot in " + target.string() + ": " + std::strerror(errno));
  }
  SyncFolder(target.has_parent_path() ? target.parent_path().string() : ".");
  temp_.clear();
  wrote_folder_ = true;
  return Status::Ok();
}

void ReplicaFollower::DropTemp() {
  if (temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
  temp_.clear();
}

}  // namespace atl::runtime
