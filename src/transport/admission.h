// Admission of gRPC calls before they hold a handler thread (private to src/transport;
// docs/security.md). gRPC's sync server runs each call on a thread of a bounded pool, and a push
// stream that never sends or a long poll holds its thread for as long as it lasts: 300 silent
// pushes from one learner's credential took every thread (issue 32). So, per authenticated learner
// id, at most `pushes_per_learner` pushes and `polls_per_learner` pulls run at once, all learners
// together at most `calls_total` (leaving threads for joins, heartbeats and status calls), a
// learner's heartbeats are rate-limited (a token bucket), and every push has a deadline after
// which its stream is cancelled (PushDeadlines). A refused call gets RESOURCE_EXHAUSTED at once.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include "atoll/core/status.h"

namespace atl::transport {

class Admission {
 public:
  struct Limits {
    int pushes_per_learner = 4;
    int polls_per_learner = 4;
    int calls_total = 192;
    double heartbeats_per_s = 20;  // sustained; bursts of twice that
  };
  enum class Kind { kPush, kPull };

  explicit Admission(Limits limits) : limits_(limits) {}

  // A call's place while it runs; released when it ends. status() is OK when admitted, else the
  // RESOURCE_EXHAUSTED to answer with.
  class Slot {
   public:
    Slot(Admission* a, Kind kind, int64_t id, Status st)
        : a_(st.ok() ? a : nullptr), kind_(kind), id_(id), st_(std::move(st)) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      if (a_) a_->Leave(kind_, id_);
    }
    const Status& status() const { return st_; }

   private:
    Admission* a_;
    Kind kind_;
    int64_t id_;
    Status st_;
  };
  Slot Enter(Kind kind, int64_t learner_id);
  // OK, or RESOURCE_EXHAUSTED when learner `learner_id` sends heartbeats faster than allowed.
  Status Heartbeat(int64_t learner_id);

 private:
  void Leave(Kind kind, int64_t id);
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point at;
  };
  const Limits limits_;
  std::mutex mu_;
  std::map<int64_t, int> pushes_, polls_;  // guarded by mu_: calls in flight per learner (no zeros)
  int total_ = 0;                          // guarded by mu_
  std::map<int64_t, Bucket> heartbeats_;   // guarded by mu_
};

// Cancels push streams that outlive their deadline, so that a client that opens a push and then
// sends nothing (or trickles) holds its thread for a bounded time. One thread for all pushes.
class PushDeadlines {
 public:
  PushDeadlines();
  ~PushDeadlines();
  PushDeadlines(const PushDeadlines&) = delete;
  PushDeadlines& operator=(const PushDeadlines&) = delete;

  // Cancels `ctx` (grpc::ServerContext::TryCancel) if the registration still exists at
  // `deadline`. The registration must end (Watch's destructor) before `ctx` is destroyed.
  class Watch {
   public:
    Watch(PushDeadlines* d, uint64_t key) : d_(d), key_(key) {}
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    ~Watch() { d_->Forget(key_); }
    // A new deadline (a push's header announced its size); no effect once the call is cancelled.
    void Move(std::chrono::steady_clock::time_point deadline) { d_->Move(key_, deadline); }

   private:
    PushDeadlines* d_;
    uint64_t key_;
  };
  [[nodiscard]] Watch Add(grpc::ServerContext* ctx, std::chrono::steady_clock::time_point deadline);

 private:
  void Forget(uint64_t key);
  void Move(uint64_t key, std::chrono::steady_clock::time_point deadline);
  void Run();
  struct Entry {
    grpc::ServerContext* ctx;
    std::chrono::steady_clock::time_point deadline;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;  // guarded by mu_
  uint64_t next_ = 0;                  // guarded by mu_
  bool stop_ = false;                  // guarded by mu_
  std::thread thread_;
};

}  // namespace atl::transport
