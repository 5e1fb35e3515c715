#include "atoll/learner/adversary.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "atoll/diloco/merge.h"

namespace atl::learner {
namespace {

constexpr int64_t kHuge = int64_t{1} << 40;
constexpr size_t kReplayed = 4;  // replay: the last pushes sent again each time
constexpr int kProbes = 4;       // inflate: attempts per push of the learner

// The number a refusal's message gives just before " (limit ", and the one just after it: the
// reference and the factor of a quarantine, or the absolute limit of an absurd outer gradient.
struct Limit {
  double before = NAN, after = NAN;
};
Limit ParseLimit(const std::string& message) {
  Limit l;
  const size_t at = message.find(" (limit ");
  if (at == std::string::npos) return l;
  const size_t start = message.rfind(' ', at - 1);
  if (start != std::string::npos) l.before = std::strtod(message.c_str() + start + 1, nullptr);
  l.after = std::strtod(message.c_str() + at + 8, nullptr);
  return l;
}

// The size the syncer measured for a push ("outer-gradient size X"), NAN when not said.
double ParseSize(const std::string& message) {
  const size_t at = message.find("outer-gradient size ");
  return at == std::string::npos ? NAN : std::strtod(message.c_str() + at + 20, nullptr);
}

}  // namespace

std::vector<Attack> AllAttacks() {
  std::vector<Attack> all;
  for (const auto& [attack, name] : kAttackNames.names) {
    if (attack != Attack::kNone) all.push_back(attack);
  }
  return all;
}

AdversarialSyncerApi::AdversarialSyncerApi(syncer::SyncerApi& inner, Attack attack) : inner_(inner), attack_(attack) {}

StatusOr<syncer::JoinReplyData> AdversarialSyncerApi::Join(const syncer::JoinRequestData& request) {
  auto reply = inner_.Join(request);
  if (reply.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    uplink_ = reply->uplink;
  }
  return reply;
}

StatusOr<syncer::HeartbeatReplyData> AdversarialSyncerApi::Heartbeat(int id, const syncer::LearnerProgress& p) {
  return inner_.Heartbeat(id, p);
}

Status AdversarialSyncerApi::Leave(int id) { return inner_.Leave(id); }

StatusOr<syncer::PullPayload> AdversarialSyncerApi::Pull(int id, int fragment, int64_t have, double wait_s,
                                                         int64_t want) {
  return inner_.Pull(id, fragment, have, wait_s, want);
}

AdversaryCounters AdversarialSyncerApi::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::Push(const syncer::PushHeaderData& h,
                                                        std::span<const std::byte> payload) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.pushes += 1;
  if (attack_ == Attack::kNone) {
    counters_.sent += 1;
    auto r = inner_.Push(h, payload);
    (r.ok() ? counters_.accepted : counters_.refused) += 1;
    return r;
  }
  if (attack_ == Attack::kReplay) return ReplayLocked(h, payload);
  std::vector<float> delta(static_cast<size_t>(std::max<int64_t>(0, h.num_values)));
  ATOLL_RETURN_IF_ERROR(diloco::Decode(uplink_, payload, delta));
  return AttackLocked(h, std::move(delta));
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::SendLocked(syncer::PushHeaderData h,
                                                              std::span<const std::byte> payload) {
  h.push_seq = ++seq_;
  counters_.sent += 1;
  auto r = inner_.Push(h, payload);
  (r.ok() ? counters_.accepted : counters_.refused) += 1;
  return r;
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::AttackLocked(syncer::PushHeaderData h, std::vector<float> delta) {
  const int64_t steps = std::max<int64_t>(1, h.c_steps);
  const double norm = diloco::L2Norm(delta);
  switch (attack_) {
    case Attack::kClaimSteps:
      h.c_tokens = h.c_tokens / steps * kHuge;
      h.c_steps = kHuge;
      return SendScaledLocked(h, delta, norm);
    case Attack::kClaimTokens: h.c_tokens = kHuge; return SendScaledLocked(h, delta, norm);
    case Attack::kZero: return SendScaledLocked(h, std::vector<float>(delta.size(), 0.0f), 0.0);
    case Attack::kRatchet: {
      // It assumes the reference follows its own pushes, as a recent median of all pushes did.
      const double size = norm / std::sqrt(static_cast<double>(steps));
      const double last = size_.count(h.fragment) ? size_[h.fragment] : size;
      auto r = SendScaledLocked(h, delta, 19 * last * std::sqrt(static_cast<double>(steps)));
      if (r.ok()) size_[h.fragment] = 19 * last;
      return r;
    }
    case Attack::kAgainst:
      for (float& v : delta) v = -v;
      return InflateLocked(h, delta);
    default: return InflateLocked(h, delta);
  }
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::InflateLocked(syncer::PushHeaderData h,
                                                                 const std::vector<float>& delta) {
  // Counters at their bounds: 16x its steps (its size is divided by √16 more), 4x its tokens per step.
  const int64_t steps = std::max<int64_t>(1, h.c_steps);
  h.c_tokens = 4 * (h.c_tokens / steps) * 16 * steps;
  h.c_steps = 16 * steps;
  const double root = std::sqrt(static_cast<double>(h.c_steps));
  // A little above what passed last time (the references move), or far above anything at first.
  double norm = size_.count(h.fragment) ? 1.1 * size_[h.fragment] * root : 1e6 * (diloco::L2Norm(delta) + 1);
  StatusOr<syncer::PushResult> r = InvalidArgumentError("no attempt");
  for (int attempt = 0; attempt < kProbes; ++attempt) {
    r = SendScaledLocked(h, delta, norm);
    if (r.ok()) {
      size_[h.fragment] = norm / root;
      return r;
    }
    const std::string& m = r.status().message();
    const Limit limit = ParseLimit(m);
    const double measured = ParseSize(m);
    if (m.find("quarantined") != std::string::npos && measured > 0 && limit.before > 0 && limit.after > 0) {
      const double counted_steps = (norm / measured) * (norm / measured);  // what the syncer divided by
      norm = 0.95 * limit.after * limit.before * std::sqrt(counted_steps);
    } else if (m.find("absurd") != std::string::npos && limit.after > 0) {
      norm = 0.95 * limit.after;
    } else {
      return r;
    }
  }
  return r;
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::SendScaledLocked(const syncer::PushHeaderData& h,
                                                                    const std::vector<float>& delta, double norm) {
  const double have = diloco::L2Norm(delta);
  std::vector<float> scaled(delta);
  if (have > 0) {
    const auto k = static_cast<float>(norm / have);
    for (float& v : scaled) v *= k;
  }
  std::vector<std::byte> payload;
  ATOLL_RETURN_IF_ERROR(diloco::Encode(uplink_, scaled, payload));
  return SendLocked(h, payload);
}

StatusOr<syncer::PushResult> AdversarialSyncerApi::ReplayLocked(const syncer::PushHeaderData& h,
                                                                std::span<const std::byte> payload) {
  syncer::PushHeaderData numbered = h;
  numbered.push_seq = seq_ + 1;
  auto r = SendLocked(h, payload);
  sent_.push_back({numbered, {payload.begin(), payload.end()}});
  if (sent_.size() > kReplayed) sent_.pop_front();
  for (const Sent& s : sent_) {  // byte for byte, its number included
    counters_.sent += 1;
    (inner_.Push(s.header, s.payload).ok() ? counters_.accepted : counters_.refused) += 1;
  }
  return r;
}

}  // namespace atl::learner
