// SyncerCore: the syncer's whole state and its transitions, with no threads and no sockets.
//
// Holds the global parameters Θ split into P fragments, the Nesterov buffer per fragment, the
// public copy Φ (see exchange/fragment_exchange.h) with a short history of versions, a version
// and round counter per fragment, the pending contributions of each fragment's open round, and a
// table of learners. Every input is validated; a rejected input returns a Status that says what
// was wrong and changes no state.
//
// Late contributions: a push carries the public version it was computed against, not a round
// number. Whatever round of that fragment is open when it arrives is the one it joins, and its
// outer gradient is taken against the *current* Θ_p. So an update that arrives after "its" round
// closed is folded into the next round of that fragment, never dropped (docs/decisions/003).
// Only a base version that has fallen out of the history is refused (Aborted: pull again).
//
// Thread-safety: none. The syncer's event-loop thread owns the one instance (docs/threading).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "atoll/core/clock.h"
#include "atoll/core/status.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"
#include "atoll/syncer/round_policy.h"

namespace atl::syncer {

inline constexpr uint32_t kProtocolVersion = 1;

struct SyncerOptions {
  std::string run_id = "atoll";
  std::string mode = "decoupled";   // decoupled | diloco
  int H = 24;
  RoundOptions round;
  diloco::MergeRule merge_rule = diloco::MergeRule::kRda;
  diloco::OuterOptimizerOptions outer;
  diloco::CodecOptions uplink{diloco::Encoding::kInt4, 128};
  diloco::CodecOptions downlink{diloco::Encoding::kInt4, 128};
  double learner_timeout_s = 10.0;  // silent this long → no longer live
  int history_versions = 16;        // public-copy versions kept as uplink bases
  uint64_t incarnation = 0;         // changes on every (re)start of the syncer
};

struct LearnerRecord {
  int id = -1;
  std::string host;
  TimePoint last_seen{};
  std::string state = "joining";
  int joins = 0;
  int64_t step = 0, tokens = 0;
  double loss = 0, step_seconds = 0, tokens_per_second = 0;
  int64_t bytes_up = 0, bytes_down = 0;   // as the syncer counted them
  int64_t pushes = 0, pushes_rejected = 0, rounds_joined = 0, late_folded = 0;
  int64_t tokens_merged = 0;              // c_tokens of contributions merged into Θ
};

struct JoinRequestData {
  uint32_t protocol_version = 0;
  std::string run_id;
  uint64_t model_signature = 0;
  int learner_id = -1;
  std::string host;
  bool rejoin = false;
};

struct JoinReplyData {
  int learner_id = -1;
  std::vector<int64_t> versions;
  std::vector<int64_t> fragment_numel;
  int H = 0, tau = 0;
  std::string mode;
  diloco::CodecOptions uplink, downlink;
  uint64_t incarnation = 0;
};

struct HeartbeatReplyData {
  std::vector<int64_t> versions;
  bool finish = false;
  uint64_t incarnation = 0;
};

struct PushHeaderData {
  int learner_id = -1;
  int fragment = -1;
  int64_t base_version = -1;
  int64_t c_tokens = 0, c_steps = 0;
  diloco::Encoding encoding = diloco::Encoding::kInt4;
  int block_size = 0;
  int64_t num_values = 0;
  int64_t local_step = 0;
};

struct PushResult {
  int64_t round = 0;
  std::string note;
};

struct PullPayload {
  int fragment = 0;
  int64_t version = 0;
  bool not_modified = false;
  bool is_delta = false;
  int64_t base_version = -1;
  diloco::CodecOptions codec;
  std::vector<std::byte> bytes;     // encoded delta, or fp32 values of Φ
  uint64_t value_checksum = 0;      // of Φ at `version`
};

// One closed round, for the log and metrics.
struct RoundReport {
  int fragment = 0;
  int64_t round = 0;
  int64_t version = 0;             // the version it produced
  std::vector<int> contributors;
  std::vector<double> weights;
  std::vector<int> late;           // live learners that missed it
  double grace_seconds = 0;
  double merged_norm = 0;
  int64_t tokens_merged = 0;
  std::string reason;
  TimePoint closed_at{};
};

class SyncerCore {
 public:
  // `initial` holds Θ⁰ per fragment (plan layout). InvalidArgument when sizes mismatch or the
  // options are inconsistent (H < P, bad codec, quorum < 1).
  static StatusOr<SyncerCore> Create(SyncerOptions options, diloco::FragmentPlan plan,
                                     std::vector<std::vector<float>> initial);

  StatusOr<JoinReplyData> Join(const JoinRequestData& request, TimePoint now);
  // Updates the learner's progress row. NotFound for an unknown learner.
  Status Heartbeat(int learner_id, const LearnerRecord& progress, TimePoint now);
  // Accepts one decoded push. Validates everything first; on error nothing changes.
  StatusOr<PushResult> Push(const PushHeaderData& header, std::span<const std::byte> payload,
                            TimePoint now);
  // Runs the round policy of every fragment with an open round; closes those it says to close.
  // `clock` times the merge for the t_sync estimate. Returns the closed rounds.
  std::vector<RoundReport> Poll(TimePoint now, const Clock& clock);
  // Earliest pending grace deadline, if any.
  std::optional<TimePoint> NextWake(TimePoint now) const;
  // What a learner holding `have_version` of `fragment` should receive now.
  StatusOr<PullPayload> Pull(int fragment, int64_t have_version) const;

  // Accounting hooks for the transport (bytes on the wire per learner and direction).
  void CountBytes(int learner_id, int64_t up, int64_t down);
  // Marks a learner finished (it will not be counted as live any more).
  void MarkDone(int learner_id);

  const diloco::FragmentPlan& plan() const { return plan_; }
  const SyncerOptions& options() const { return options_; }
  int64_t version(int fragment) const { return fragments_[fragment].version; }
  std::vector<int64_t> versions() const;
  int64_t rounds_closed() const { return rounds_closed_; }
  std::span<const float> theta(int fragment) const { return fragments_[fragment].theta; }
  std::span<const float> public_copy(int fragment) const { return fragments_[fragment].public_copy; }
  const std::map<int, LearnerRecord>& learners() const { return learners_; }
  std::vector<int> LiveLearners(TimePoint now) const;
  const RoundEstimates& estimates() const { return estimates_; }
  nlohmann::json StatusJson(TimePoint now) const;

 private:
  struct Contribution {
    int learner = -1;
    int64_t c_tokens = 0, c_steps = 0;
    int64_t base_version = 0;
    std::vector<float> local;  // θ_{m,p} reconstructed as Φ_base − Δ̂
    TimePoint arrived{};
  };
  struct FragmentState {
    std::vector<float> theta, momentum, public_copy;
    int64_t version = 0;
    std::deque<std::pair<int64_t, std::vector<float>>> history;  // (version, Φ at it), oldest first
    std::vector<std::byte> last_delta;                            // Φ(version−1) → Φ(version)
    uint64_t public_checksum = 0;
    int64_t round = 0;
    std::vector<Contribution> pending;
    std::optional<TimePoint> opened_at, quorum_at;
  };

  SyncerCore(SyncerOptions options, diloco::FragmentPlan plan);
  RoundReport CloseRound(int p, const RoundDecision& decision, TimePoint now, const Clock& clock);
  const std::vector<float>* PublicAt(const FragmentState& f, int64_t version) const;

  SyncerOptions options_;
  diloco::FragmentPlan plan_;
  std::vector<FragmentState> fragments_;
  std::map<int, LearnerRecord> learners_;
  RoundEstimates estimates_;
  int64_t rounds_closed_ = 0;
};

}  // namespace atl::syncer
