// A syncer core over SmallStridedPlan (two fragments of 4 values) with fp32 pushes, for tests
// that drive SyncerCore or SyncerLoop by hand: options (K = 1, no grace, mean merge), the core,
// a join request, a push header and its fp32 payload. Header-only.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "atoll/syncer/syncer_core.h"
#include "testing/plans.h"

namespace atl::testing {

inline syncer::SyncerOptions SmallOptions(diloco::Encoding up = diloco::Encoding::kFp32) {
  syncer::SyncerOptions o;
  o.run_id = "r";
  o.H = 2;
  o.round.quorum = 1;
  o.round.grace = false;
  o.merge_rule = diloco::MergeRule::kMean;
  o.uplink = {up, 8};
  o.downlink = {diloco::Encoding::kFp32, 8};
  return o;
}

inline syncer::SyncerCore SmallCore(const syncer::SyncerOptions& o, float init = 1.0f) {
  std::vector<std::vector<float>> initial(2, std::vector<float>(4, init));
  auto core = syncer::SyncerCore::Create(o, SmallStridedPlan(), initial);
  ATOLL_CHECK(core.ok());
  return std::move(*core);
}

inline syncer::JoinRequestData SmallJoin(int id, std::string host = "test") {
  syncer::JoinRequestData r;
  r.protocol_version = syncer::kProtocolVersion;
  r.run_id = "r";
  r.model_signature = diloco::ModelSignature(SmallStridedPlan().tensors);
  r.learner_id = id;
  r.host = std::move(host);
  return r;
}

inline syncer::PushHeaderData SmallHeader(int id, int p, int64_t base, diloco::Encoding enc = diloco::Encoding::kFp32) {
  syncer::PushHeaderData h;
  h.learner_id = id;
  h.fragment = p;
  h.base_version = base;
  h.c_tokens = 100;
  h.c_steps = 1;
  h.encoding = enc;
  h.block_size = 8;
  h.num_values = 4;
  return h;
}

// Four fp32 values `v`, as a push payload.
inline std::vector<std::byte> Fp32Values(float v) {
  std::vector<float> x(4, v);
  std::vector<std::byte> out(16);
  std::memcpy(out.data(), x.data(), 16);
  return out;
}

}  // namespace atl::testing
