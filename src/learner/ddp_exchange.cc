#include "atoll/learner/ddp_exchange.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "atoll/exchange/fragment_exchange.h"

namespace atl::learner {

DdpExchange::DdpExchange(diloco::FragmentPlan plan, syncer::SyncerApi& api, diloco::CodecOptions uplink, Clock& clock)
    : plan_(std::move(plan)), api_(api), clock_(clock), uplink_(uplink) {
  ATOLL_CHECK(plan_.num_fragments() == 1);
}

Status DdpExchange::Apply(const syncer::PullPayload& r, std::span<const std::span<float>> params) {
  bytes_down_ += static_cast<int64_t>(r.bytes.size());
  if (Status st = syncer::ApplyPulled(r, version_, static_cast<size_t>(plan_.fragments[0].numel), copy_, lattice_);
      !st.ok()) {
    ++mismatches_;
    version_ = -1;  // refetch in full
    return st.WithContext("ddp");
  }
  version_ = r.version;
  exchange::ScatterFragment(plan_.fragments[0], copy_, params);
  return Status::Ok();
}

Status DdpExchange::Sync(int learner_id, std::span<const std::span<float>> params) {
  ATOLL_ASSIGN_OR_RETURN(auto r, api_.Pull(learner_id, 0, -1, 0.0, -1));
  return Apply(r, params);
}

Status DdpExchange::Step(int learner_id, int64_t step_tokens, std::span<const std::span<float>> grads,
                         std::span<const std::span<float>> params, double timeout_s,
                         const std::function<bool()>& stop) {
  if (version_ < 0) return AbortedError("ddp: no parameters held yet: Sync first");
  std::vector<float> g(static_cast<size_t>(plan_.fragments[0].numel));
  exchange::GatherFragment(plan_.fragments[0], grads, g);
  std::vector<std::byte> payload;
  ATOLL_RETURN_IF_ERROR(diloco::Encode(uplink_, g, payload));
  syncer::PushHeaderData h;
  h.learner_id = learner_id;
  h.fragment = 0;
  h.base_version = version_;
  h.c_tokens = step_tokens;
  h.c_steps = 1;
  h.encoding = uplink_.encoding;
  h.block_size = uplink_.block_size;
  h.compression = uplink_.compression;
  h.num_values = static_cast<int64_t>(g.size());
  ATOLL_RETURN_IF_ERROR(api_.Push(h, payload).status());
  bytes_up_ += static_cast<int64_t>(payload.size());
  const TimePoint deadline = clock_.Now() + FromSeconds(timeout_s);
  while (clock_.Now() < deadline) {
    if (stop && stop()) return CancelledError("ddp: stopped while waiting for the all-reduce");
    auto r = api_.Pull(learner_id, 0, version_, 1.0, -1);  // long poll, 1 s at a time
    if (!r.ok()) {
      if (r.status().code() != StatusCode::kUnavailable && r.status().code() != StatusCode::kDeadlineExceeded) {
        return r.status();
      }
      clock_.SleepFor(std::chrono::milliseconds(200));  // syncer down: wait (and stall)
      continue;
    }
    if (r->not_modified) continue;
    return Apply(*r, params);
  }
  return DeadlineExceededError("ddp: no all-reduced step within " + std::to_string(timeout_s) + " s");
}

}  // namespace atl::learner
