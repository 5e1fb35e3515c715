#include "atoll/coord/leadership.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace atl::coord {

namespace {

constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a standby looks at the leader key

bool Transient(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

std::string FirstWord(const std::string& s) { return s.substr(0, s.find(' ')); }

}  // namespace

Status ValidateLeadershipOptions(const LeadershipOptions& o) {
  const double t = o.lease_ttl_s;
  if (!std::isfinite(t) || t != std::floor(t) || t < 1 || t > 60) {
    return InvalidArgumentError(fmt::format("lease TTL {} s: etcd leases last whole seconds; want 1 to 60", t));
  }
  if (!std::isfinite(o.dial_timeout_s) || o.dial_timeout_s <= 0) {
    return InvalidArgumentError(fmt::format("etcd dial timeout {} s: want a positive number", o.dial_timeout_s));
  }
  if (o.prefix.empty() || o.prefix == "/") return InvalidArgumentError("leadership key prefix is empty");
  const bool id_ok = !o.candidate_id.empty() && std::all_of(o.candidate_id.begin(), o.candidate_id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!id_ok) return InvalidArgumentError("candidate id '" + o.candidate_id + "': want [A-Za-z0-9._-]+");
  if (o.address.find_first_of(" \n") != std::string::npos) {
    return InvalidArgumentError("advertised address '" + o.address + "' contains a space");
  }
  return ParseEtcdEndpoints(o.endpoints).status();
}

int64_t Leadership::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Leadership::Leadership(LeadershipOptions opts, std::unique_ptr<EtcdClient> client)
    : opts_(std::move(opts)), client_(std::move(client)) {}

Leadership::~Leadership() {
  stop_ = true;
  {
    std::lock_guard<std::mutex> lock(sleep_mu_);
    sleep_cv_.notify_all();
  }
  if (renew_.joinable()) renew_.join();
  Resign();
}

StatusOr<std::unique_ptr<Leadership>> Leadership::Start(const LeadershipOptions& opts) {
  ATOLL_RETURN_IF_ERROR(ValidateLeadershipOptions(opts));
  LeadershipOptions o = opts;
  while (o.prefix.size() > 1 && o.prefix.back() == '/') o.prefix.pop_back();
  ATOLL_ASSIGN_OR_RETURN(auto client, EtcdClient::Connect(o.endpoints, o.dial_timeout_s));
  std::unique_ptr<Leadership> l(new Leadership(std::move(o), std::move(client)));
  l->ttl_s_ = static_cast<int64_t>(l->opts_.lease_ttl_s);
  ATOLL_RETURN_IF_ERROR(l->Acquire());
  l->renew_ = std::thread([p = l.get()] { p->RenewLoop(); });
  return l;
}

Status Leadership::Acquire() {
  const int64_t t_sent = NowNs();
  int64_t granted = 0;
  ATOLL_ASSIGN_OR_RETURN(int64_t lease, client_->Grant(static_cast<int64_t>(opts_.lease_ttl_s), &granted));
  {
    std::lock_guard<std::mutex> lock(renew_mu_);
    ttl_s_ = std::max<int64_t>(granted, 1);
    lease_ = lease;
    lease_end_ns_ = t_sent + ttl_s_.load() * 1'000'000'000;
    lease_gone_ = false;
  }
  return RegisterCandidate();
}

Status Leadership::RegisterCandidate() {
  const std::string k = key("candidates/") + opts_.candidate_id;
  const std::string value = opts_.candidate_id + " " + opts_.address;
  // A key of a process with this id that died lives on until its lease expires: wait that out.
  const int64_t until = NowNs() + (ttl_s_.load() + 1) * 1'000'000'000;
  for (;;) {
    ATOLL_ASSIGN_OR_RETURN(auto r, client_->PutIfAbsent(k, value, lease_.load()));
    if (r.created || r.existing.lease == lease_.load()) return Status::Ok();
    if (NowNs() >= until) {
      return AlreadyExistsError(fmt::format(
          "another syncer is running as candidate '{}' for {} (give each syncer of a shard its own --candidate-id)",
          opts_.candidate_id, opts_.prefix));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

void Leadership::RenewLoop() {
  const auto every = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(250),
                                                         std::chrono::milliseconds(ttl_s_.load() * 250));
  while (!stop_) {
    {
      std::unique_lock<std::mutex> lock(sleep_mu_);
      sleep_cv_.wait_for(lock, every, [this] { return stop_.load(); });
    }
    if (stop_) break;
    if (paused_) continue;
    if (lost_) {
      if (!released_) ReleaseAfterLoss();
      continue;
    }
    RenewOnce();
  }
}

void Leadership::RenewOnce() {
  const int64_t lease = lease_.load();
  if (lease == 0 || lease_gone_) return;
  const int64_t t_sent = NowNs();
  auto r = client_->KeepAliveOnce(lease, static_cast<double>(ttl_s_.load()) / 2);
  if (r.ok()) {
    std::lock_guard<std::mutex> lock(renew_mu_);
    if (lease_.load() != lease) return;  // replaced meanwhile
    // A renewal acknowledged after a leader's fence closed does not reopen it.
    if (leader_ && NowNs() >= FenceNs()) {
      Fence("the keep-alive was acknowledged after the fence closed");
      return;
    }
    lease_end_ns_ = std::max(lease_end_ns_.load(), t_sent + std::min(*r, ttl_s_.load()) * 1'000'000'000);
  } else if (r.status().code() == StatusCode::kNotFound) {
    lease_gone_ = true;
    Fence("the etcd lease expired: " + r.status().message());
  }
  if (leader_ && !Leading()) Fence("no keep-alive acknowledged within the lease");
}

}  // namespace atl::coord

namespace atl::coord {

int64_t Leadership::FenceNs() const { return lease_end_ns_.load() - ttl_s_.load() * 250'000'000; }

std::chrono::steady_clock::time_point Leadership::lease_deadline() const {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(FenceNs()));
}

bool Leadership::Leading() const {
  if (!leader_ || lost_) return false;
  if (NowNs() < FenceNs()) return !lost_;
  Fence("no keep-alive acknowledged within the lease (renewals stopped or etcd unreachable)");
  return false;
}

void Leadership::Fence(const std::string& reason) const {
  if (!leader_) return;
  std::lock_guard<std::mutex> lock(reason_mu_);
  if (lost_) return;
  lost_reason_ = reason;
  lost_ = true;
}

std::string Leadership::lost_reason() const {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return lost_reason_;
}

void Leadership::ReleaseAfterLoss() {
  const int64_t lease = lease_.load();
  // Best effort: when etcd is unreachable the lease expires by itself.
  if (client_->DeleteIf(key("leader"), lease).ok() && client_->Revoke(lease).ok()) released_ = true;
}

void Leadership::Resign() {
  if (resigned_) return;
  resigned_ = true;
  const bool led = leader_.load();
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (!lost_) lost_reason_ = "resigned";
    lost_ = true;  // Leading() is false from here on
  }
  leader_ = false;
  const int64_t lease = lease_.load();
  if (led) (void)client_->DeleteIf(key("leader"), lease);
  (void)client_->Revoke(lease);
}

StatusOr<bool> Leadership::TryLead() {
  const std::string value = opts_.candidate_id + " " + opts_.address;
  ATOLL_ASSIGN_OR_RETURN(auto r, client_->PutIfAbsent(key("leader"), value, lease_.load()));
  const KeyValue& kv = r.existing;
  if (!r.created && kv.lease != lease_.load()) {
    if (FirstWord(kv.value) == opts_.candidate_id) {
      return AlreadyExistsError(fmt::format(
          "another syncer is running as candidate '{}' for {}: it leads under another etcd lease (give each syncer of a shard its own --candidate-id)",
          opts_.candidate_id, opts_.prefix));
    }
    return false;
  }
  epoch_ = static_cast<uint64_t>(r.created ? r.revision : kv.create_revision);
  leader_ = true;
  return true;
}

Status Leadership::WaitForLeaderGone(const std::atomic<bool>& stop) {
  while (!stop && !lease_gone_) {
    auto kv = client_->Get(key("leader"));
    if (kv.ok() && !kv->has_value()) return Status::Ok();
    if (!kv.ok() && !Transient(kv.status())) return kv.status();
    std::this_thread::sleep_for(kPoll);
  }
  return Status::Ok();
}

StatusOr<uint64_t> Leadership::AwaitLeadership(const std::atomic<bool>& stop) {
  if (lost_) {
    return FailedPreconditionError("candidate '" + opts_.candidate_id + "' lost the leadership of " + opts_.prefix +
                                   " (" + lost_reason() + ") and cannot lead again");
  }
  if (leader_) return epoch_.load();
  while (!stop) {
    Status st = lease_gone_ ? Acquire() : Status::Ok();
    if (!st.ok() && !Transient(st)) return st;
    // Stand only within the fence: a leader must begin with time left on its lease.
    if (!st.ok() || NowNs() >= FenceNs()) {
      std::this_thread::sleep_for(kPoll);
      continue;
    }
    StatusOr<bool> led = TryLead();
    if (led.ok() && *led) return epoch_.load();
    if (!led.ok() && led.status().code() == StatusCode::kNotFound) {
      lease_gone_ = true;  // the lease expired under us: grant a new one
      continue;
    }
    if (!led.ok() && !Transient(led.status())) return led.status();
    ATOLL_RETURN_IF_ERROR(WaitForLeaderGone(stop));
  }
  return CancelledError("stopped while waiting for the leadership of " + opts_.prefix);
}

StatusOr<std::string> Leadership::leader_value() {
  ATOLL_ASSIGN_OR_RETURN(auto kv, client_->Get(key("leader")));
  return kv ? kv->value : std::string();
}

StatusOr<std::string> Leadership::LatestLeader() {
  ATOLL_ASSIGN_OR_RETURN(auto kv, client_->Get(key("began")));
  return kv.has_value() ? kv->value : std::string();
}

Status Leadership::MarkRunBegan() { return client_->Put(key("began"), opts_.candidate_id); }

StatusOr<std::string> Leadership::Replicas() {
  ATOLL_ASSIGN_OR_RETURN(auto kv, client_->Get(key("replicas")));
  return kv.has_value() ? kv->value : std::string();
}

Status Leadership::PutReplicas(const std::string& value) {
  ATOLL_ASSIGN_OR_RETURN(bool put, client_->PutIfBound(key("replicas"), value, key("leader"), lease_.load()));
  if (!put) return FailedPreconditionError("the replica set was not recorded: this candidate no longer leads");
  return Status::Ok();
}

StatusOr<bool> Leadership::RunFinished() {
  ATOLL_ASSIGN_OR_RETURN(auto kv, client_->Get(key("finished")));
  return kv.has_value();
}

Status Leadership::MarkRunFinished() { return client_->Put(key("finished"), opts_.candidate_id); }

}  // namespace atl::coord
