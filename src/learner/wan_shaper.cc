#include "atoll/learner/wan_shaper.h"

#include <algorithm>

namespace atl::learner {

ShapedSyncerApi::ShapedSyncerApi(syncer::SyncerApi& inner, ShaperOptions options, Clock& clock)
    : inner_(inner), clock_(clock), options_(options), rng_(options.seed) {}

void ShapedSyncerApi::SetOptions(const ShaperOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = options;
}

ShaperOptions ShapedSyncerApi::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

Status ShapedSyncerApi::Transit(int64_t bytes, bool upstream) {
  Duration wait{};
  bool lost = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    double latency = options_.latency_s;
    if (options_.jitter_s > 0) latency += rng_.Uniform(-options_.jitter_s, options_.jitter_s);
    latency = std::max(0.0, latency);
    const TimePoint now = clock_.Now();
    TimePoint done = now;
    if (options_.bandwidth_bps > 0) {
      // Token bucket of one message: the link serialises transfers in each direction.
      TimePoint& free_at = upstream ? up_free_ : down_free_;
      const TimePoint start = std::max(now, free_at);
      done = start + FromSeconds(static_cast<double>(bytes) * 8.0 / options_.bandwidth_bps);
      free_at = done;
    }
    wait = (done - now) + FromSeconds(latency);
    lost = options_.loss > 0 && rng_.Bernoulli(options_.loss);
  }
  clock_.SleepFor(wait);
  if (partitioned_) return UnavailableError("network partition (shaper): syncer unreachable");
  if (lost) return UnavailableError("connection dropped (shaper loss)");
  return Status::Ok();
}

StatusOr<syncer::JoinReplyData> ShapedSyncerApi::Join(const syncer::JoinRequestData& r) {
  ATOLL_RETURN_IF_ERROR(Transit(256, true));
  auto out = inner_.Join(r);
  ATOLL_RETURN_IF_ERROR(Transit(256, false));
  return out;
}

StatusOr<syncer::HeartbeatReplyData> ShapedSyncerApi::Heartbeat(int id, const syncer::LearnerProgress& p) {
  ATOLL_RETURN_IF_ERROR(Transit(128, true));
  auto out = inner_.Heartbeat(id, p);
  ATOLL_RETURN_IF_ERROR(Transit(128, false));
  return out;
}

StatusOr<syncer::PushResult> ShapedSyncerApi::Push(const syncer::PushHeaderData& h,
                                                   std::span<const std::byte> payload) {
  ATOLL_RETURN_IF_ERROR(Transit(static_cast<int64_t>(payload.size()) + 96, true));
  return inner_.Push(h, payload);
}

StatusOr<syncer::PullPayload> ShapedSyncerApi::Pull(int id, int fragment, int64_t have, double wait_s, int64_t want) {
  ATOLL_RETURN_IF_ERROR(Transit(64, true));
  auto out = inner_.Pull(id, fragment, have, wait_s, want);
  if (!out.ok()) return out;
  ATOLL_RETURN_IF_ERROR(Transit(static_cast<int64_t>(out->bytes.size()) + 96, false));
  return out;
}

Status ShapedSyncerApi::Leave(int id) {
  ATOLL_RETURN_IF_ERROR(Transit(64, true));
  return inner_.Leave(id);
}

}  // namespace atl::learner
