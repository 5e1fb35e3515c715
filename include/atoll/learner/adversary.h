// Adversarial learner: a SyncerApi decorator that rewrites one learner's pushes as a compromised
// learner holding only its own valid credential would, to measure what the syncer's defences hold
// (docs/security.md; tests/runtime/adversary_test.cc, bench/bench_adversary.cc). It learns the
// syncer's bounds only from what the syncer tells it (the refusals' messages name their limits),
// and numbers every push it sends itself within the learner's push session. Joins, heartbeats,
// pulls and leaves pass through unchanged, so the learner under it trains honestly.
//
// Attacks (Attack):
//   none          passes everything through (the clean run)
//   inflate       its outer gradient scaled to just inside every bound in force (the absolute
//                 bound, then the quarantine of outliers: it probes, reads the limit a refusal
//                 names, and resends at 0.95 of it), claiming 16x its steps and 4x its tokens per
//                 step (the bounds on counters)
//   ratchet       each push 19x the size of its own previous accepted push of the fragment
//   claim-steps   its steps claimed as 2^40, its tokens at its own rate per step
//   claim-tokens  its tokens claimed as 2^40
//   zero          an outer gradient of zeros with honest counters
//   replay        every push sent, then it and the previous ones sent again byte for byte
//   against       the negated outer gradient, scaled and claimed as inflate does
// Thread-safety: as the decorated API (each method may be called from any thread).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/diloco/codec.h"
#include "atoll/syncer/api.h"

namespace atl::learner {

enum class Attack { kNone, kInflate, kRatchet, kClaimSteps, kClaimTokens, kZero, kReplay, kAgainst };
inline constexpr EnumNames<Attack, 8> kAttackNames{"attack",
                                                   {{{Attack::kNone, "none"},
                                                     {Attack::kInflate, "inflate"},
                                                     {Attack::kRatchet, "ratchet"},
                                                     {Attack::kClaimSteps, "claim-steps"},
                                                     {Attack::kClaimTokens, "claim-tokens"},
                                                     {Attack::kZero, "zero"},
                                                     {Attack::kReplay, "replay"},
                                                     {Attack::kAgainst, "against"}}}};
constexpr const auto& NamesOf(Attack) { return kAttackNames; }
inline const char* AttackName(Attack a) { return kAttackNames.Name(a); }
inline StatusOr<Attack> ParseAttack(std::string_view name) { return kAttackNames.Parse(name); }
// Every attack but kNone, in the order above.
std::vector<Attack> AllAttacks();

struct AdversaryCounters {
  int64_t pushes = 0;    // pushes of the learner under it
  int64_t sent = 0;      // pushes it sent (probes and replays included)
  int64_t accepted = 0;  // of those, accepted
  int64_t refused = 0;   // refused (quarantined, absurd, replays, ...)
};

class AdversarialSyncerApi final : public syncer::SyncerApi {
 public:
  AdversarialSyncerApi(syncer::SyncerApi& inner, Attack attack);

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData& request) override;
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int learner_id, const syncer::LearnerProgress& progress) override;
  Status Leave(int learner_id) override;
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData& header, std::span<const std::byte> payload) override;
  StatusOr<syncer::PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                     int64_t want_version) override;

  AdversaryCounters counters() const;

 private:
  struct Sent {
    syncer::PushHeaderData header;
    std::vector<std::byte> payload;
  };
  // Sends one push under the adversary's own numbering (mu_ held).
  StatusOr<syncer::PushResult> SendLocked(syncer::PushHeaderData h, std::span<const std::byte> payload);
  // The learner's push `h` of outer gradient `delta`, rewritten by the attack and sent (mu_ held).
  StatusOr<syncer::PushResult> AttackLocked(syncer::PushHeaderData h, std::vector<float> delta);
  // inflate / against: `delta` (its direction) at the largest size the syncer has let through,
  // probing upward and settling at 0.95 of the limit a refusal names.
  StatusOr<syncer::PushResult> InflateLocked(syncer::PushHeaderData h, const std::vector<float>& delta);
  StatusOr<syncer::PushResult> SendScaledLocked(const syncer::PushHeaderData& h, const std::vector<float>& delta,
                                                double norm);
  // replay: the push, then it and the last few again, byte for byte.
  StatusOr<syncer::PushResult> ReplayLocked(const syncer::PushHeaderData& h, std::span<const std::byte> payload);

  syncer::SyncerApi& inner_;
  const Attack attack_;
  mutable std::mutex mu_;
  diloco::CodecOptions uplink_;  // from the join reply; guarded by mu_
  uint64_t seq_ = 0;             // its own numbering of what it sends; guarded by mu_
  std::map<int, double> size_;   // per fragment: the size (norm / √steps) it aims at; guarded by mu_
  std::deque<Sent> sent_;        // the last pushes, for replay; guarded by mu_
  AdversaryCounters counters_;   // guarded by mu_
};

}  // namespace atl::learner
