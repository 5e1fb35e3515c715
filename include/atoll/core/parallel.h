// ThreadPool: a fixed set of worker threads for data-parallel loops over independent chunks (the
// syncer's decode, merge and encode of a round over blocks of a fragment).
//
// Determinism: ParallelFor runs fn(i) once for every i; which thread runs which i is not fixed,
// so callers write each i's result to a place of its own and combine results in index order.
// Then the result does not depend on the number of threads (tests compare 1 and 4 bit for bit).
// Thread-safety: ParallelFor may be called from one thread at a time; fn runs on the caller and
// on the workers concurrently and must not throw. Workers touch no clock (a SimClock never waits
// on them: the caller is inside ParallelFor until every chunk is done).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace atl {

class ThreadPool {
 public:
  // `threads` workers in all, the calling thread counting as one (≤ 1: everything inline).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // fn(0) … fn(n − 1), spread over the pool and the caller; returns when every call returned.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // The number of hardware threads (at least 1).
  static int HardwareThreads();

 private:
  // One ParallelFor: its indices are handed out by `next`. A worker that wakes late keeps the job
  // it took (all of whose indices are gone) and never runs an index of a later one.
  struct Job {
    const std::function<void(size_t)>* fn = nullptr;
    size_t n = 0;
    std::atomic<size_t> next{0};
  };
  void Work();
  static void Run(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::shared_ptr<Job> job_;  // the newest job; guarded by mu_
  uint64_t generation_ = 0;   // guarded by mu_
  int busy_ = 0;              // workers running a job; guarded by mu_
  bool stop_ = false;         // guarded by mu_
};

// ParallelFor over [0, n) in ranges of `grain`: fn(begin, end). With a null pool, inline.
void ForRanges(ThreadPool* pool, size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

}  // namespace atl
