// WAN shaper: a SyncerApi decorator that makes a loopback link behave like a wide-area one —
// bandwidth limit (token bucket, per direction), added latency with jitter, random loss (a
// call fails with Unavailable as if the connection dropped), and a partition switch that makes
// every call fail. Set per learner; chaos flips its knobs at run time.
// Thread-safety: all methods may be called from any thread; knobs are atomic/locked.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "atoll/core/clock.h"
#include "atoll/core/rng.h"
#include "atoll/syncer/api.h"

namespace atl::learner {

struct ShaperOptions {
  double bandwidth_bps = 0;  // bits/s each way; 0 = unlimited
  double latency_s = 0;      // added one-way latency per call
  double jitter_s = 0;       // uniform ± jitter on the latency
  double loss = 0;           // probability that a call fails as if the connection dropped
  uint64_t seed = 1;
};

class ShapedSyncerApi final : public syncer::SyncerApi {
 public:
  ShapedSyncerApi(syncer::SyncerApi& inner, ShaperOptions options, Clock& clock);

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& request) override;
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int learner_id, const syncer::LearnerProgress& progress) override;
  Status Leave(int learner_id) override;
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& header, std::span<const std::byte> payload) override;
  StatusOr<syncer::PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                     int64_t want_version) override;

  void SetPartitioned(bool partitioned) { partitioned_ = partitioned; }
  void SetOptions(const ShaperOptions& options);
  ShaperOptions options() const;

 private:
  // Waits for latency plus the time `bytes` take at the configured rate; returns Unavailable
  // when the call is "lost" or the link is partitioned.
  Status Transit(int64_t bytes, bool upstream);

  syncer::SyncerApi& inner_;
  Clock& clock_;
  mutable std::mutex mu_;
  ShaperOptions options_;              // guarded by mu_
  Rng rng_;                            // guarded by mu_
  TimePoint up_free_{}, down_free_{};  // when each direction's link is next idle; guarded by mu_
  std::atomic<bool> partitioned_{false};
};

}  // namespace atl::learner
