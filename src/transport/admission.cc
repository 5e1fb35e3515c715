#include "admission.h"

#include <algorithm>
#include <fmt/format.h>

namespace atl::transport {

Admission::Slot Admission::Enter(Kind kind, int64_t learner_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& per = kind == Kind::kPush ? pushes_ : polls_;
  const int cap = kind == Kind::kPush ? limits_.pushes_per_learner : limits_.polls_per_learner;
  const char* what = kind == Kind::kPush ? "pushes" : "pulls";
  auto it = per.find(learner_id);
  if (it != per.end() && it->second >= cap) {
    return Slot(this, kind, learner_id,
                ResourceExhaustedError(fmt::format("learner {} already has {} {} in flight (the limit per learner); "
                                                   "retry when one ends",
                                                   learner_id, it->second, what)));
  }
  if (total_ >= limits_.calls_total) {
    return Slot(this, kind, learner_id,
                ResourceExhaustedError(
                    fmt::format("the syncer already serves {} pushes and pulls (its limit); retry later", total_)));
  }
  ++per[learner_id];
  ++total_;
  return Slot(this, kind, learner_id, Status::Ok());
}

void Admission::Leave(Kind kind, int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& per = kind == Kind::kPush ? pushes_ : polls_;
  if (auto it = per.find(id); it != per.end() && --it->second == 0) per.erase(it);
  --total_;
}

Status Admission::Heartbeat(int64_t learner_id) {
  const auto now = std::chrono::steady_clock::now();
  const double burst = 2 * limits_.heartbeats_per_s;
  std::lock_guard<std::mutex> lock(mu_);
  if (heartbeats_.size() > 4096) {  // ids not heard from for a while: full buckets, forget them
    std::erase_if(heartbeats_, [&](const auto& kv) { return now - kv.second.at > std::chrono::seconds(10); });
  }
  auto [it, fresh] = heartbeats_.try_emplace(learner_id, Bucket{burst, now});
  Bucket& b = it->second;
  if (!fresh) {
    b.tokens = std::min(burst, b.tokens + limits_.heartbeats_per_s * std::chrono::duration<double>(now - b.at).count());
    b.at = now;
  }
  if (b.tokens < 1) {
    return ResourceExhaustedError(fmt::format("learner {} sends heartbeats faster than {} per second; slow down",
                                              learner_id, limits_.heartbeats_per_s));
  }
  b.tokens -= 1;
  return Status::Ok();
}

PushDeadlines::PushDeadlines() : thread_([this] { Run(); }) {}

PushDeadlines::~PushDeadlines() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

PushDeadlines::Watch PushDeadlines::Add(grpc::ServerContext* ctx, std::chrono::steady_clock::time_point deadline) {
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    key = next_++;
    entries_[key] = {ctx, deadline};
  }
  cv_.notify_all();
  return Watch(this, key);
}

void PushDeadlines::Forget(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(key);
}

void PushDeadlines::Move(uint64_t key, std::chrono::steady_clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return;
    it->second.deadline = deadline;
  }
  cv_.notify_all();
}

void PushDeadlines::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    auto next = std::chrono::steady_clock::time_point::max();
    const auto now = std::chrono::steady_clock::now();
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.deadline <= now) {
        it->second.ctx->TryCancel();  // under mu_: the call cannot end (Forget) meanwhile
        it = entries_.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    if (next == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, next);
    }
  }
}

}  // namespace atl::transport
