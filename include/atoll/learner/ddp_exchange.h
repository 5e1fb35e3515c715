// DdpExchange: a learner's side of atoll's `ddp` mode, the synchronous data-parallel baseline
// measured on the same wire: every inner step the learner pushes its whole gradient (bf16) and
// blocks until the syncer — a parameter server that averages the gradients of all live learners
// and applies the inner optimizer once — publishes the next global parameters, which it pulls
// (a bf16 delta against the copy it holds, with error feedback, like every other pull).
// Slow and fragile by design: one dead or slow learner stalls every step of every learner.
// Thread-safety: one thread (the training loop).
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/core/clock.h"
#include "atoll/syncer/api.h"

namespace atl::learner {

class DdpExchange {
 public:
  // `plan` must have one fragment (the whole model).
  DdpExchange(diloco::FragmentPlan plan, syncer::SyncerApi& api, diloco::CodecOptions uplink, Clock& clock);

  // Fetches the global parameters in full and writes them into `params`.
  Status Sync(int learner_id, std::span<const std::span<float>> params);
  // Pushes the gradient in `grads` for the current version, then waits until the syncer publishes
  // the next version (or `timeout_s` passes / `stop()` is true → DeadlineExceeded / Cancelled) and
  // writes it into `params`. Aborted means this learner is behind: call Sync.
  Status Step(int learner_id, int64_t step_tokens, std::span<const std::span<float>> grads,
              std::span<const std::span<float>> params, double timeout_s, const std::function<bool()>& stop);

  int64_t version() const { return version_; }
  int64_t payload_bytes_up() const { return bytes_up_; }
  int64_t payload_bytes_down() const { return bytes_down_; }
  int64_t checksum_mismatches() const { return mismatches_; }

 private:
  Status Apply(const syncer::PullPayload& r, std::span<const std::span<float>> params);

  diloco::FragmentPlan plan_;
  syncer::SyncerApi& api_;
  Clock& clock_;
  diloco::CodecOptions uplink_;
  std::vector<float> copy_;  // the public copy of Θ this learner holds (docs/decisions/014)
  exchange::Lattice lattice_;
  int64_t version_ = -1;
  int64_t bytes_up_ = 0, bytes_down_ = 0, mismatches_ = 0;
};

}  // namespace atl::learner
