#include "atoll/syncer/api.h"

#include <cstring>

#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {

const char* LearnerStateName(LearnerState s) {
  switch (s) {
    case LearnerState::kJoining: return "joining";
    case LearnerState::kTraining: return "training";
    case LearnerState::kDone: return "done";
  }
  return "?";
}

std::optional<LearnerState> ParseLearnerState(std::string_view s) {
  for (LearnerState x : {LearnerState::kJoining, LearnerState::kTraining, LearnerState::kDone}) {
    if (s == LearnerStateName(x)) return x;
  }
  return std::nullopt;
}

Status ApplyPulled(const PullPayload& r, int64_t have_version, size_t numel, std::vector<float>& copy) {
  std::vector<float> next;
  if (r.is_delta) {
    if (r.base_version != have_version || copy.size() != numel) {
      return DataLossError("pull: delta against version " + std::to_string(r.base_version) +
                           ", but this learner holds version " + std::to_string(have_version));
    }
    next = copy;
    Status st = exchange::ApplyDelta(r.codec, r.bytes, next);
    if (!st.ok()) return DataLossError("pull: malformed delta: " + st.message());
  } else {
    if (r.bytes.size() != numel * sizeof(float)) {
      return DataLossError("pull: full fragment has " + std::to_string(r.bytes.size()) + " bytes, expected " +
                           std::to_string(numel * sizeof(float)));
    }
    next.resize(numel);
    std::memcpy(next.data(), r.bytes.data(), r.bytes.size());
  }
  if (exchange::ValuesChecksum(next) != r.value_checksum) {
    return DataLossError("fragment " + std::to_string(r.fragment) + " version " + std::to_string(r.version) +
                         ": value checksum differs from the syncer's (copy diverged; fetch in full)");
  }
  copy.swap(next);
  return Status::Ok();
}

}  // namespace atl::syncer
