// SyncerCore: the syncer's whole state and its transitions, with no threads and no sockets.
//
// Holds the global parameters Θ split into P fragments, the Nesterov buffer per fragment (only
// when the outer step keeps one), a version and round counter per fragment, the pending
// contributions of each fragment's open round, a table of learners, and per fragment the one
// public copy Φ_p that learners hold, with a bounded history of the deltas that made its recent
// versions (syncer/public_copy.h, docs/decisions/014). Nothing is kept per (learner, fragment):
// memory does not grow with the number of learners beyond their table rows and the pushes of the
// open rounds. Every input is validated; a rejected input returns a Status that says what was
// wrong and changes no state.
//
// Downlink. Every closed round advances Φ_p by one lattice delta of Θ_p − Φ_p (error feedback).
// A learner that holds version u of Φ_p gets the current version as one message — the exact sum
// of the deltas since u while u is in the history, else the full copy — and lands on exactly the
// bits the syncer holds (value checksums on every pull). A learner process that starts from the
// run's seed holds Θ_p as the run started: its join checksums say so, it snaps those values to
// the lattice itself and holds version 0. A reply lost in transit costs nothing: the learner asks
// again from the version it holds (a pull changes no state).
//
// Late contributions: a push carries the version of the copy it was computed against, not a round
// number. Whatever round of that fragment is open when it arrives is the one it joins, and its
// outer gradient is taken against the *current* Θ_p. So an update that arrives after "its" round
// closed is folded into the next round of that fragment, never dropped (docs/decisions/003).
// Only a base the syncer no longer holds is refused (Aborted: pull the fragment in full).
//
// Pushes of an open round are kept in the quantiser's layout (inflated, checked, with the size of
// their decoded values); the round that closes decodes them tile by tile, in a pass over the
// fragment on the core's pool that merges, steps Θ_p and advances Φ_p (docs/decisions/018): it
// holds no decoded contribution, only a few tiles per thread.
//
// Thread-safety: none. The syncer's event-loop thread owns the one instance
// (docs/architecture.md#threading).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "atoll/core/clock.h"
#include "atoll/core/enum_names.h"
#include "atoll/core/parallel.h"
#include "atoll/core/status.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/mode.h"
#include "atoll/diloco/outer_optimizer.h"
#include "atoll/syncer/api.h"
#include "atoll/syncer/public_copy.h"
#include "atoll/syncer/round_policy.h"
#include "atoll/syncer/update_rule.h"

namespace atl::syncer {

// ddp mode (a parameter server): a push carries a learner's raw gradient of its current step,
// a round averages the gradients of all live learners and this hook applies the inner optimizer
// to Θ (the whole model: ddp runs with P = 1 because gradient clipping is global). Learners then
// pull Θ like any fragment. The hook owns the optimizer state.
using DdpStep = std::function<Status(std::span<const float> mean_gradient, std::span<float> theta)>;

// How a closed round moves Θ_p (docs/decisions/007).
//   kSweep: each round moves Θ_p by its token share ρ of a full round and momentum is updated
//           once per full round's worth of tokens (diloco::SweepOuterStep). The default for
//           decoupled mode.
//   kRound: one full Nesterov step per round, whatever it holds (synchronous modes, where every
//           round holds every learner).
//   kRunning: as kSweep, but between rounds Θ_p holds the synchronous step estimated from the
//           sweep's arrivals so far, and outer gradients "against the current value" are taken
//           against Θ_p at the sweep's start (diloco::SweepOuterStep with extrapolate).
enum class OuterStepRule { kSweep, kRound, kRunning };
inline constexpr EnumNames<OuterStepRule, 3> kOuterStepRuleNames{
    "outer_step",
    {{{OuterStepRule::kSweep, "sweep"}, {OuterStepRule::kRound, "round"}, {OuterStepRule::kRunning, "running"}}}};
constexpr const auto& NamesOf(OuterStepRule) { return kOuterStepRuleNames; }
inline const char* OuterStepRuleName(OuterStepRule r) { return kOuterStepRuleNames.Name(r); }
inline StatusOr<OuterStepRule> ParseOuterStepRule(std::string_view s) { return kOuterStepRuleNames.Parse(s); }
// What a learner's outer gradient is taken against.
//   kCurrent: v_m = Θ_p(now) − θ_m (the paper: the syncer's current value).
//   kBase:    v_m = Φ_{m,p}[base] − θ_m = Δ̂_m (the learner's own progress since the copy it
//             started from, as in asynchronous local SGD).
enum class OuterGradientRule { kCurrent, kBase };
inline constexpr EnumNames<OuterGradientRule, 2> kOuterGradientRuleNames{
    "outer_gradient", {{{OuterGradientRule::kCurrent, "current"}, {OuterGradientRule::kBase, "base"}}}};
constexpr const auto& NamesOf(OuterGradientRule) { return kOuterGradientRuleNames; }
inline const char* OuterGradientRuleName(OuterGradientRule r) { return kOuterGradientRuleNames.Name(r); }
inline StatusOr<OuterGradientRule> ParseOuterGradientRule(std::string_view s) {
  return kOuterGradientRuleNames.Parse(s);
}

struct SyncerOptions {
  std::string run_id = "atoll";
  diloco::Mode mode = diloco::Mode::kDecoupled;
  DdpStep ddp_step;  // required in ddp mode
  int H = 24;
  RoundOptions round;
  diloco::MergeRule merge_rule = diloco::MergeRule::kRda;
  diloco::WeightRule weight_rule = diloco::WeightRule::kTokens;  // how contributions are weighted
  diloco::OuterOptimizerOptions outer;
  OuterStepRule outer_step = OuterStepRule::kSweep;
  OuterGradientRule outer_gradient = OuterGradientRule::kCurrent;
  diloco::CodecOptions uplink{diloco::Encoding::kInt4, 128};
  // The downlink: each round's lattice delta at most DownlinkQmax(encoding) steps per value, in
  // blocks of block_size (the lattice's block), with the run's lossless stage.
  diloco::CodecOptions downlink{diloco::Encoding::kInt4, 128};
  // Deltas of the public copy kept per fragment (a learner at most this many versions behind
  // catches up with one delta), and at most this many bytes of them per parameter — but at least
  // history_min_bytes per fragment, so that small models keep a long history (0: no bound).
  int history_versions = 32;
  double history_bytes_per_value = 2.0;
  size_t history_min_bytes = size_t{1} << 20;
  // Threads that decode, merge and encode a round, over tiles of the fragment (0: one per
  // hardware thread; 1: the loop thread alone). The result is the same bits either way.
  int threads = 0;
  // The open rounds hold at most this many bytes of pushes (in the quantiser's layout, about half a
  // byte per value for int4); a push beyond is refused with RESOURCE_EXHAUSTED (the learner backs
  // off and pushes again). 0: no bound.
  int64_t max_pending_bytes = int64_t{4} << 30;
  double learner_timeout_s = 10.0;  // silent this long → no longer live
  uint64_t incarnation = 0;         // changes on every (re)start of the syncer
  // Leadership through etcd (docs/decisions/022), for the status and the summary: the epoch (0:
  // none), this candidate's id, whether it took over a run an earlier leader began, and whether it
  // resumed from the commits it had followed as a standby (docs/decisions/023).
  struct Leadership {
    uint64_t epoch = 0;
    std::string candidate_id;
    bool took_over = false;
    bool from_replica = false;
  };
  Leadership leadership;
  // Hostile or broken input. An outer gradient whose size ‖v‖/√c_steps (an outer gradient grows
  // with the inner steps behind it) exceeds quarantine_factor × its reference (below) is quarantined: not merged,
  // logged, counted. Honest learners vary by a few × over a run (warm-up, decay); garbage is
  // orders of magnitude off. 0 turns the check off.
  double quarantine_factor = 20.0;
  int quarantine_window = 32;
  int quarantine_min_history = 8;
  // Robust references against one compromised learner (docs/security.md). Once at least
  // quarantine_min_learners other learners pushed the fragment (live ones at any time, others
  // within the last quarantine_window versions), a push is judged against the upper median of their latest pushes only (its own never
  // move its reference): its size against their sizes, its c_steps bounded by max_steps_factor ×
  // theirs and its tokens per step by max_tokens_per_step_factor × theirs (the tokens it is
  // credited with), its merge weight by max_weight_factor × theirs (the weight alone). With fewer,
  // c_steps is bounded by max_steps_factor × H and the size is judged against the fragment's recent
  // accepted non-zero sizes. The latest push of every learner is persisted with the learner table.
  // Nothing is quarantined before the fragment's version quarantine_min_history (the warm-up).
  int quarantine_min_learners = 2;
  double max_steps_factor = 16.0;
  double max_tokens_per_step_factor = 4.0;
  double max_weight_factor = 4.0;
  // What a push is credited with (its tokens in tokens_merged, goodput and the round's share, and
  // the steps its weight counts) is bounded by the time the syncer saw pass: at most
  // max_step_rate_factor × the other learners' step rate (the upper median of their credited steps
  // per second, once quarantine_min_learners others have one) × the seconds since the learner's
  // previous push of that fragment (or its first join), plus up to H steps left over from its
  // earlier pushes; its tokens keep its (bounded) rate per step. With fewer rated others, at most
  // max_steps_factor × H steps per push. 0 turns the time bound off.
  double max_step_rate_factor = 4.0;
  // ... and by the learner's own heartbeats, where they count steps: at most pace_slack × the
  // steps they counted (SyncerCore::PacedStepsLeft), and pace_slack × its tokens per step (step
  // and token counters over the syncer's clock, windows of at least 2 s). 0 turns it off.
  double pace_slack = 1.25;
  // A push's influence u ∈ [0, 1] (docs/security.md, docs/decisions/020): how much of its share it
  // may move Θ_p by, and of its weight it may vote with (u²), and how much it counts in a full
  // round (TokenShare). u is 1 for a push whose size is within influence_size_factor of its
  // reference either way (the others' upper median; before two others pushed the fragment, its
  // recent sizes; before any push, 0.05 × (‖Θ_p‖ + 1) per √H steps; a final sync from above only)
  // and whose direction agrees with the other learners' latest pushes (the upper median of the
  // cosines of their sketches, once quarantine_min_learners others pushed it) by at least
  // influence_min_cosine; beyond, u falls in proportion (size) and to 0 at a cosine of 0 or below.
  // 0 turns the size or direction part off. Decoupled mode judges a push as it arrives, one that
  // found no references again at its round's close; the synchronous modes judge a round's pushes
  // together at its close, each against the others of the round (JudgeAtClose).
  double influence_size_factor = 2.0;
  double influence_min_cosine = 0.1;
  // A learner whose pushes are rejected as invalid this many times in a row (not counting
  // ABORTED, which only asks for a full fetch, nor quarantine) is disconnected for ban_seconds: its joins, heartbeats and pushes
  // are refused with PERMISSION_DENIED (pulls change no state and are still served).
  int max_consecutive_rejects = 8;
  double ban_seconds = 300.0;
  // Numeric safety (syncer/guards.h, docs/security.md), from the first push on: a push whose
  // outer gradient norm exceeds max_gradient_ratio × (‖Θ_p‖ + 1) is refused (InvalidArgument);
  // a round that leaves Θ_p, the momentum or the sweep non-finite, or whose step (or momentum)
  // norm exceeds max_step_ratio × (‖Θ_p before‖ + 1), is refused: rolled back, never committed.
  // 0 turns a bound off (finiteness is always checked).
  double max_gradient_ratio = 1e3;
  double max_step_ratio = 1e3;
  // The learner table holds at most this many rows (RESOURCE_EXHAUSTED beyond); ids are -1
  // (assign) or 0..max_learner_id.
  int max_learners = 4096;
  int max_learner_id = 1'000'000;
  size_t max_host_bytes = 256;  // Join's host, cut at a UTF-8 boundary
  // A sharded syncer (docs/decisions/011): this core owns the fragments p with p mod count =
  // index; it holds the whole plan (so fragment indices, the model signature and Θ⁰ are the
  // same at every shard) but serves pushes and pulls of its own fragments only
  // (FailedPrecondition for another shard's), and refuses a learner that names another shard.
  // The default {0, 1} is the one unsharded syncer.
  ShardSpec shard;
};

// The upper median of `v` (non-empty; the larger middle value of an even count): one value of
// k ≥ 2 that is lowered to zero never lowers it below the others' middle, nor raises it above them.
double UpperMedianOf(std::vector<double> v);
// The lower median (the smaller middle value of an even count): one value of k ≥ 2 that is raised
// without bound never raises it above the others' middle.
double LowerMedianOf(std::vector<double> v);

// A learner's latest push of one fragment as the robust references see it (bounded counters).
struct PushSample {
  int64_t version = -1;        // the fragment's version when it arrived (-1: no push yet)
  double size = 0;             // ‖v‖ / √steps
  double steps = 0;            // c_steps, bounded
  double tokens_per_step = 0;  // c_tokens / c_steps, bounded
  double weight = 0;           // merge weight, bounded
  double influence = 1;        // u of the push (TokenShare counts the learner for u of a full round's member)
  TimePoint at{};              // when it was recorded
  // Its outer gradient's values at the fragment's sketch positions (SyncerCore::Sketch): what the
  // others' directions are compared with. Not persisted (empty: not judged by).
  std::vector<float> sketch;
};

// What a learner may still be credited for one fragment (docs/security.md): its time since `since`
// at the bounded step rate, plus `carried` steps its earlier pushes left unused (H from its first
// join on); and
// the steps per second it was credited with there (EMA; 0: none yet), the others' reference.
struct StepAllowance {
  TimePoint since{};
  double carried = 0;
  double rate = 0;
  // The steps its next push may count in a round's share: the others' rate (not a multiple of it)
  // over its time since `since`, plus these left over (at most H).
  double share_carried = 0;
  double rate_before = 0;  // `rate` as it stood before the instant `since` (what others are judged by then)
};

struct LearnerRecord {
  int id = -1;
  std::string host;
  TimePoint last_seen{};
  LearnerState state = LearnerState::kJoining;
  int joins = 0;
  int64_t step = 0, tokens = 0;
  double loss = 0, step_seconds = 0, tokens_per_second = 0;
  int64_t version_held = -1;             // newest fragment version the learner holds
  int64_t bytes_up = 0, bytes_down = 0;  // as the syncer counted them
  int64_t pushes = 0, pushes_rejected = 0, rounds_joined = 0, late_folded = 0;
  int64_t quarantined = 0;
  int64_t contributions_refused = 0;  // merged into a round that was refused (numeric safety)
  int64_t telemetry_rejected = 0;     // heartbeat values out of their sane range (ignored)
  int consecutive_rejects = 0;
  TimePoint banned_until{};  // disconnected until then (0: never banned)
  // Tokens whose updates were merged into Θ: Σ c_tokens / P over merged contributions (a token
  // updates all P fragments, and each fragment's contribution counts it once).
  double tokens_merged = 0;
  double tokens_per_step = 0;  // c_tokens / c_steps of its pushes (EMA): a full round's size
  // Its pace as its heartbeats report it, measured on the syncer's clock over windows of at least
  // 2 s: steps per second and tokens per step (EMAs; 0: not measured yet), from the window's start.
  // Not persisted (measured again within seconds).
  // Also the step counter of its latest heartbeat, and when it came (-1: no heartbeat yet).
  struct Pace {
    TimePoint at{};
    int64_t step = -1, tokens = 0;
    double step_rate = 0, tokens_per_step = 0;
    int64_t latest_step = -1;
    TimePoint latest_at{};
  };
  Pace pace;
  // Per fragment, the steps its pushes were credited with by this syncer process since its step
  // counter last went back (a restarted learner process): the own-pace bound
  // (SyncerCore::PacedStepsLeft). Not persisted.
  std::vector<double> paced_steps;
  // Per fragment, the steps (and their tokens) of its merged pushes that its heartbeats had not yet
  // counted when they arrived: held, not dropped, and credited (to tokens_merged and paced_steps)
  // as soon as its heartbeats count them (SyncerCore::ReleaseHeldCredit). A heartbeat can lag its
  // pushes by seconds on a loaded host. Persisted.
  struct Held {
    double steps = 0, tokens = 0;
  };
  std::vector<Held> held;
  // Per fragment, what its next push may be credited with (only the rates are persisted: a restored
  // learner gets H steps and the time from its restore).
  std::vector<StepAllowance> allowances;
  // The push session of its latest join (0: none, e.g. restored after a restart: it joins again
  // before it pushes) and the highest sequence number judged in it (docs/decisions/019).
  uint64_t push_session = 0, push_seq = 0;
  int64_t replays_refused = 0;  // pushes refused as replays (sequence number already used)
  // Tokens and steps (÷ P) credited in rounds that closed before any rate per step could judge
  // them (the first pushes of a run): settled once a rate exists, the excess taken back from
  // tokens_merged (SyncerCore::SettleUnjudgedCredit). Not persisted.
  double unjudged_tokens = 0, unjudged_steps = 0;
  // Per fragment, the newest committed version that merged a push of this learner (-1: none yet).
  // A learner that rejoins a restarted syncer compares it with the version it was promised, to
  // tell a push the old process committed from one it lost.
  std::vector<int64_t> merged_versions;
  // Per fragment, its latest push that passed the header and decoding checks (quarantined ones
  // too: after a real change of Θ every honest size moves, and they must lift each other's
  // reference). Zero-size pushes are not recorded.
  std::vector<PushSample> samples;
  // Per fragment, its latest push recorded before the instant of samples[p], and its tokens per
  // step before tokens_per_step_at: pushes that arrive at the same instant (simulated time) judge
  // each other by what stood before it, whatever order the threads delivered them in.
  std::vector<PushSample> earlier_samples;
  double tokens_per_step_before = 0;
  TimePoint tokens_per_step_at{};
  // What its latest join declared it holds (a rebuilding syncer, docs/decisions/021): per fragment
  // the value checksum and version of its public copy (empty: not said). Not persisted.
  std::vector<uint64_t> declared_checksums;
  std::vector<int64_t> declared_versions;
  // What a push arriving at `now` is judged by: its latest push of fragment p recorded before `now`
  // (nullptr: none), its tokens per step and its credited step rate of p as they stood before `now`.
  const PushSample* SampleBefore(size_t p, TimePoint now) const;
  double TokensPerStepBefore(TimePoint now) const;
  double StepRateBefore(size_t p, TimePoint now) const;
};

// One closed round, for the log and metrics.
struct RoundReport {
  int fragment = 0;
  int64_t round = 0;    // the fragment's version before it
  int64_t version = 0;  // the version it produced: round + 1
  std::vector<int> contributors;
  std::vector<double> weights;
  std::vector<int> late;  // live learners that missed it
  double grace_seconds = 0;
  double merged_norm = 0;
  double tokens_merged = 0;     // Σ c_tokens / P of the contributors
  double token_share = 1;       // ρ: the round's tokens ÷ a full round's (1 under kRound)
  bool sweep_completed = true;  // momentum updated by this round (always under kRound)
  double step_norm = 0;         // ‖Θ_p after − before‖
  double close_seconds = 0;     // the round's pass and commit, on the clock Poll was given
  std::string reason;
  TimePoint closed_at{};
  // Numeric safety refused the round: Θ_p, momentum, sweep, version and round are as before it,
  // its contributions are dropped, and nothing is to be committed. `refusal` says why.
  bool refused = false;
  std::string refusal;
};

// A push's payload made ready for Push: inflated into the quantiser's layout and checked, with
// Σ Δ̂² of its decoded values. Pure work on the payload alone, so a transport does it on its own
// thread before the call reaches the syncer's loop. `status` is DataLoss for a corrupt payload
// (Push reports it after the header's own checks).
struct PreparedPush {
  size_t payload_bytes = 0;  // as it arrived (checked against the header)
  Status status;
  std::vector<std::byte> raw;
  double sum_squares = 0;
};
PreparedPush PreparePush(const diloco::CodecOptions& uplink, std::span<const std::byte> payload, size_t numel,
                         ThreadPool* pool = nullptr);

// A push header's shape: a fragment in [0, num_fragments), the run's uplink encoding, block and
// compression, and as many values as that fragment has (`numel_of(fragment)`). InvalidArgument
// naming what differs. The one statement of the rule: SyncerCore refuses a push that fails it, and
// SyncerLoop::Push prepares the payload only of a push that passes it.
Status CheckPushShape(const PushHeaderData& h, const diloco::CodecOptions& uplink, int num_fragments,
                      const std::function<size_t(int)>& numel_of);

class SyncerCore {
 public:
  // `initial` holds Θ⁰ per fragment (plan layout; another shard's fragments may be empty).
  // InvalidArgument when sizes mismatch or the options are inconsistent (H < P, bad codec,
  // quorum < 1).
  static StatusOr<SyncerCore> Create(SyncerOptions options, diloco::FragmentPlan plan,
                                     std::vector<std::vector<float>> initial);

  StatusOr<JoinReplyData> Join(const JoinRequestData& request, TimePoint now);
  // Updates the learner's progress row. NotFound for an unknown learner, or for one silent past
  // the learner timeout when the call `arrived` (default: now; SyncerLoop passes the time the
  // call reached it, so that a busy loop does not make its queued callers look silent).
  Status Heartbeat(int learner_id, const LearnerProgress& progress, TimePoint now,
                   std::optional<TimePoint> arrived = std::nullopt);
  // The learner leaves (done): no longer live. NotFound for an unknown learner.
  Status Leave(int learner_id, TimePoint now);
  // Accepts one push. Validates everything first; on error nothing changes.
  StatusOr<PushResult> Push(const PushHeaderData& header, std::span<const std::byte> payload, TimePoint now,
                            std::optional<TimePoint> arrived = std::nullopt);
  // The same with its payload prepared by the caller (PreparePush with this core's uplink codec
  // and the fragment's size; a preparation for another size is refused as a bad payload).
  StatusOr<PushResult> Push(const PushHeaderData& header, PreparedPush prepared, TimePoint now,
                            std::optional<TimePoint> arrived = std::nullopt);
  // Runs the round policy of every fragment with an open round; closes those it says to close.
  // `clock` times the merge for the t_sync estimate. Returns the closed rounds.
  std::vector<RoundReport> Poll(TimePoint now, const Clock& clock);
  // End of the run: closes every round that has contributions now, whatever the policy says
  // (reason "final"), so nothing a learner pushed before finishing is left unmerged.
  std::vector<RoundReport> CloseAllPending(TimePoint now, const Clock& clock);
  // Earliest pending grace deadline, if any.
  std::optional<TimePoint> NextWake(TimePoint now) const;
  // What learner `learner_id`, holding its copy of `fragment` at `have_version` (-1: none),
  // should receive now: a delta from that version, or the full copy. Changes no state (a lost
  // reply is asked again). NotFound for a learner that has not joined; InvalidArgument for a bad
  // fragment; FailedPrecondition for a version this syncer never produced. A learner that holds a
  // version in the history and wants one the fragment has not reached yet (`want_version`) gets
  // not_modified: intermediate versions are not worth a download.
  StatusOr<PullPayload> Pull(int learner_id, int fragment, int64_t have_version, int64_t want_version = -1);
  // The same reply, shared with the public copy's cache (the gRPC server sends it as it is).
  StatusOr<SharedPull> PullShared(int learner_id, int fragment, int64_t have_version, int64_t want_version = -1);

  // The one admission check of a push: a joined learner that is not disconnected and has been
  // in contact (NotFound, PermissionDenied: not counted against it), then its header — a fragment
  // this core owns (FailedPrecondition), the run's codec and the fragment's size, a payload of
  // `payload_bytes` (exactly the encoded size without compression, 1 to diloco::MaxPayloadSize
  // with deflate), sane counters, a base version this syncer produced (InvalidArgument; Aborted
  // for a base the rule cannot use). The transport calls it with the size a header announces,
  // before it reserves any memory for the payload; Push calls it with the payload's. Changes no
  // state (the refusal of a bad header is counted by RecordRejectedPush or Push).
  Status CheckPush(const PushHeaderData& header, size_t payload_bytes, TimePoint now,
                   std::optional<TimePoint> arrived = std::nullopt) const;
  // What Heartbeat does with a learner's step and tokens counters: a new window of its pace
  // (LearnerRecord::pace) once 2 s have passed since the last; counters that went back (a
  // restarted process) start a new window, and what its pushes were credited with under its own
  // pace counts again from there.
  static void UpdatePace(LearnerRecord& l, const LearnerProgress& progress, TimePoint now);
  // Accounting hooks for the transport (bytes on the wire per learner and direction).
  void CountBytes(int learner_id, int64_t up, int64_t down);
  // A push of a joined learner that the transport refused before it reached Push (a malformed
  // header, a size that is not the announced one, a corrupted chunk): counted like a push that
  // Push rejects, toward the disconnect rule. Returns `why` with the push's context (and the
  // disconnect, when this one caused it); NotFound for a learner that has not joined.
  Status RecordRejectedPush(const PushHeaderData& header, const Status& why, TimePoint now);
  // The newest evaluation of the global model made during the run (shown in StatusJson).
  void SetGlobalEval(double loss, int64_t at_rounds) {
    global_eval_loss_ = loss;
    global_eval_rounds_ = at_rounds;
  }
  double tokens_merged() const;

  const diloco::FragmentPlan& plan() const { return plan_; }
  const SyncerOptions& options() const { return options_; }
  // Whether this core owns `fragment` (every fragment when unsharded).
  bool owns(int fragment) const { return options_.shard.owns(fragment); }
  int64_t version(int fragment) const { return fragments_[fragment].version; }
  std::vector<int64_t> versions() const;
  int64_t rounds_closed() const { return rounds_closed_; }
  int64_t rounds_refused() const { return rounds_refused_; }
  // Θ_p and the public copy Φ_p of an owned fragment (empty for another shard's).
  std::span<const float> theta(int fragment) const { return fragments_[fragment].theta; }
  std::span<const float> public_values(int fragment) const;
  const PublicCopy* public_copy(int fragment) const;
  const std::map<int, LearnerRecord>& learners() const { return learners_; }
  std::vector<int> LiveLearners(TimePoint now) const;
  const RoundEstimates& estimates() const { return estimates_; }
  nlohmann::json StatusJson(TimePoint now) const;
  // StatusJson's row of learner `id`.
  static nlohmann::json LearnerStatusJson(int id, const LearnerRecord& l, TimePoint now);

  // Bytes of every buffer the core holds, by kind: what grows with the model, the history, the
  // open rounds' pushes, and per-learner rows. What the memory bound is checked against (tests).
  struct HeldBytes {
    size_t theta = 0, momentum = 0, sweep = 0, public_copies = 0, pending = 0, learners = 0;
    size_t scratch = 0;  // the round pass's next values (sized for the largest fragment)
    size_t total() const { return theta + momentum + sweep + public_copies + pending + learners + scratch; }
  };
  HeldBytes held_bytes() const;

  // For DurableState: the persisted part of one fragment, and restoring it. `momentum` is empty
  // when the outer step keeps none; `public_values` and `lattice_exp` are the public copy (empty:
  // not saved — the copy is then rebuilt from Θ_p and every learner fetches the fragment in full).
  struct FragmentSnapshot {
    int64_t version = 0;  // also the number of its closed rounds
    std::vector<float> theta, momentum, public_values;
    std::vector<int8_t> lattice_exp;
    double sweep_share = 0;
  };
  FragmentSnapshot SnapshotFragment(int fragment) const;
  // Replaces fragment state (its pending contributions are dropped).
  // InvalidArgument when sizes differ from the plan or values are not finite.
  Status RestoreFragment(int fragment, FragmentSnapshot snapshot);
  // Restores accounting rows (last_seen is set to `now`, so restored learners get the timeout).
  // Call after RestoreFragment: a merged version beyond its fragment's restored one is dropped.
  void RestoreLearners(const std::map<int, LearnerRecord>& learners, TimePoint now);
  // Rounds closed in total, restored with the fragments.
  void set_rounds_closed(int64_t n) { rounds_closed_ = n; }

  // Rebuild from the learners (syncer_core_rebuild.cc, docs/decisions/021): a core whose durable
  // state was lost starts from Θ⁰ and, until `until`, adopts the public copies learners hold.
  // Meanwhile a join is answered with the fragments whose copy the syncer wants from that learner
  // (held at a newer version than the syncer's), pushes are refused (Unavailable: the learner
  // rejoins with backoff, its work stays in its parameters) and no round closes. With
  // `expected_learners` > 0 the wait ends early, as soon as that many learners have joined
  // declaring their copies and none of them holds a copy newer than the core's (nothing is left to
  // adopt from the run's learners).
  void BeginRebuild(TimePoint until, int expected_learners = 0);
  bool rebuilding(TimePoint now) const { return rebuild_until_ && now < *rebuild_until_; }
  // Adopts learner h.learner_id's offered copy of fragment h.fragment at version h.base_version:
  // Θ_p = Φ_p = `values`, that version, no history, momentum and sweep zero. Refused, with nothing
  // changed: not rebuilding (FailedPrecondition), a learner that has not joined (NotFound), a
  // fragment out of range or another shard's, a version that is not the one its join declared, not
  // newer than the fragment's (AlreadyExists), values of the wrong size, not finite, off the
  // fragment's lattice, or whose checksum is not the one declared at join (InvalidArgument). The
  // report (reason "adopted") is to be committed like a round before the version is served.
  StatusOr<RoundReport> AdoptCopy(const PushHeaderData& h, std::span<const float> values, TimePoint now);
  struct AdoptedCopy {
    int fragment = 0;
    int64_t version = 0;
    int learner = -1;
  };
  const std::vector<AdoptedCopy>& adopted() const { return adopted_; }

 private:
  struct Contribution {
    int learner = -1;
    int64_t c_tokens = 0, c_steps = 0;                            // as claimed, then bounded (BoundCounters)
    double max_weight = std::numeric_limits<double>::infinity();  // its merge weight's bound
    int64_t base_version = 0;
    bool final_sync = false;  // the learner's end-of-training push: a whole span of work (TokenShare)
    bool judged = true;       // its rate per step had a reference when it arrived (else judged at close)
    double influence = 1;     // u: the push counts u × share_steps in the round's share (TokenShare)
    double share_steps = 0;   // of its credited steps, those its time at the others' rate allows
    // Of its claimed steps within the time bound, those the learner's heartbeats had not counted
    // yet, and their tokens: LearnerRecord::held once its round merges it.
    double held_steps = 0, held_tokens = 0;
    // Judged when its round closes (JudgeAtClose): every push in the synchronous modes, one that
    // found no references in decoupled mode. Its sketch (kept until then) and size per √ share step.
    bool judge_at_close = false;
    double share_size = 0;
    std::vector<float> sketch;
    std::vector<std::byte> raw;  // the payload in the quantiser's layout; decoded when the round closes
    double delta_norm = 0;       // ‖Δ̂‖ of its decoded values
    // The merge's pass 1 for this push (its outer gradient's norms, per slice and over the
    // fragment), formed when it joined the round (JoinNorms); norm < 0: formed at the close.
    std::vector<double> slice_norms;
    double norm = -1;
    TimePoint arrived{};
  };
  struct FragmentState {
    std::vector<float> theta, momentum;  // momentum empty when the outer step keeps none
    std::optional<PublicCopy> copy;      // owned fragments only
    // XXH3 of Θ_p as the run started: a learner process that starts from the same seed holds those
    // values and snaps them to the lattice itself (Join).
    uint64_t initial_checksum = 0;
    // The fragment's one counter: round r of the fragment (its open round while r = version)
    // makes version r + 1. A refused round changes neither.
    int64_t version = 0;
    std::vector<Contribution> pending;
    std::optional<TimePoint> opened_at, quorum_at;
    std::vector<double> recent_norms;  // accepted outer-gradient norms, oldest first (bounded)
    double theta_norm = 0;             // ‖Θ_p‖, as the last round left it (the gradient bound's scale)
    diloco::SweepState sweep;          // kSweep: the partial sweep (its share is persisted)
  };
  // ρ of a round: its tokens ÷ H · Σ tokens-per-step of the live learners and its contributors. A
  // final-sync contribution (c_steps < H: all the learner did since its last receipt) counts as
  // H steps of its tokens per step: a round of every learner's final push moves Θ all the way.
  double TokenShare(const FragmentState& f, const std::vector<int>& live) const;
  // What the round policy sees of fragment state `f`.
  static RoundView ViewOf(const FragmentState& f, const std::vector<int>& live);
  // Push, in stages: header checks (no state change), decoding against the public copy at the
  // push's base, the quarantine of outliers, and admission into the fragment's open round.
  Status Reject(LearnerRecord& l, const PushHeaderData& h, Status s, TimePoint now);
  Status CheckPushingLearner(const LearnerRecord& l, const PushHeaderData& h, TimePoint now,
                             std::optional<TimePoint> arrived) const;
  Status CheckPushHeader(const PushHeaderData& h, size_t payload_bytes) const;
  // A checked push as a contribution of fragment h.fragment's open round: its base is one the
  // core still holds (else Aborted: pull in full), its size within the gradient bound.
  StatusOr<Contribution> MakeContribution(const PushHeaderData& h, PreparedPush prepared, TimePoint now) const;
  // The merge's pass 1 for a push that joins fragment p's open round, while the pool is otherwise
  // idle: what it reads (Θ_ref, Φ_p at the push's base) cannot change before this round closes. A
  // push against an older version is left to the close (its base is rebuilt there once for all).
  void JoinNorms(int p, Contribution& c);
  // The robust references of a push of fragment p by learner `id` (RobustRefs::others == 0: too
  // few other learners pushed it recently).
  struct RobustRefs {
    int others = 0;
    double size = 0, steps = 0, tokens_per_step = 0, weight = 0;  // upper medians of the others' latest pushes
    double size_low = 0;  // the lower median of their sizes: one large value among two cannot raise it
  };
  RobustRefs RefsFor(int p, int id, TimePoint now) const;
  // Whether learner l's latest push of fragment p is one the references count.
  bool IsReference(const LearnerRecord& l, int p, TimePoint now) const;
  // The upper medians of the other learners' rates: tokens per step (each one's EMA over all its
  // pushes) and credited steps per second of fragment p; 0 where fewer than
  // quarantine_min_learners have one (p < 0: no step rate).
  struct FleetRefs {
    double tokens_per_step = 0, step_rate = 0;
  };
  // As they stood before `now`, the instant of the push judged (TimePoint::max(): every push so far,
  // as a round's close judges).
  FleetRefs FleetRefsFor(int id, int p, TimePoint now) const;
  // What BoundCounters decided: the push as the references record it (its size ‖v‖/√steps,
  // bounded steps, rate and weight; no version), and the learner's allowance for that fragment once
  // the push is credited (its credited steps per second in the rate).
  struct Credit {
    PushSample sample;
    StepAllowance allowance;
  };
  // Bounds the push's claimed counters (c_tokens through the rate per step, c_steps and with it
  // c_tokens by the time since the learner's previous push of the fragment, the steps its size and
  // merge weight count, into c.max_weight); `note` says what was bounded.
  Credit BoundCounters(const RobustRefs& refs, const FleetRefs& fleet, const LearnerRecord& l, int p, Contribution& c,
                       TimePoint now, std::string& note) const;
  // Push's judgement of contribution c against `refs`: its credit (BoundCounters), its size, whether
  // it becomes a reference (a non-zero push over at least half a period that is not a final sync;
  // docs/decisions/016) or is a zero push, and its influence — now, or with its round's other pushes
  // when the round closes in the synchronous modes. `note` says what was bounded.
  struct Judgement {
    Credit credit;
    double size = 0;
    bool reference = false, zero = false;
  };
  Judgement JudgePush(const LearnerRecord& l, const FragmentState& f, const PushHeaderData& h, const RobustRefs& refs,
                      Contribution& c, TimePoint now, std::string& note) const;
  // An accepted push's size joins fragment f's recent sizes (the window's newest).
  void RecordNorm(FragmentState& f, double size) const;
  // An admitted push spends learner l's allowance for fragment p (its credited rate a sample of the
  // learner's) and counts its credited steps against its own pace (PacedStepsLeft).
  void SpendCredit(LearnerRecord& l, int p, const StepAllowance& allowance, int64_t credited_steps,
                   TimePoint now) const;
  // Influence (influence.cc): the positions of fragment p's values a sketch holds (ranges
  // [begin, end)), a push's values there, the reference its size is judged by, how far its
  // direction agrees with the others' (NAN: fewer than quarantine_min_learners others to say), and
  // its influence u (`note` says what lowered it).
  std::vector<std::pair<size_t, size_t>> SketchRanges(size_t n) const;
  std::vector<float> Sketch(std::span<const std::byte> raw, size_t n) const;
  double SizeReference(const FragmentState& f, const RobustRefs& refs) const;
  double DirectionAgreement(int p, int id, const std::vector<float>& sketch, TimePoint now) const;
  double Influence(const FragmentState& f, double size, const RobustRefs& refs, double agreement, bool final_sync,
                   std::string& note) const;
  // The references of contribution c drawn from the other pushes of its open round (decoupled
  // mode, JudgeAtClose): none (others 0) with fewer than quarantine_min_learners of them;
  // `agreement` the upper median of its cosines with their sketches (NAN: too few).
  RobustRefs RoundRefs(const FragmentState& f, const Contribution& c, double& agreement) const;
  // c_tokens ≤ max_tokens_per_step_factor × `reference` × c_steps and ≤ pace_slack × `own` × c_steps
  // (0: no bound of that kind).
  void BoundTokensPerStep(double reference, double own, Contribution& c, std::string& note) const;

  // The steps of a push its time allows (c_steps and c_tokens lowered together), and the allowance left.
  // `paced_left`: what its own heartbeats still allow (PacedStepsLeft; infinity: no bound of that kind).
  StepAllowance CreditSteps(const FleetRefs& fleet, double own_rate, double paced_left, const StepAllowance& a,
                            Contribution& c, TimePoint now, std::string& note) const;
  // The steps learner l's pushes of fragment p may still be credited with by its own heartbeats:
  // pace_slack × (its latest heartbeat's step counter, plus what its pace allows since) + H, less
  // what its pushes of p were credited with (LearnerRecord::paced_steps). Counted steps, not a
  // rate: an honest learner that speeds up is credited what it did at once (a rate measured over
  // 2 s windows lagged behind a learner whose speed doubled, and cut it), and steps it made before
  // this syncer process saw it (trained while the syncer was down or unreachable) count. Infinity
  // until a first window measured its pace (or with pace_slack 0).
  double PacedStepsLeft(const LearnerRecord& l, int p, TimePoint now) const;
  // Credits learner l with what its heartbeats now count of its held steps (LearnerRecord::held):
  // into tokens_merged (÷ P) and paced_steps, at most PacedStepsLeft per fragment. Nothing while
  // its pace is unmeasured.
  void ReleaseHeldCredit(LearnerRecord& l, TimePoint now) const;
  // The influence of the pushes of fragment p's closing round that wait for it (CloseRounds, before
  // the round closes), each judged against the others' latest pushes as they stand then, this
  // round's included. Synchronous modes (every live learner's push makes the round) judge all of a
  // round's pushes so, and the order they arrived in decides nothing; decoupled mode those that
  // found no references on arrival (a fragment's first pushes, which its scale alone would cut to
  // a few percent). `note` says whose influence was lowered and why.
  bool JudgesRoundsTogether() const { return options_.mode != diloco::Mode::kDecoupled; }
  void JudgeAtClose(int p, TimePoint now, std::string& note);
  // Contributions of fragment f's open round that arrived before any rate per step could judge
  // them: bounded now by the others' rates, if there are enough (CloseRounds, before the round closes).
  void JudgeLateCounters(FragmentState& f) const;
  // Takes back from each learner's tokens_merged what its unjudged credit exceeds, once a rate
  // per step exists to judge it by (the others' or its own pace).
  void SettleUnjudgedCredit();
  // Replay protection (docs/decisions/019): NotFound for a push of another session than the
  // learner's latest join's, AlreadyExists for a sequence number already judged (a replay).
  Status CheckPushSession(const LearnerRecord& l, const PushHeaderData& h) const;
  // A push session no other join of this syncer process was given, nor (through the incarnation)
  // any join of an earlier process.
  uint64_t NewPushSession(int id);
  // INVALID_ARGUMENT (quarantined) when `size` exceeds quarantine_factor × the reference.
  Status CheckQuarantine(const FragmentState& f, double size, const RobustRefs& refs) const;
  // Records learner l's push of fragment p as its latest (version < 0: a zero push, which keeps
  // the latest as the reference and only counts for nothing), keeping the one from before `now`.
  void RecordSample(LearnerRecord& l, int p, PushSample sample, int64_t version, TimePoint now) const;
  PushResult Admit(LearnerRecord& l, FragmentState& f, const PushHeaderData& h, Contribution c, TimePoint now);
  // Join: per fragment, the version of the public copy whose checksum the learner sent (-1: none),
  // and whether it holds the run's initial values instead (then version 0, once snapped).
  struct HeldMatch {
    std::vector<int64_t> held;
    std::vector<bool> initial;
  };
  HeldMatch MatchHeld(const std::vector<uint64_t>& checksums) const;
  // FailedPrecondition for a fragment another shard owns (a learner routing to the wrong shard).
  Status CheckOwned(int fragment, const char* what) const;
  // FailedPrecondition when a joining learner names another shard or shard count.
  Status CheckJoinShard(const ShardSpec& theirs) const;
  // PermissionDenied while the learner is disconnected for repeated bad input.
  Status CheckNotBanned(const LearnerRecord& l, TimePoint now) const;
  // NOT_FOUND for a learner silent longer than learner_timeout_s: it must rejoin before its
  // heartbeats and pushes count again.
  Status CheckInContact(const LearnerRecord& l, TimePoint now) const;
  // Join's checks: the protocol, run, model and shard the learner expects are this syncer's.
  Status CheckJoinIdentity(const JoinRequestData& r) const;
  // The id a join takes (a free one for -1), refused when out of range, banned, the table is
  // full or a live learner holds it.
  StatusOr<int> JoiningId(const JoinRequestData& r, TimePoint now) const;
  // Whether the outer step keeps a momentum buffer (μ > 0 or the running sweep; never in ddp).
  bool KeepsMomentum() const;
  // Rebuild (syncer_core_rebuild.cc): the fragments a joining learner holds newer than this core;
  // an offer's header checks (learner l's); the refusal of a push while rebuilding; the Status
  // JSON's "rebuilt" object.
  std::vector<int> WantedCopies(const JoinRequestData& r, LearnerRecord& l) const;
  Status CheckOffer(const LearnerRecord& l, const PushHeaderData& h, size_t payload_bytes, TimePoint now) const;
  Status RebuildingError(TimePoint now) const;
  nlohmann::json RebuildJson(TimePoint now) const;
  PublicCopyOptions CopyOptions(size_t numel) const;

  SyncerCore(SyncerOptions options, diloco::FragmentPlan plan);
  // The round's tiled pass and its commit (round_close.cc).
  struct RoundPass;
  RoundReport CloseRound(int p, const RoundDecision& decision, TimePoint now, const Clock& clock);
  Status RunRoundPass(int p, RoundPass& pass, RoundReport& report);
  Status PrepareRoundPass(int p, RoundPass& pass, RoundReport& report);
  void ApplyTile(int p, RoundPass& pass, size_t tile, size_t begin, size_t end, std::span<const float> merged);
  Status FinishRoundPass(int p, RoundPass& pass);
  void CommitRoundPass(int p, RoundPass& pass);
  void RestoreRoundPass(int p, RoundPass& pass);
  // Numeric safety refused the round: Θ_p and its state stay as they were; the pending
  // contributions are dropped.
  RoundReport RefuseRound(int p, RoundReport report, const Status& why);
  int64_t PendingBytes() const;
  // An exponential moving average that leaves an unchanged sample's value as it is, bit for bit.
  static double Ema(double old_value, double sample);
  // Poll (force = false) and CloseAllPending (force = true).
  std::vector<RoundReport> CloseRounds(TimePoint now, const Clock& clock, bool force);

  SyncerOptions options_;
  diloco::FragmentPlan plan_;
  std::shared_ptr<const UpdateRule> rule_;  // what the mode does with pushes (update_rule.h)
  std::shared_ptr<ThreadPool> pool_;        // the round's threads (options_.threads)
  // The values a round's pass moves in place (Θ_p, momentum, the sweep's buffers, Φ_p), saved
  // tile by tile before they move, so that a refused round puts them back; and the merger's sums
  // Σ coef·v that its direction pass keeps for the merge (FragmentMerger::KeepSums). Reserved for
  // the largest fragment.
  struct Scratch {
    std::vector<float> theta, momentum, accum, start, phi, sums;
    std::vector<std::vector<std::byte>> delta_parts;  // a round's lattice delta, per tile
    std::vector<std::byte> delta;                     // a delta buffer the history let go
  };
  Scratch scratch_;
  std::vector<FragmentState> fragments_;
  std::map<int, LearnerRecord> learners_;
  RoundEstimates estimates_;
  int64_t rounds_closed_ = 0;
  int64_t rounds_refused_ = 0;
  uint64_t sessions_issued_ = 0;
  std::optional<TimePoint> rebuild_until_;  // set: a rebuilt core (adopting copies until then)
  int rebuild_expected_ = 0;                // learners whose copies end the wait early (0: never)
  // Ends the rebuild's wait once the expected learners have declared and nothing is left to adopt.
  void EndRebuildWhenAllOffered(TimePoint now);
  std::vector<AdoptedCopy> adopted_;  // the copies it adopted, in order
  double global_eval_loss_ = -1;      // < 0: none yet
  int64_t global_eval_rounds_ = 0;
};

}  // namespace atl::syncer
