#include "atoll/syncer/syncer_core.h"

#include "atoll/diloco/fragment_merger.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "atoll/core/text.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/diloco/merge.h"
#include "atoll/syncer/guards.h"

namespace atl::syncer {
namespace {

constexpr double kEmaAlpha = 0.2;

}  // namespace

double SyncerCore::Ema(double old_value, double sample) {
  // An unchanged sample leaves the value as it is, bit for bit (0.8·x + 0.2·x may round off x).
  // A learner's tokens per step is constant, and a syncer shard sees only its fragments' pushes:
  // so every shard holds the same value as one syncer would (docs/decisions/011).
  if (old_value == sample) return sample;
  return old_value <= 0 ? sample : (1 - kEmaAlpha) * old_value + kEmaAlpha * sample;
}

SyncerCore::SyncerCore(SyncerOptions options, diloco::FragmentPlan plan)
    : options_(std::move(options)),
      plan_(std::move(plan)),
      rule_(MakeUpdateRule(options_)),
      pool_(std::make_shared<ThreadPool>(options_.threads > 0 ? options_.threads : ThreadPool::HardwareThreads())) {}

StatusOr<SyncerCore> SyncerCore::Create(SyncerOptions options, diloco::FragmentPlan plan,
                                        std::vector<std::vector<float>> initial) {
  const int P = plan.num_fragments();
  if (P < 1) return InvalidArgumentError("syncer: the plan has no fragments");
  if (options.H < P) {
    return InvalidArgumentError("syncer: H (" + std::to_string(options.H) + ") must be ≥ the number of fragments P (" +
                                std::to_string(P) + ")");
  }
  if (options.round.quorum < 1) return InvalidArgumentError("syncer: quorum K must be ≥ 1");
  if (options.mode == diloco::Mode::kDdp && (!options.ddp_step || P != 1)) {
    return InvalidArgumentError("syncer: ddp mode needs one fragment (plan has " + std::to_string(P) +
                                ") and an optimizer hook" + (options.ddp_step ? "" : " (missing)"));
  }
  const ShardSpec& shard = options.shard;
  if (shard.count < 1 || shard.count > kMaxShards || shard.index < 0 || shard.index >= shard.count) {
    return InvalidArgumentError(
        fmt::format("syncer: bad shard {}/{} (0 <= index < count <= {})", shard.index, shard.count, kMaxShards));
  }
  if (shard.count > P) {
    return InvalidArgumentError(
        fmt::format("syncer: {} shards for {} fragments: every shard must own a fragment "
                    "(at most P shards)",
                    shard.count, P));
  }
  if (shard.count > 1 && options.mode == diloco::Mode::kDdp) {
    return InvalidArgumentError("syncer: ddp mode has one fragment and runs one syncer (no shards)");
  }
  if (static_cast<int>(initial.size()) != P) {
    return InvalidArgumentError("syncer: initial values for " + std::to_string(initial.size()) +
                                " fragments, plan has " + std::to_string(P));
  }
  ATOLL_RETURN_IF_ERROR(diloco::ValidateCodecOptions(options.downlink));
  if (options.history_versions < 0 || !(options.history_bytes_per_value >= 0)) {
    return InvalidArgumentError("syncer: the downlink history must be ≥ 0 versions and ≥ 0 bytes per value");
  }
  SyncerCore core(std::move(options), std::move(plan));
  core.fragments_.resize(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) {
    auto& f = core.fragments_[static_cast<size_t>(p)];
    if (!core.owns(p) && initial[p].empty()) continue;  // another shard's: it need not be given
    if (static_cast<int64_t>(initial[p].size()) != core.plan_.fragments[p].numel) {
      return InvalidArgumentError("syncer: fragment " + std::to_string(p) + " initial size " +
                                  std::to_string(initial[p].size()) + " ≠ plan " +
                                  std::to_string(core.plan_.fragments[p].numel));
    }
    if (!exchange::AllFinite(initial[p])) {
      return InvalidArgumentError("syncer: fragment " + std::to_string(p) + " has non-finite values");
    }
    if (!core.owns(p)) continue;  // another shard's: it holds that fragment
    f.initial_checksum = exchange::ValuesChecksum(initial[p]);
    ATOLL_ASSIGN_OR_RETURN(PublicCopy copy, PublicCopy::Create(initial[p], core.options_.downlink.block_size,
                                                               core.CopyOptions(initial[p].size())));
    f.copy.emplace(std::move(copy));
    f.theta = std::move(initial[p]);
    f.theta.reserve(core.plan_.largest_numel());  // swapped with the round's scratch (round_close.cc)
    f.theta_norm = diloco::L2Norm(f.theta);
    if (core.KeepsMomentum()) f.momentum.assign(f.theta.size(), 0.0f);
  }
  return core;
}

bool SyncerCore::KeepsMomentum() const {
  return options_.mode != diloco::Mode::kDdp &&
         (options_.outer.momentum > 0 || options_.outer_step == OuterStepRule::kRunning);
}

PublicCopyOptions SyncerCore::CopyOptions(size_t numel) const {
  PublicCopyOptions o;
  o.qmax = DownlinkQmax(options_.downlink.encoding);
  o.compression = options_.downlink.compression;
  o.history_versions = options_.history_versions;
  o.history_bytes = options_.history_bytes_per_value <= 0
                        ? 0
                        : std::max(options_.history_min_bytes,
                                   static_cast<size_t>(options_.history_bytes_per_value * static_cast<double>(numel)));
  o.pool = pool_.get();
  o.capacity = plan_.largest_numel();
  return o;
}

std::span<const float> SyncerCore::public_values(int fragment) const {
  const auto& copy = fragments_[static_cast<size_t>(fragment)].copy;
  return copy ? copy->values() : std::span<const float>{};
}

const PublicCopy* SyncerCore::public_copy(int fragment) const {
  const auto& copy = fragments_[static_cast<size_t>(fragment)].copy;
  return copy ? &*copy : nullptr;
}

std::vector<int64_t> SyncerCore::versions() const {
  std::vector<int64_t> v;
  for (const auto& f : fragments_) v.push_back(f.version);
  return v;
}

std::vector<int> SyncerCore::LiveLearners(TimePoint now) const {
  std::vector<int> live;
  const Duration timeout = FromSeconds(options_.learner_timeout_s);
  for (const auto& [id, l] : learners_) {
    if (l.state != LearnerState::kDone && now - l.last_seen <= timeout) live.push_back(id);
  }
  return live;
}

Status SyncerCore::CheckJoinIdentity(const JoinRequestData& r) const {
  if (r.protocol_version < kOldestProtocolVersion || r.protocol_version > kProtocolVersion) {
    return FailedPreconditionError("protocol version " + std::to_string(r.protocol_version) +
                                   " not supported: this syncer speaks versions " +
                                   std::to_string(kOldestProtocolVersion) + " to " + std::to_string(kProtocolVersion));
  }
  if (r.run_id != options_.run_id) {
    return FailedPreconditionError("run id '" + r.run_id + "' does not match this syncer's run '" + options_.run_id +
                                   "'");
  }
  const uint64_t signature = diloco::ModelSignature(plan_.tensors);
  if (r.model_signature != signature) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "model signature %016llx does not match the syncer's %016llx",
                  static_cast<unsigned long long>(r.model_signature), static_cast<unsigned long long>(signature));
    return FailedPreconditionError(std::string(buf) + " (different tensor names, shapes or dtypes)");
  }
  return CheckJoinShard(r.shard);
}

StatusOr<int> SyncerCore::JoiningId(const JoinRequestData& r, TimePoint now) const {
  int id = r.learner_id;
  if (id < -1 || id > options_.max_learner_id) {
    return InvalidArgumentError(
        fmt::format("learner id {} out of range (-1 to assign one, else 0..{})", id, options_.max_learner_id));
  }
  if (id == -1) {
    id = 0;
    while (learners_.count(id)) ++id;
  }
  auto it = learners_.find(id);
  if (it == learners_.end() && static_cast<int64_t>(learners_.size()) >= options_.max_learners) {
    return ResourceExhaustedError(
        fmt::format("the learner table is full ({} rows, the limit max_learners)", learners_.size()));
  }
  if (it != learners_.end()) ATOLL_RETURN_IF_ERROR(CheckNotBanned(it->second, now));
  if (it != learners_.end() && !r.rejoin && it->second.state != LearnerState::kDone &&
      now - it->second.last_seen <= FromSeconds(options_.learner_timeout_s)) {
    return AlreadyExistsError("learner id " + std::to_string(id) + " is held by a live learner (host " +
                              it->second.host + "); choose another id");
  }
  return id;
}

StatusOr<JoinReplyData> SyncerCore::Join(const JoinRequestData& r, TimePoint now) {
  ATOLL_RETURN_IF_ERROR(CheckJoinIdentity(r));
  ATOLL_ASSIGN_OR_RETURN(const int id, JoiningId(r, now));
  const bool first = learners_.count(id) == 0;
  LearnerRecord& l = learners_[id];
  l.id = id;
  l.host = TruncateUtf8(r.host, options_.max_host_bytes);
  l.last_seen = now;
  l.state = LearnerState::kJoining;
  l.joins += 1;
  // What it may be credited with counts from its first join, with one period (H steps) in hand:
  // its first push of a fragment is its first H steps, however fast it ran them while the others'
  // rate was still measured over their start-up. A rejoin keeps its allowances (a learner back
  // from an outage trained all along).
  const auto H = static_cast<double>(options_.H);
  if (first) l.allowances.assign(fragments_.size(), StepAllowance{now, H, 0.0, H, 0.0});
  l.push_session = NewPushSession(id);
  l.push_seq = 0;
  // A (re)joining learner starts from the current global model; its old pending contributions
  // were computed from a state it no longer has, so they stay valid only as what they are —
  // already-submitted outer gradients — and are kept.
  JoinReplyData reply;
  reply.learner_id = id;
  reply.versions = versions();
  for (const auto& fr : plan_.fragments) reply.fragment_numel.push_back(fr.numel);
  reply.H = options_.H;
  reply.tau = options_.round.tau;
  reply.mode = options_.mode;
  reply.uplink = options_.uplink;
  reply.downlink = options_.downlink;
  reply.incarnation = options_.incarnation;
  HeldMatch match = MatchHeld(r.fragment_checksums);
  reply.fragment_held = std::move(match.held);
  reply.fragment_initial = std::move(match.initial);
  reply.merged_versions = l.merged_versions;
  reply.merged_versions.resize(fragments_.size(), -1);
  reply.shard = options_.shard;
  reply.push_session = l.push_session;
  if (rebuilding(now)) {
    reply.rebuild_wanted = WantedCopies(r, l);
    EndRebuildWhenAllOffered(now);
  }
  return reply;
}

Status SyncerCore::CheckJoinShard(const ShardSpec& theirs) const {
  const ShardSpec& mine = options_.shard;
  if (theirs.count == mine.count && theirs.index == mine.index) return Status::Ok();
  if (theirs.count != mine.count) {
    return FailedPreconditionError(fmt::format(
        "shard count mismatch: this syncer is shard {} of {} syncer shard(s), the learner was given {} syncer "
        "address(es) (give --syncer every shard's address, in shard order)",
        mine.ToString(), mine.count, theirs.count));
  }
  return FailedPreconditionError(fmt::format(
      "shard order mismatch: the learner took this syncer for shard {}, it is shard {} (list --syncer in shard "
      "order: shard 0 first)",
      theirs.ToString(), mine.ToString()));
}

Status SyncerCore::CheckOwned(int fragment, const char* what) const {
  if (owns(fragment)) return Status::Ok();
  return FailedPreconditionError(fmt::format("{}: fragment {} belongs to syncer shard {} of {}; this is shard {}", what,
                                             fragment, OwnerShard(fragment, options_.shard.count), options_.shard.count,
                                             options_.shard.ToString()));
}

SyncerCore::HeldMatch SyncerCore::MatchHeld(const std::vector<uint64_t>& checksums) const {
  HeldMatch out{std::vector<int64_t>(fragments_.size(), -1), std::vector<bool>(fragments_.size(), false)};
  if (checksums.size() != fragments_.size() || !rule_->SkipsMatchingJoinFetch()) return out;
  for (size_t p = 0; p < fragments_.size(); ++p) {
    const FragmentState& f = fragments_[p];
    if (!f.copy) continue;  // another shard's: it matches that fragment
    if (checksums[p] == f.initial_checksum && f.copy->oldest() == 0) {
      // Θ⁰ as the run started: snapped to the lattice it is Φ at version 0, still in reach.
      out.held[p] = 0;
      out.initial[p] = true;
    } else if (auto v = f.copy->VersionOf(checksums[p])) {
      out.held[p] = *v;
    }
  }
  return out;
}

Status SyncerCore::Heartbeat(int learner_id, const LearnerProgress& reported, TimePoint now,
                             std::optional<TimePoint> arrived) {
  auto it = learners_.find(learner_id);
  if (it == learners_.end()) {
    return NotFoundError("learner " + std::to_string(learner_id) + " has not joined (join first)");
  }
  LearnerRecord& l = it->second;
  ATOLL_RETURN_IF_ERROR(CheckNotBanned(l, now));
  ATOLL_RETURN_IF_ERROR(CheckInContact(l, arrived.value_or(now)));
  // Out-of-range telemetry is ignored (the previous value kept) and counted: it must not steer
  // the grace window (guards.h).
  LearnerProgress progress = reported;
  l.telemetry_rejected += BoundTelemetry(
      progress, {l.step, l.tokens, l.loss, l.step_seconds, l.tokens_per_second, l.version_held, l.state});
  UpdatePace(l, progress, now);
  ReleaseHeldCredit(l, now);
  l.last_seen = now;
  l.step = progress.step;
  l.tokens = progress.tokens;
  l.loss = progress.loss;
  l.step_seconds = progress.step_seconds;
  l.tokens_per_second = progress.tokens_per_second;
  l.version_held = progress.version_held;
  l.state = progress.state;
  if (progress.step_seconds > 0 && std::isfinite(progress.step_seconds)) {
    estimates_.step_seconds = Ema(estimates_.step_seconds, progress.step_seconds);
  }
  return Status::Ok();
}

Status SyncerCore::Reject(LearnerRecord& l, const PushHeaderData& h, Status s, TimePoint now) {
  l.pushes_rejected += 1;
  if (s.code() != StatusCode::kAborted) l.consecutive_rejects += 1;
  std::string ctx = fmt::format("push from learner {}, fragment {}", h.learner_id, h.fragment);
  if (s.code() != StatusCode::kAborted && options_.max_consecutive_rejects > 0 &&
      l.consecutive_rejects >= options_.max_consecutive_rejects) {
    l.banned_until = now + FromSeconds(options_.ban_seconds);
    ctx += fmt::format(" ({} bad pushes in a row: this learner is now disconnected)", l.consecutive_rejects);
  }
  return s.WithContext(ctx);
}

Status SyncerCore::RecordRejectedPush(const PushHeaderData& h, const Status& why, TimePoint now) {
  auto it = learners_.find(h.learner_id);
  if (it == learners_.end())
    return NotFoundError(fmt::format("push from learner {} which has not joined", h.learner_id));
  LearnerRecord& l = it->second;
  // A replay is counted, never toward the disconnect: whoever replays a captured push must not get
  // its learner disconnected.
  if (why.code() == StatusCode::kAlreadyExists) {
    l.replays_refused += 1;
    return why;
  }
  // A push the syncer judged spends its sequence number, refused or not.
  if (CheckPushSession(l, h).ok()) l.push_seq = h.push_seq;
  return Reject(l, h, why, now);
}

Status SyncerCore::CheckPushingLearner(const LearnerRecord& l, const PushHeaderData& h, TimePoint now,
                                       std::optional<TimePoint> arrived) const {
  ATOLL_RETURN_IF_ERROR(CheckNotBanned(l, now));
  ATOLL_RETURN_IF_ERROR(CheckInContact(l, arrived.value_or(now)));
  if (h.fragment >= 0 && h.fragment < plan_.num_fragments()) ATOLL_RETURN_IF_ERROR(CheckOwned(h.fragment, "push"));
  return CheckPushSession(l, h);
}

Status CheckPushShape(const PushHeaderData& h, const diloco::CodecOptions& uplink, int num_fragments,
                      const std::function<size_t(int)>& numel_of) {
  if (h.fragment < 0 || h.fragment >= num_fragments) {
    return InvalidArgumentError(fmt::format("fragment index out of range [0, {})", num_fragments));
  }
  const size_t numel = numel_of(h.fragment);
  if (h.encoding != uplink.encoding || h.block_size != uplink.block_size || h.compression != uplink.compression ||
      h.num_values != static_cast<int64_t>(numel)) {
    return InvalidArgumentError(fmt::format(
        "encoding {}/{}/{} with {} values, but the run uses {}/{}/{} and the fragment has {}",
        diloco::EncodingName(h.encoding), h.block_size, diloco::CompressionName(h.compression), h.num_values,
        diloco::EncodingName(uplink.encoding), uplink.block_size, diloco::CompressionName(uplink.compression), numel));
  }
  return Status::Ok();
}

Status SyncerCore::CheckPushHeader(const PushHeaderData& h, size_t payload_bytes) const {
  ATOLL_RETURN_IF_ERROR(CheckPushShape(h, options_.uplink, plan_.num_fragments(),
                                       [this](int p) { return fragments_[static_cast<size_t>(p)].theta.size(); }));
  const FragmentState& f = fragments_[static_cast<size_t>(h.fragment)];
  const size_t expected = diloco::MaxPayloadSize(options_.uplink, f.theta.size());
  if (diloco::ExactPayloadSize(options_.uplink) ? payload_bytes != expected
                                                : payload_bytes == 0 || payload_bytes > expected) {
    return InvalidArgumentError(fmt::format("the push announces {} payload bytes, a push of fragment {} is {}{} bytes",
                                            payload_bytes, h.fragment,
                                            diloco::ExactPayloadSize(options_.uplink) ? "" : "1 to ", expected));
  }
  if (h.c_tokens < 0 || h.c_steps < 0 || (h.c_steps == 0 && h.c_tokens > 0)) {
    return InvalidArgumentError(fmt::format("bad counters c_tokens={} c_steps={}", h.c_tokens, h.c_steps));
  }
  if (h.base_version < 0 || h.base_version > f.version) {
    return InvalidArgumentError(
        fmt::format("base version {} is not a version this syncer produced (current {})", h.base_version, f.version));
  }
  return rule_->CheckBase(h.base_version, f.version);
}

Status SyncerCore::CheckPush(const PushHeaderData& h, size_t payload_bytes, TimePoint now,
                             std::optional<TimePoint> arrived) const {
  auto it = learners_.find(h.learner_id);
  if (it == learners_.end()) {
    return NotFoundError(fmt::format("push from learner {} which has not joined (join first)", h.learner_id));
  }
  if (h.public_copy) return CheckOffer(it->second, h, payload_bytes, now);
  if (rebuilding(now)) return RebuildingError(now);
  ATOLL_RETURN_IF_ERROR(CheckPushingLearner(it->second, h, now, arrived));
  return CheckPushHeader(h, payload_bytes);
}

PreparedPush PreparePush(const diloco::CodecOptions& uplink, std::span<const std::byte> payload, size_t numel,
                         ThreadPool* pool) {
  PreparedPush p;
  p.payload_bytes = payload.size();
  p.status = diloco::InflatePayload(uplink, payload, numel, p.raw, &p.sum_squares, pool);
  if (!p.status.ok()) p.raw = {};
  return p;
}

StatusOr<SyncerCore::Contribution> SyncerCore::MakeContribution(const PushHeaderData& h, PreparedPush prepared,
                                                                TimePoint now) const {
  const FragmentState& f = fragments_[static_cast<size_t>(h.fragment)];
  ATOLL_RETURN_IF_ERROR(prepared.status);
  if (prepared.raw.size() != diloco::EncodedSize(options_.uplink, f.theta.size())) {
    return DataLossError(fmt::format("payload prepared for another size: {} bytes, the fragment's is {}",
                                     prepared.raw.size(), diloco::EncodedSize(options_.uplink, f.theta.size())));
  }
  if (rule_->NeedsBase() && h.base_version < f.copy->oldest()) {
    return AbortedError(
        fmt::format("the syncer no longer holds version {} of this fragment (it holds {}..{}): "
                    "pull the fragment in full",
                    h.base_version, f.copy->oldest(), f.version));
  }
  Contribution c;
  c.learner = h.learner_id;
  c.c_tokens = h.c_tokens;
  c.c_steps = h.c_steps;
  c.final_sync = h.final_sync;
  c.base_version = h.base_version;
  c.arrived = now;
  c.delta_norm = std::sqrt(prepared.sum_squares);
  // The learner's own progress Δ̂ against the fragment's size (the exact outer gradient's norm is
  // checked again when the round closes: decisions/018).
  ATOLL_RETURN_IF_ERROR(CheckOuterGradientBound(c.delta_norm, f.theta_norm, options_.max_gradient_ratio));
  c.raw = std::move(prepared.raw);
  return c;
}

void SyncerCore::JoinNorms(int p, Contribution& c) {
  const FragmentState& f = fragments_[static_cast<size_t>(p)];
  if (!rule_->ReadsNorms()) return;
  const bool based = rule_->NeedsBase();
  if (based && c.base_version != f.version) return;
  const diloco::EncodedGradients source(options_.uplink, f.theta.size(), rule_->Reference(f.theta, f.sweep).data(),
                                        {{.raw = c.raw, .base = based ? f.copy->values().data() : nullptr}});
  auto norms = diloco::FragmentMerger::NormsOf(plan_.fragments[static_cast<size_t>(p)], source, 0, pool_.get());
  if (!norms.ok()) return;  // the close forms them
  c.slice_norms = std::move(norms->slice_norms);
  c.norm = norms->norm;
}

int64_t SyncerCore::PendingBytes() const {
  int64_t n = 0;
  for (const FragmentState& f : fragments_) {
    for (const Contribution& c : f.pending) n += static_cast<int64_t>(c.raw.size());
  }
  return n;
}

StatusOr<PushResult> SyncerCore::Push(const PushHeaderData& h, std::span<const std::byte> payload, TimePoint now,
                                      std::optional<TimePoint> arrived) {
  const bool known = h.fragment >= 0 && h.fragment < plan_.num_fragments() && owns(h.fragment) &&
                     h.encoding == options_.uplink.encoding && h.block_size == options_.uplink.block_size &&
                     h.compression == options_.uplink.compression;
  PreparedPush prepared;
  prepared.payload_bytes = payload.size();
  if (known) {
    prepared =
        PreparePush(options_.uplink, payload, fragments_[static_cast<size_t>(h.fragment)].theta.size(), pool_.get());
  }
  return Push(h, std::move(prepared), now, arrived);
}

StatusOr<PushResult> SyncerCore::Push(const PushHeaderData& h, PreparedPush prepared, TimePoint now,
                                      std::optional<TimePoint> arrived) {
  auto lit = learners_.find(h.learner_id);
  if (lit == learners_.end()) {
    return NotFoundError(fmt::format("push from learner {} which has not joined (join first)", h.learner_id));
  }
  LearnerRecord& l = lit->second;
  l.bytes_up += std::max<int64_t>(0, h.wire_bytes);
  if (h.public_copy) return InvalidArgumentError("a public copy is offered with its values (AdoptCopy), not as a push");
  if (rebuilding(now)) return RebuildingError(now);
  if (Status st = CheckPushingLearner(l, h, now, arrived); !st.ok()) {
    if (st.code() == StatusCode::kAlreadyExists) l.replays_refused += 1;
    return st;
  }
  l.push_seq = h.push_seq;  // judged from here on, whatever the outcome: a replay of it is refused
  if (Status st = CheckPushHeader(h, prepared.payload_bytes); !st.ok()) return Reject(l, h, st, now);
  FragmentState& f = fragments_[static_cast<size_t>(h.fragment)];
  auto c = MakeContribution(h, std::move(prepared), now);
  if (!c.ok()) return Reject(l, h, c.status(), now);
  if (options_.max_pending_bytes > 0 &&
      PendingBytes() + static_cast<int64_t>(c->raw.size()) > options_.max_pending_bytes) {
    return ResourceExhaustedError(fmt::format("the open rounds hold {} bytes of pushes (limit {}): push again later",
                                              PendingBytes(), options_.max_pending_bytes));
  }
  const RobustRefs refs = RefsFor(h.fragment, h.learner_id, now);
  std::string bounded;
  Judgement judged = JudgePush(l, f, h, refs, *c, now, bounded);
  if (judged.reference || judged.zero) {
    RecordSample(l, h.fragment, std::move(judged.credit.sample), judged.reference ? f.version : -1, now);
  }
  if (Status st = CheckQuarantine(f, judged.size, refs); !st.ok()) {
    l.quarantined += 1;
    l.consecutive_rejects -= 1;  // Reject counts it; quarantine alone never disconnects
    return Reject(l, h, st, now);
  }
  // Validated: now change state.
  JoinNorms(h.fragment, *c);
  if (judged.reference) RecordNorm(f, judged.size);
  SpendCredit(l, h.fragment, judged.credit.allowance, c->c_steps, now);
  PushResult r = Admit(l, f, h, std::move(*c), now);
  r.note += bounded;
  return r;
}

SyncerCore::Judgement SyncerCore::JudgePush(const LearnerRecord& l, const FragmentState& f, const PushHeaderData& h,
                                            const RobustRefs& refs, Contribution& c, TimePoint now,
                                            std::string& note) const {
  Judgement j;
  j.credit = BoundCounters(refs, FleetRefsFor(h.learner_id, h.fragment, now), l, h.fragment, c, now, note);
  PushSample& sample = j.credit.sample;
  j.size = sample.size;
  sample.sketch = Sketch(c.raw, f.theta.size());
  // Its influence is judged by its size per step of its share: claimed steps beyond what its
  // time allows do not make a large push look small.
  c.share_size = c.delta_norm / std::sqrt(std::max(1.0, c.share_steps));
  c.sketch = sample.sketch;  // kept until its round closes: a reference for the round's other pushes
  if (JudgesRoundsTogether()) {
    c.judge_at_close = true;  // judged with the round's other pushes when it closes
  } else {
    const double agreement = DirectionAgreement(h.fragment, h.learner_id, sample.sketch, now);
    c.influence = Influence(f, c.share_size, refs, agreement, h.final_sync, note);
    // With no references yet it is judged again when its round closes (JudgeAtClose).
    c.judge_at_close = refs.others == 0;
    if (!c.judge_at_close) c.max_weight *= c.influence * c.influence;
  }
  sample.influence = c.influence;
  // A zero push would lower everyone's reference (it is recorded as counting for nothing); a few
  // steps at the end of a schedule are many times smaller than a period mid-run.
  j.zero = j.size <= 1e-12;
  j.reference = !j.zero && !h.final_sync && 2 * c.c_steps >= options_.H;
  return j;
}

void SyncerCore::RecordNorm(FragmentState& f, double size) const {
  f.recent_norms.push_back(size);
  if (static_cast<int>(f.recent_norms.size()) > options_.quarantine_window)
    f.recent_norms.erase(f.recent_norms.begin());
}

void SyncerCore::SpendCredit(LearnerRecord& l, int p, const StepAllowance& allowance, int64_t credited_steps,
                             TimePoint now) const {
  l.allowances.resize(fragments_.size(), StepAllowance{now, 0.0});
  const double rate_before = l.StepRateBefore(static_cast<size_t>(p), now);
  l.allowances[static_cast<size_t>(p)] = allowance;
  l.allowances[static_cast<size_t>(p)].rate_before = rate_before;
  l.paced_steps.resize(fragments_.size(), 0.0);
  l.paced_steps[static_cast<size_t>(p)] += static_cast<double>(credited_steps);
}

PushResult SyncerCore::Admit(LearnerRecord& l, FragmentState& f, const PushHeaderData& h, Contribution c,
                             TimePoint now) {
  l.consecutive_rejects = 0;
  if (c.c_steps > 0) {
    l.tokens_per_step_before = l.TokensPerStepBefore(now);
    l.tokens_per_step_at = now;
    l.tokens_per_step = Ema(l.tokens_per_step, static_cast<double>(c.c_tokens) / static_cast<double>(c.c_steps));
  }
  l.last_seen = now;
  l.pushes += 1;
  if (l.state == LearnerState::kJoining) l.state = LearnerState::kTraining;
  PushResult result;
  result.round = f.version;  // the open round: it makes merged_version
  result.merged_version = f.version + 1;
  result.incarnation = options_.incarnation;
  if (h.base_version < f.version) {
    l.late_folded += 1;
    result.note = fmt::format("computed against version {}, folded into round {} (current version {})", h.base_version,
                              f.version, f.version);
  } else {
    result.note = fmt::format("joined round {}", f.version);
  }
  auto existing = std::find_if(f.pending.begin(), f.pending.end(),
                               [&](const Contribution& x) { return x.learner == h.learner_id; });
  if (existing != f.pending.end()) {
    *existing = std::move(c);  // a newer contribution of the same learner replaces the older one
    result.note += "; replaced this learner's earlier contribution";
  } else {
    // Kept in learner order, not arrival order: pushes that arrive together (the same simulated
    // instant in `atoll simulate`) otherwise made the merge's float sums, the round's reason and
    // its log depend on which thread ran first.
    const int id = c.learner;
    f.pending.insert(std::upper_bound(f.pending.begin(), f.pending.end(), id,
                                      [](int learner, const Contribution& x) { return learner < x.learner; }),
                     std::move(c));
  }
  if (!f.opened_at) f.opened_at = now;
  if (!f.quorum_at && static_cast<int>(f.pending.size()) >= options_.round.quorum) f.quorum_at = now;
  return result;
}

RoundView SyncerCore::ViewOf(const FragmentState& f, const std::vector<int>& live) {
  RoundView view;
  view.opened_at = f.opened_at;
  view.quorum_at = f.quorum_at;
  view.live = live;
  for (const auto& c : f.pending) view.contributors.push_back(c.learner);
  return view;
}

std::vector<RoundReport> SyncerCore::Poll(TimePoint now, const Clock& clock) {
  return CloseRounds(now, clock, /*force=*/false);
}

std::vector<RoundReport> SyncerCore::CloseAllPending(TimePoint now, const Clock& clock) {
  return CloseRounds(now, clock, /*force=*/true);
}

std::vector<RoundReport> SyncerCore::CloseRounds(TimePoint now, const Clock& clock, bool force) {
  std::vector<RoundReport> closed;
  if (!force && rebuilding(now)) return closed;  // no round closes while copies are still adopted
  const std::vector<int> live = LiveLearners(now);
  SettleUnjudgedCredit();
  const double P = plan_.num_fragments();
  for (int p = 0; p < plan_.num_fragments(); ++p) {
    FragmentState& f = fragments_[static_cast<size_t>(p)];
    if (f.pending.empty()) continue;
    JudgeLateCounters(f);
    RoundDecision d = DecideRound(now, ViewOf(f, live), estimates_, options_.round);
    if (force && d.action != RoundAction::kClose) {
      d.action = RoundAction::kClose;
      d.reason = "final: the run is finishing (" + d.reason + ")";
    }
    if (d.action != RoundAction::kClose) continue;
    JudgeAtClose(p, now, d.reason);
    struct Unjudged {
      int learner;
      double tokens, steps;
    };
    std::vector<Unjudged> unjudged;  // credited when the round commits, its rate judged later
    for (const Contribution& c : f.pending) {
      if (!c.judged) unjudged.push_back({c.learner, static_cast<double>(c.c_tokens), static_cast<double>(c.c_steps)});
    }
    closed.push_back(CloseRound(p, d, now, clock));
    if (closed.back().refused) continue;
    for (const Unjudged& c : unjudged) {
      LearnerRecord& l = learners_[c.learner];
      l.unjudged_tokens += c.tokens / P;
      l.unjudged_steps += c.steps / P;
    }
  }
  return closed;
}

std::optional<TimePoint> SyncerCore::NextWake(TimePoint now) const {
  std::optional<TimePoint> wake;
  const std::vector<int> live = LiveLearners(now);
  for (const auto& f : fragments_) {
    if (f.pending.empty() || !f.quorum_at) continue;
    RoundDecision d = DecideRound(now, ViewOf(f, live), estimates_, options_.round);
    TimePoint t = d.action == RoundAction::kClose ? now : d.wake_at.value_or(now);
    if (!wake || t < *wake) wake = t;
  }
  return wake;
}

Status SyncerCore::CheckInContact(const LearnerRecord& l, TimePoint now) const {
  // A learner silent past the timeout stopped counting as live; rounds closed without it, and
  // what it sends now was computed against a state the others have moved far from. It rejoins
  // first (NOT_FOUND, as for a learner never seen): the join refreshes its public copies, and
  // its next pushes carry its progress on top of them (docs/failure-semantics.md).
  const Duration silent = now - l.last_seen;
  if (l.state == LearnerState::kDone || silent <= FromSeconds(options_.learner_timeout_s)) return Status::Ok();
  return NotFoundError(
      fmt::format("learner {} was silent for {:.1f} s, longer than the learner timeout ({} s): "
                  "the syncer stopped counting it as live; rejoin first",
                  l.id, ToSeconds(silent), options_.learner_timeout_s));
}

Status SyncerCore::CheckNotBanned(const LearnerRecord& l, TimePoint now) const {
  if (l.banned_until > TimePoint{} && now < l.banned_until) {
    return PermissionDeniedError("learner " + std::to_string(l.id) + " is disconnected for " +
                                 std::to_string(static_cast<int>(ToSeconds(l.banned_until - now))) +
                                 " more seconds after " + std::to_string(l.consecutive_rejects) +
                                 " invalid pushes in a row");
  }
  return Status::Ok();
}

StatusOr<PullPayload> SyncerCore::Pull(int learner_id, int fragment, int64_t have_version, int64_t want_version) {
  ATOLL_ASSIGN_OR_RETURN(SharedPull shared, PullShared(learner_id, fragment, have_version, want_version));
  return *shared;
}

StatusOr<SharedPull> SyncerCore::PullShared(int learner_id, int fragment, int64_t have_version, int64_t want_version) {
  if (fragment < 0 || fragment >= plan_.num_fragments()) {
    return InvalidArgumentError("pull: fragment " + std::to_string(fragment) + " out of range [0, " +
                                std::to_string(plan_.num_fragments()) + ")");
  }
  if (!learners_.count(learner_id)) {
    return NotFoundError("pull from learner " + std::to_string(learner_id) + " which has not joined (join first)");
  }
  ATOLL_RETURN_IF_ERROR(CheckOwned(fragment, "pull"));
  // (Pulls of a disconnected learner are refused by Heartbeat/Push/Join; a pull changes no
  // state at all, so it is served.)
  FragmentState& f = fragments_[static_cast<size_t>(fragment)];
  if (have_version > f.version) {
    return FailedPreconditionError("pull: learner holds version " + std::to_string(have_version) + " of fragment " +
                                   std::to_string(fragment) + " but the syncer is at " + std::to_string(f.version) +
                                   " (syncer restarted from older state?)");
  }
  const bool reachable = have_version >= f.copy->oldest();
  if (have_version == f.version || (reachable && want_version > f.version)) {
    auto out = std::make_shared<PullPayload>();
    out->not_modified = true;
    out->incarnation = options_.incarnation;
    out->fragment = fragment;
    out->version = f.version;
    return SharedPull(std::move(out));
  }
  auto served = f.copy->Serve(have_version, fragment, options_.incarnation);
  if (!served.ok()) {
    return InternalError("pull: cannot encode fragment " + std::to_string(fragment) + ": " + served.status().message());
  }
  return std::move(*served);
}

void SyncerCore::CountBytes(int learner_id, int64_t up, int64_t down) {
  auto it = learners_.find(learner_id);
  if (it == learners_.end()) return;
  it->second.bytes_up += up;
  it->second.bytes_down += down;
}

Status SyncerCore::Leave(int learner_id, TimePoint now) {
  auto it = learners_.find(learner_id);
  if (it == learners_.end())
    return NotFoundError("leave from learner " + std::to_string(learner_id) + " which has not joined");
  it->second.state = LearnerState::kDone;
  it->second.last_seen = now;
  return Status::Ok();
}

}  // namespace atl::syncer
