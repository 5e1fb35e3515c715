#include "atoll/core/parallel.h"

#include <algorithm>

namespace atl {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::HardwareThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

void ThreadPool::Run(Job& job) {
  for (size_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) (*job.fn)(i);
}

void ThreadPool::Work() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    std::shared_ptr<Job> job = job_;
    ++busy_;
    lock.unlock();
    Run(*job);
    lock.lock();
    if (--busy_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = job;
    ++generation_;
  }
  cv_.notify_all();
  Run(*job);
  // Every index is taken; wait for the workers still running theirs.
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
}

void ForRanges(ThreadPool* pool, size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  grain = std::max<size_t>(1, grain);
  const size_t chunks = (n + grain - 1) / grain;
  const auto body = [&](size_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); };
  if (pool == nullptr) {
    for (size_t c = 0; c < chunks; ++c) body(c);
  } else {
    pool->ParallelFor(chunks, body);
  }
}

}  // namespace atl
