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

StatusOr<ShardSpec> ParseShardSpec(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--shard '" + std::string(text.substr(0, 32)) + "': " + why +
                                " (expected i/S: shard i of S, 0 <= i < S, e.g. 0/2)");
  };
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad("no '/'");
  const auto parse = [](std::string_view s, int& out) {
    if (s.empty() || s.size() > 6) return false;
    out = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      out = out * 10 + (ch - '0');
    }
    return true;
  };
  ShardSpec spec;
  if (!parse(text.substr(0, slash), spec.index)) return bad("the shard index is not a number");
  if (!parse(text.substr(slash + 1), spec.count)) return bad("the shard count is not a number");
  if (spec.count < 1 || spec.count > kMaxShards) return bad("the shard count must be 1.." + std::to_string(kMaxShards));
  if (spec.index >= spec.count) return bad("the shard index must be below the shard count");
  return spec;
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
    if (r.codec.encoding != diloco::Encoding::kFp32) {
      return DataLossError(std::string("pull: a full fragment must be fp32, got ") + diloco::EncodingName(r.codec.encoding));
    }
    next.resize(numel);
    Status st = diloco::Decode(r.codec, r.bytes, next);
    if (!st.ok()) return DataLossError("pull: malformed full fragment: " + st.message());
  }
  if (exchange::ValuesChecksum(next) != r.value_checksum) {
    return DataLossError("fragment " + std::to_string(r.fragment) + " version " + std::to_string(r.version) +
                         ": value checksum differs from the syncer's (copy diverged; fetch in full)");
  }
  copy.swap(next);
  return Status::Ok();
}

}  // namespace atl::syncer
