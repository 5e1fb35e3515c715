#include "atoll/syncer/syncer_core.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "atoll/core/rng.h"
#include "atoll/exchange/fragment_exchange.h"
#include "testing/plans.h"

namespace atl::syncer {
namespace {

using diloco::Encoding;

struct Fixture {
  diloco::FragmentPlan plan;
  std::vector<std::vector<float>> initial;
};

// Two tensors of 4 values, P = 2 strided: fragment 0 = tensor "layers.0.w", 1 = "layers.1.w".
Fixture Small() {
  Fixture f{testing::SmallStridedPlan(), {}};
  for (const auto& fr : f.plan.fragments) f.initial.emplace_back(static_cast<size_t>(fr.numel), 1.0f);
  return f;
}

SyncerOptions Fp32Options() {
  SyncerOptions o;
  o.run_id = "r";
  o.H = 2;
  o.round.quorum = 1;
  o.round.grace = false;
  o.merge_rule = diloco::MergeRule::kMean;
  o.outer = {1.0, 0.0, true};            // Θ ← Θ − Δ: the new Θ is the (weighted) mean of the learners
  o.outer_step = OuterStepRule::kRound;  // round-level merge math; the sweep has its own tests
  o.uplink = {Encoding::kFp32, 128};
  o.downlink = {Encoding::kFp32, 128};
  o.history_bytes_per_value = 0;  // fragments of 4 values: their deltas are mostly block headers
  return o;
}

JoinRequestData Req(const diloco::FragmentPlan& plan, int id) {
  JoinRequestData r;
  r.protocol_version = kProtocolVersion;
  r.run_id = "r";
  r.model_signature = diloco::ModelSignature(plan.tensors);
  r.learner_id = id;
  r.host = "test";
  return r;
}

// Joins learner `id` and pulls every fragment in full, as a real learner does on join, so the
// syncer holds the copy the learner's outer gradients are computed against.
void JoinAndPull(SyncerCore& core, const diloco::FragmentPlan& plan, int id, TimePoint now) {
  ASSERT_TRUE(core.Join(Req(plan, id), now).ok());
  for (int p = 0; p < plan.num_fragments(); ++p) {
    auto full = core.Pull(id, p, -1);
    ASSERT_TRUE(full.ok()) << full.status();
    ASSERT_FALSE(full->is_delta);
  }
}

std::vector<std::byte> Fp32Payload(std::span<const float> delta) {
  std::vector<std::byte> out(delta.size() * 4);
  std::memcpy(out.data(), delta.data(), out.size());
  return out;
}

PushHeaderData Header(int id, int p, int64_t base, int64_t tok, int64_t steps) {
  PushHeaderData h;
  h.learner_id = id;
  h.fragment = p;
  h.base_version = base;
  h.c_tokens = tok;
  h.c_steps = steps;
  h.encoding = Encoding::kFp32;
  h.block_size = 128;
  h.num_values = 4;
  return h;
}

TEST(SyncerCore, JoinRefusalsSayWhyAndChangeNothing) {
  auto f = Small();
  auto core = SyncerCore::Create(Fp32Options(), f.plan, f.initial);
  ASSERT_TRUE(core.ok()) << core.status();
  TimePoint now{};
  auto r = Req(f.plan, 0);
  r.protocol_version = 99;
  auto bad = core->Join(r, now);
  EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(bad.status().message().find("protocol version 99"), std::string::npos);
  r = Req(f.plan, 0);
  r.run_id = "other";
  EXPECT_EQ(core->Join(r, now).status().code(), StatusCode::kFailedPrecondition);
  r = Req(f.plan, 0);
  r.model_signature ^= 1;
  auto sig = core->Join(r, now);
  EXPECT_EQ(sig.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(sig.status().message().find("model signature"), std::string::npos);
  EXPECT_TRUE(core->learners().empty());
  // Id collision with a live learner is refused; a rejoin of the same id is allowed.
  ASSERT_TRUE(core->Join(Req(f.plan, 3), now).ok());
  EXPECT_EQ(core->Join(Req(f.plan, 3), now).status().code(), StatusCode::kAlreadyExists);
  auto rj = Req(f.plan, 3);
  rj.rejoin = true;
  EXPECT_TRUE(core->Join(rj, now).ok());
  // Auto id picks the lowest free one.
  auto a = core->Join(Req(f.plan, -1), now);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->learner_id, 0);
}

TEST(SyncerCore, BadPushesAreRejectedWithoutStateChange) {
  auto f = Small();
  auto core = SyncerCore::Create(Fp32Options(), f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  TimePoint now{};
  JoinAndPull(*core, f.plan, 0, now);
  std::vector<float> d(4, 0.5f);
  auto payload = Fp32Payload(d);
  EXPECT_EQ(core->Push(Header(7, 0, 0, 10, 1), payload, now).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(core->Push(Header(0, 5, 0, 10, 1), payload, now).status().code(), StatusCode::kInvalidArgument);
  auto wrong_enc = Header(0, 0, 0, 10, 1);
  wrong_enc.encoding = Encoding::kInt4;
  EXPECT_EQ(core->Push(wrong_enc, payload, now).status().code(), StatusCode::kInvalidArgument);
  auto wrong_n = Header(0, 0, 0, 10, 1);
  wrong_n.num_values = 5;
  EXPECT_EQ(core->Push(wrong_n, payload, now).status().code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> short_payload(payload.begin(), payload.end() - 4);
  EXPECT_EQ(core->Push(Header(0, 0, 0, 10, 1), short_payload, now).status().code(), StatusCode::kInvalidArgument);
  std::vector<float> nan = {0.f, std::nanf(""), 0.f, 0.f};
  auto bad = core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(nan), now);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(core->Push(Header(0, 0, 3, 10, 1), payload, now).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core->Push(Header(0, 0, 0, -1, 1), payload, now).status().code(), StatusCode::kInvalidArgument);
  ManualClock clock;
  EXPECT_TRUE(core->Poll(now, clock).empty());  // nothing was accepted
  EXPECT_EQ(core->version(0), 0);
  EXPECT_EQ(core->learners().at(0).pushes_rejected, 7);  // all but the unknown learner's
  EXPECT_EQ(core->learners().at(0).pushes, 0);
}

TEST(SyncerCore, TokenWeightsOfUnequalLearners) {
  auto f = Small();
  auto core = SyncerCore::Create(Fp32Options(), f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  auto opts = Fp32Options();
  JoinAndPull(*core, f.plan, 0, clock.Now());
  JoinAndPull(*core, f.plan, 1, clock.Now());
  // Learner 0 moved θ to 1 − 0.3 = 0.7 (Δ = Φ − θ = 0.3) with 100 tokens in 1 step: w = 10⁴.
  // Learner 1 moved to 1 − 0.1 = 0.9 with 100 tokens in 4 steps:                  w = 2500.
  std::vector<float> d0(4, 0.3f), d1(4, 0.1f);
  ASSERT_TRUE(core->Push(Header(0, 0, 0, 100, 1), Fp32Payload(d0), clock.Now()).ok());
  ASSERT_TRUE(core->Push(Header(1, 0, 0, 100, 4), Fp32Payload(d1), clock.Now()).ok());
  auto reports = core->Poll(clock.Now(), clock);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].version, 1);
  EXPECT_EQ(reports[0].contributors, (std::vector<int>{0, 1}));
  EXPECT_DOUBLE_EQ(reports[0].weights[0], 10000.0);
  EXPECT_DOUBLE_EQ(reports[0].weights[1], 2500.0);
  // Θ_new = Θ − (0.8·0.3 + 0.2·0.1) = 1 − 0.26 = 0.74
  for (float v : core->theta(0)) EXPECT_NEAR(v, 0.74f, 1e-6);
  for (float v : core->theta(1)) EXPECT_EQ(v, 1.0f);                  // untouched fragment
  EXPECT_DOUBLE_EQ(core->learners().at(0).tokens_merged, 100.0 / 2);  // P = 2
  (void)opts;
}

TEST(SyncerCore, LateUpdateIsFoldedIntoTheNextRound) {
  auto f = Small();
  auto core = SyncerCore::Create(Fp32Options(), f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  JoinAndPull(*core, f.plan, 1, clock.Now());
  std::vector<float> d0(4, 0.2f);
  ASSERT_TRUE(core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(d0), clock.Now()).ok());
  // K = 1, grace off: round 0 closes with learner 0 alone.
  ASSERT_EQ(core->Poll(clock.Now(), clock).size(), 1u);
  for (float v : core->theta(0)) EXPECT_NEAR(v, 0.8f, 1e-6);
  // Learner 1's update, computed against version 0, arrives after round 0 closed.
  std::vector<float> d1(4, 0.4f);  // θ_1 = 0.6
  auto late = core->Push(Header(1, 0, 0, 10, 1), Fp32Payload(d1), clock.Now());
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->round, 1);
  EXPECT_NE(late->note.find("folded into round 1"), std::string::npos) << late->note;
  auto reports = core->Poll(clock.Now(), clock);
  ASSERT_EQ(reports.size(), 1u);
  // Outer gradient against the current Θ: v = 0.8 − 0.6 = 0.2 → Θ = 0.6.
  for (float v : core->theta(0)) EXPECT_NEAR(v, 0.6f, 1e-6);
  EXPECT_EQ(core->learners().at(1).late_folded, 1);
}

// The sweep outer step (docs/decisions/007): a round moves Θ by its token share of a full round
// (H · Σ tokens-per-step of the live learners), and a full round's worth completes the sweep.
TEST(SyncerCore, SweepScalesAPartialRoundByItsTokenShare) {
  for (auto rule : {OuterGradientRule::kCurrent, OuterGradientRule::kBase}) {
    auto f = Small();
    auto o = Fp32Options();
    o.outer_step = OuterStepRule::kSweep;
    o.outer_gradient = rule;
    auto core = SyncerCore::Create(o, f.plan, f.initial);
    ASSERT_TRUE(core.ok());
    ManualClock clock;
    JoinAndPull(*core, f.plan, 0, clock.Now());
    JoinAndPull(*core, f.plan, 1, clock.Now());
    // Learner 0 alone: 20 tokens in 2 steps (10 per step); two live learners → a full round is
    // H·(10 + 10) = 40 tokens, so ρ = 0.5 and Θ = 1 − 0.5·0.2 = 0.9.
    auto first = core->Push(Header(0, 0, 0, 20, 2), Fp32Payload(std::vector<float>(4, 0.2f)), clock.Now());
    ASSERT_TRUE(first.ok());
    EXPECT_EQ(first->merged_version, 1);
    auto r0 = core->Poll(clock.Now(), clock);
    ASSERT_EQ(r0.size(), 1u);
    EXPECT_DOUBLE_EQ(r0[0].token_share, 0.5);
    EXPECT_FALSE(r0[0].sweep_completed);
    for (float v : core->theta(0)) EXPECT_NEAR(v, 0.9f, 1e-6);
    // Learner 1, computed against version 0 (θ_1 = 0.6), folded into the next round.
    auto late = core->Push(Header(1, 0, 0, 20, 2), Fp32Payload(std::vector<float>(4, 0.4f)), clock.Now());
    ASSERT_TRUE(late.ok());
    EXPECT_EQ(late->merged_version, 2);
    auto r1 = core->Poll(clock.Now(), clock);
    ASSERT_EQ(r1.size(), 1u);
    EXPECT_TRUE(r1[0].sweep_completed);
    // kCurrent: v = 0.9 − 0.6 = 0.3 → Θ = 0.9 − 0.15 = 0.75.
    // kBase:    v = Δ̂ = 0.4        → Θ = 0.9 − 0.2 = 0.7 (the mean of both learners' progress).
    const float expected = rule == OuterGradientRule::kCurrent ? 0.75f : 0.7f;
    for (float v : core->theta(0)) EXPECT_NEAR(v, expected, 1e-6);
  }
}

// The end-of-training sync: every learner's final push of a fragment holds all it did since its
// last receipt, fewer than H steps. A round of them moves Θ all the way to the learners' merge
// (ρ = 1), where counted as plain tokens it would move Θ by c_steps/H of the way and lose part of
// the run's last steps.
TEST(SyncerCore, ARoundOfFinalSyncsMovesThetaAllTheWay) {
  for (bool final_sync : {true, false}) {
    auto f = Small();
    auto o = Fp32Options();
    o.outer_step = OuterStepRule::kSweep;
    auto core = SyncerCore::Create(o, f.plan, f.initial);
    ASSERT_TRUE(core.ok());
    ManualClock clock;
    JoinAndPull(*core, f.plan, 0, clock.Now());
    JoinAndPull(*core, f.plan, 1, clock.Now());
    // One step each (H = 2), θ = 0.8 and 0.6: the mean outer gradient is 0.3.
    for (auto [id, d] : {std::pair{0, 0.2f}, std::pair{1, 0.4f}}) {
      PushHeaderData h = Header(id, 0, 0, 10, 1);
      h.final_sync = final_sync;
      ASSERT_TRUE(core->Push(h, Fp32Payload(std::vector<float>(4, d)), clock.Now()).ok());
    }
    auto r = core->Poll(clock.Now(), clock);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_DOUBLE_EQ(r[0].token_share, final_sync ? 1.0 : 0.5);
    for (float v : core->theta(0)) EXPECT_NEAR(v, final_sync ? 0.7f : 0.85f, 1e-6) << "final_sync " << final_sync;
  }
}

TEST(SyncerCore, QuorumAndGraceFollowTheManualClock) {
  auto f = Small();
  auto o = Fp32Options();
  o.round.grace = true;
  o.round.gamma = 0.5;
  o.round.tau = 2;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  for (int id = 0; id < 3; ++id) JoinAndPull(*core, f.plan, id, clock.Now());
  LearnerProgress hb;
  hb.step_seconds = 1.0;  // t_step = 1 s → grace = 0.5·(2·1 − 0 − 0) = 1 s
  for (int id = 0; id < 3; ++id) ASSERT_TRUE(core->Heartbeat(id, hb, clock.Now()).ok());
  std::vector<float> d(4, 0.1f);
  ASSERT_TRUE(core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(d), clock.Now()).ok());
  EXPECT_TRUE(core->Poll(clock.Now(), clock).empty());
  auto wake = core->NextWake(clock.Now());
  ASSERT_TRUE(wake.has_value());
  EXPECT_NEAR(ToSeconds(*wake), 1.0, 1e-9);
  clock.AdvanceSeconds(0.5);
  ASSERT_TRUE(core->Push(Header(1, 0, 0, 10, 1), Fp32Payload(d), clock.Now()).ok());
  EXPECT_TRUE(core->Poll(clock.Now(), clock).empty());
  clock.AdvanceSeconds(0.5);
  auto reports = core->Poll(clock.Now(), clock);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].contributors, (std::vector<int>{0, 1}));
  EXPECT_EQ(reports[0].late, (std::vector<int>{2}));
  EXPECT_NEAR(reports[0].grace_seconds, 1.0, 1e-9);
}

// The learner's side of pulls, as LearnerAgent keeps it: Φ, its lattice and its version, changed
// only through what Pull returns (ApplyPulled checks the value checksum on every pull).
struct LearnerView {
  std::vector<float> phi;
  exchange::Lattice lattice;
  int64_t have = -1;
  size_t bytes = 0;  // pulled payload bytes

  Status Take(const StatusOr<PullPayload>& r) {
    if (!r.ok()) return r.status();
    if (r->not_modified) return Status::Ok();
    bytes += r->bytes.size();
    ATOLL_RETURN_IF_ERROR(ApplyPulled(*r, have, r->is_delta ? phi.size() : numel, phi, lattice));
    have = r->version;
    return Status::Ok();
  }
  size_t numel = 4;
};

// A learner whose fragment holds the run's initial values bit for bit (same seed) is not sent it
// at join: it snaps them to their lattice, holds version 0, and its first push needs no pull.
TEST(SyncerCore, JoinWithTheInitialValuesSkipsTheFetch) {
  auto f = Small();
  auto core = SyncerCore::Create(Fp32Options(), f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinRequestData r = Req(f.plan, 0);
  r.fragment_checksums = {exchange::ValuesChecksum(f.initial[0]),
                          exchange::ValuesChecksum(std::vector<float>(4, 2.0f))};
  auto reply = core->Join(r, clock.Now());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->fragment_held, (std::vector<int64_t>{0, -1}));  // fragment 1 differs
  EXPECT_EQ(reply->fragment_initial, (std::vector<bool>{true, false}));
  // The held fragment accepts a push against version 0 at once; a pull says not modified.
  EXPECT_TRUE(core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(std::vector<float>(4, 0.1f)), clock.Now()).ok());
  auto pull = core->Pull(0, 0, 0);
  ASSERT_TRUE(pull.ok());
  EXPECT_TRUE(pull->not_modified);
  // A list of the wrong length matches nothing.
  JoinRequestData bad = Req(f.plan, 1);
  bad.fragment_checksums = {1};
  auto reply1 = core->Join(bad, clock.Now());
  ASSERT_TRUE(reply1.ok());
  EXPECT_EQ(reply1->fragment_held, (std::vector<int64_t>{-1, -1}));
}

// A learner process that restarts from the run's seed holds the initial values: snapped, they are
// the public copy at version 0, and while the history reaches back that far its catch-up is one
// lattice delta (the exact sum of every round's) that lands on the syncer's bits. Once version 0
// has left the history it gets the full copy.
TEST(SyncerCore, ALearnerFromTheSeedCatchesUpWithOneDelta) {
  auto f = Small();
  auto o = Fp32Options();
  o.downlink = {Encoding::kInt4, 8, diloco::Compression::kDeflate};
  o.history_versions = 3;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  auto round = [&](int64_t base) {  // Θ_0 moves away from the initial values
    std::vector<float> d = {0.5f, -0.25f, 0.125f, 1.0f};
    ASSERT_TRUE(core->Push(Header(0, 0, base, 10, 1), Fp32Payload(d), clock.Now()).ok());
    ASSERT_EQ(core->Poll(clock.Now(), clock).size(), 1u);
  };
  for (int64_t v = 0; v < 3; ++v) round(v);
  ASSERT_EQ(core->versions()[0], 3);
  JoinRequestData r = Req(f.plan, 1);
  r.fragment_checksums = {exchange::ValuesChecksum(f.initial[0]), exchange::ValuesChecksum(f.initial[1])};
  auto reply = core->Join(r, clock.Now());
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->fragment_held, (std::vector<int64_t>{0, 0}));  // fragment 1 never moved
  EXPECT_EQ(reply->fragment_initial, (std::vector<bool>{true, true}));
  LearnerView l;
  l.phi = f.initial[0];
  l.lattice = *exchange::MakeLattice(l.phi, 8);
  exchange::SnapToLattice(l.lattice, l.phi);
  l.have = 0;
  auto pull = core->Pull(1, 0, 0);
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_TRUE(pull->is_delta);
  EXPECT_EQ(pull->base_version, 0);
  EXPECT_EQ(pull->version, 3);
  ASSERT_TRUE(l.Take(pull).ok());  // the value checksum: the same bits
  auto held = core->public_values(0);
  EXPECT_EQ(std::memcmp(l.phi.data(), held.data(), 16), 0);
  // One more round: version 0 leaves the history (3 deltas kept): the seed no longer matches.
  round(3);
  EXPECT_EQ(core->public_copy(0)->oldest(), 1);
  r.rejoin = true;
  auto late = core->Join(r, clock.Now());
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->fragment_held[0], -1);
  auto full = core->Pull(1, 0, 0);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->is_delta);
  LearnerView fresh;
  ASSERT_TRUE(fresh.Take(full).ok());
  EXPECT_EQ(std::memcmp(fresh.phi.data(), core->public_values(0).data(), 16), 0);
}

TEST(SyncerCore, PublicCopiesStayBitIdenticalOverManyInt4Rounds) {
  // A bigger fragment so int4 blocks matter.
  std::vector<diloco::TensorSpec> t = {{"layers.0.w", {64, 32}, 2048, false}};
  diloco::PlanOptions po;
  po.num_fragments = 1;
  auto plan = diloco::MakeFragmentPlan(t, po);
  ASSERT_TRUE(plan.ok());
  Rng rng(5);
  std::vector<std::vector<float>> init(1, std::vector<float>(2048));
  for (float& v : init[0]) v = static_cast<float>(rng.Normal(0, 0.02));
  SyncerOptions o;
  o.run_id = "r";
  o.H = 1;
  o.round.grace = false;
  o.uplink = {Encoding::kInt4, 64};
  o.downlink = {Encoding::kInt4, 64};
  auto core = SyncerCore::Create(o, *plan, init);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  ASSERT_TRUE(core->Join(Req(*plan, 0), clock.Now()).ok());
  LearnerView l;
  l.numel = 2048;
  ASSERT_TRUE(l.Take(core->Pull(0, 0, -1)).ok());
  for (size_t i = 0; i < 2048; ++i) EXPECT_NEAR(l.phi[i], init[0][i], std::ldexp(1.0, -14) * 0.1);  // Φ⁰: Θ⁰ snapped
  std::vector<float> local = l.phi;
  double max_gap = 0;
  for (int round = 0; round < 200; ++round) {
    for (float& v : local) v -= static_cast<float>(rng.Normal(0.001, 0.01));  // "training"
    std::vector<std::byte> payload;
    ASSERT_TRUE(exchange::EncodeOuterGradient(o.uplink, l.phi, local, payload).ok());
    PushHeaderData h;
    h.learner_id = 0;
    h.fragment = 0;
    h.base_version = l.have;
    h.c_tokens = 100;
    h.c_steps = 1;
    h.encoding = Encoding::kInt4;
    h.block_size = 64;
    h.num_values = 2048;
    ASSERT_TRUE(core->Push(h, payload, clock.Now()).ok());
    ASSERT_EQ(core->Poll(clock.Now(), clock).size(), 1u);
    auto pulled = core->Pull(0, 0, l.have);
    ASSERT_TRUE(pulled.ok());
    ASSERT_TRUE(pulled->is_delta);
    ASSERT_TRUE(l.Take(pulled).ok()) << "round " << round;
    ASSERT_EQ(std::memcmp(l.phi.data(), core->public_values(0).data(), l.phi.size() * 4), 0);
    double gap = 0;
    for (size_t i = 0; i < l.phi.size(); ++i) gap = std::max(gap, double(std::fabs(l.phi[i] - core->theta(0)[i])));
    max_gap = std::max(max_gap, gap);
    local = l.phi;  // overwrite on receipt (α = 0)
  }
  // Error feedback: the public copy tracks Θ within one step of the latest delta, and the gap
  // does not grow with the number of rounds.
  EXPECT_LT(max_gap, 0.05);
  EXPECT_TRUE(core->Pull(0, 0, l.have)->not_modified);
  EXPECT_EQ(core->Pull(0, 0, l.have + 5).status().code(), StatusCode::kFailedPrecondition);
  // A version older than the history gets the full copy.
  auto full = core->Pull(0, 0, 3);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->is_delta);
}

// The small plan with an int8 downlink; learners 0 and 1 joined and holding version 0.
std::optional<SyncerCore> Int8DownlinkWithTwoLearners(const Fixture& f) {
  auto o = Fp32Options();
  o.downlink = {Encoding::kInt8, 8};
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ATOLL_CHECK(core.ok());
  JoinAndPull(*core, f.plan, 0, TimePoint{});
  JoinAndPull(*core, f.plan, 1, TimePoint{});
  return std::move(*core);
}

// k versions behind, a learner gets one delta: the exact sum of the k rounds' deltas, which
// lands on the syncer's bits. A lost reply costs nothing: the same pull gets the same bytes.
TEST(SyncerCore, ALearnerKVersionsBehindGetsOneDeltaAndALostReplyIsAskedAgain) {
  auto f = Small();
  auto core = Int8DownlinkWithTwoLearners(f);
  ManualClock clock;
  LearnerView zero, one;
  zero.phi = one.phi = std::vector<float>(core->public_values(0).begin(), core->public_values(0).end());
  zero.lattice = one.lattice = core->public_copy(0)->lattice();
  zero.have = one.have = 0;
  // Learner 1 drives five rounds of fragment 0 while learner 0 holds version 0.
  for (int r = 0; r < 5; ++r) {
    std::vector<float> d = {0.1f, -0.3f * static_cast<float>(r), 0.02f, 0.5f};
    ASSERT_TRUE(core->Push(Header(1, 0, one.have, 10, 1), Fp32Payload(d), clock.Now()).ok());
    ASSERT_EQ(core->Poll(clock.Now(), clock).size(), 1u);
    ASSERT_TRUE(one.Take(core->Pull(1, 0, one.have)).ok()) << "round " << r;
  }
  // Learner 0 is five versions behind: one delta brings it to version 5, bit for bit.
  auto d0 = core->Pull(0, 0, 0);
  ASSERT_TRUE(d0.ok());
  EXPECT_TRUE(d0->is_delta);
  EXPECT_EQ(d0->version, 5);
  // That reply is "lost": learner 0 asks again from version 0 and gets the same bytes.
  auto again = core->Pull(0, 0, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->bytes, d0->bytes);
  ASSERT_TRUE(zero.Take(again).ok());
  EXPECT_EQ(zero.phi, one.phi);
  // A push computed against the older copy is still accepted (the learner may not have applied
  // the reply yet): the syncer rebuilds Φ at version 0 from its history.
  std::vector<float> d(4, 0.0f);
  EXPECT_TRUE(core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(d), clock.Now()).ok());
}

TEST(SyncerCore, APullWantingALaterVersionDownloadsNothingUntilItExists) {
  auto f = Small();
  auto core = Int8DownlinkWithTwoLearners(f);
  ManualClock clock;
  // Learner 0's push was promised version 2; learner 1's round makes version 1 first.
  auto round = [&](int id, int64_t base) {
    ASSERT_TRUE(core->Push(Header(id, 0, base, 10, 1), Fp32Payload(std::vector<float>(4, 0.1f)), clock.Now()).ok());
    ASSERT_EQ(core->Poll(clock.Now(), clock).size(), 1u);
  };
  round(1, 0);
  ASSERT_EQ(core->version(0), 1);
  auto early = core->Pull(0, 0, 0, /*want_version=*/2);
  ASSERT_TRUE(early.ok());
  EXPECT_TRUE(early->not_modified);  // version 1 is not worth a download
  EXPECT_TRUE(early->bytes.empty());
  EXPECT_EQ(early->version, 1);
  round(0, 0);
  // Now one delta from the copy still at version 0 brings learner 0 to version 2.
  auto merged = core->Pull(0, 0, 0, 2);
  ASSERT_TRUE(merged.ok());
  EXPECT_TRUE(merged->is_delta);
  EXPECT_EQ(merged->base_version, 0);
  EXPECT_EQ(merged->version, 2);
  // Wanting nothing in particular (-1) or the next version gets whatever is newer, as before.
  round(1, 0);
  auto any = core->Pull(1, 0, 0, -1);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->version, 3);
  EXPECT_TRUE(any->is_delta);
}

// Nothing the syncer holds grows with the number of learners: the same rounds with 2 and with 16
// learners joined leave the same bytes in Θ, the public copies and their history; only the
// learner table grows (one row each).
TEST(SyncerCore, HeldMemoryDoesNotGrowWithTheNumberOfLearners) {
  auto run = [](int learners) {
    auto f = Small();
    auto o = Fp32Options();
    o.downlink = {Encoding::kInt4, 8, diloco::Compression::kDeflate};
    auto core = SyncerCore::Create(o, f.plan, f.initial);
    ATOLL_CHECK(core.ok());
    ManualClock clock;
    for (int id = 0; id < learners; ++id) JoinAndPull(*core, f.plan, id, clock.Now());
    for (int64_t v = 0; v < 6; ++v) {
      for (int id = 0; id < learners; ++id) {
        std::vector<float> d = {0.01f * static_cast<float>(id), -0.02f, 0.03f, 0.04f};
        ATOLL_CHECK(core->Push(Header(id, 0, v, 10, 1), Fp32Payload(d), clock.Now()).ok());
      }
      ATOLL_CHECK(core->Poll(clock.Now(), clock).size() == 1u);
      for (int id = 0; id < learners; ++id) ATOLL_CHECK(core->Pull(id, 0, v).ok());
    }
    return core->held_bytes();
  };
  const auto two = run(2), sixteen = run(16);
  EXPECT_EQ(two.theta, sixteen.theta);
  EXPECT_EQ(two.momentum, sixteen.momentum);
  EXPECT_EQ(two.public_copies, sixteen.public_copies);  // the pull cache: one payload per version asked
  EXPECT_EQ(two.scratch, sixteen.scratch);              // the round pass's saved values: one fragment's
  EXPECT_GT(two.scratch, 0u);
  EXPECT_EQ(two.pending, 0u);
  EXPECT_EQ(sixteen.pending, 0u);
  EXPECT_GT(sixteen.learners, two.learners);
  EXPECT_LT(sixteen.learners, 16 * 1024u);  // rows only
}

}  // namespace
}  // namespace atl::syncer

namespace atl::syncer {
namespace {

TEST(SyncerCore, OutlierOuterGradientIsQuarantinedNotMerged) {
  auto f = Small();
  auto o = Fp32Options();
  o.quarantine_factor = 10;
  o.quarantine_min_history = 3;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  int64_t have = 0;
  auto round = [&](float delta) {
    std::vector<float> d(4, delta);
    auto r = core->Push(Header(0, 0, have, 10, 1), Fp32Payload(d), clock.Now());
    if (r.ok()) {
      core->Poll(clock.Now(), clock);
      have = core->Pull(0, 0, have)->version;
    }
    return r;
  };
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(round(0.01f).ok());  // norms 0.02: the recent range
  const auto theta_before = std::vector<float>(core->theta(0).begin(), core->theta(0).end());
  auto bad = round(5.0f);  // norm 10: 500x the median
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("quarantined"), std::string::npos) << bad.status();
  EXPECT_EQ(std::vector<float>(core->theta(0).begin(), core->theta(0).end()), theta_before);
  EXPECT_EQ(core->learners().at(0).quarantined, 1);
  EXPECT_TRUE(round(0.015f).ok());  // a normal one afterwards is merged
}

TEST(SyncerCore, LearnerSendingGarbageRepeatedlyIsDisconnected) {
  auto f = Small();
  auto o = Fp32Options();
  o.max_consecutive_rejects = 3;
  o.ban_seconds = 60;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  JoinAndPull(*core, f.plan, 1, clock.Now());
  std::vector<float> nan(4, std::nanf(""));
  Status last;
  for (int i = 0; i < 3; ++i) last = core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(nan), clock.Now()).status();
  EXPECT_NE(last.message().find("now disconnected"), std::string::npos) << last;
  std::vector<float> good(4, 0.1f);
  auto refused = core->Push(Header(0, 0, 0, 10, 1), Fp32Payload(good), clock.Now());
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  LearnerProgress hb;
  EXPECT_EQ(core->Heartbeat(0, hb, clock.Now()).code(), StatusCode::kPermissionDenied);
  // Other learners are unaffected.
  EXPECT_TRUE(core->Push(Header(1, 0, 0, 10, 1), Fp32Payload(good), clock.Now()).ok());
  // The ban expires; silent for that long, the learner rejoins before it counts again.
  clock.AdvanceSeconds(61);
  EXPECT_EQ(core->Heartbeat(0, hb, clock.Now()).code(), StatusCode::kNotFound);
  JoinAndPull(*core, f.plan, 0, clock.Now());
  EXPECT_TRUE(core->Heartbeat(0, hb, clock.Now()).ok());
}

TEST(SyncerCore, ALearnerSilentPastTheTimeoutRejoinsBeforeItsPushesAndHeartbeatsCount) {
  auto f = Small();
  auto o = Fp32Options();
  o.learner_timeout_s = 5;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  JoinAndPull(*core, f.plan, 1, clock.Now());
  std::vector<float> good(4, 0.1f);
  LearnerProgress hb;
  clock.AdvanceSeconds(4);  // within the timeout: counted
  ASSERT_TRUE(core->Heartbeat(0, hb, clock.Now()).ok());
  clock.AdvanceSeconds(6);  // learner 1 is now silent for 10 s, learner 0 for 6 s
  auto silent = core->Push(Header(1, 0, 0, 10, 1), Fp32Payload(good), clock.Now());
  EXPECT_EQ(silent.status().code(), StatusCode::kNotFound);
  EXPECT_NE(silent.status().message().find("rejoin"), std::string::npos) << silent.status();
  EXPECT_EQ(core->Heartbeat(1, hb, clock.Now()).code(), StatusCode::kNotFound);
  EXPECT_EQ(core->Heartbeat(0, hb, clock.Now()).code(), StatusCode::kNotFound);
  JoinAndPull(*core, f.plan, 1, clock.Now());
  EXPECT_TRUE(core->Heartbeat(1, hb, clock.Now()).ok());
  EXPECT_TRUE(core->Push(Header(1, 0, 0, 10, 1), Fp32Payload(good), clock.Now()).ok());
  // Silence is measured to when a call arrived: a heartbeat that reached a busy loop in time is
  // in contact, however late the loop gets to it.
  const TimePoint arrived = clock.Now();
  clock.AdvanceSeconds(30);
  EXPECT_TRUE(core->Heartbeat(1, hb, clock.Now(), arrived).ok());
}

}  // namespace
}  // namespace atl::syncer

namespace atl::syncer {
namespace {

TEST(SyncerCore, FinishClosesRoundsStillInTheirGraceWindow) {
  auto f = Small();
  auto o = Fp32Options();
  o.round.grace = true;
  o.round.gamma = 1.0;
  o.round.grace_cap_s = 30;
  auto core = SyncerCore::Create(o, f.plan, f.initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  JoinAndPull(*core, f.plan, 0, clock.Now());
  JoinAndPull(*core, f.plan, 1, clock.Now());
  LearnerProgress hb;
  hb.step_seconds = 5.0;  // grace = 1·(2·5 − 0 − 0) = 10 s
  ASSERT_TRUE(core->Heartbeat(0, hb, clock.Now()).ok());
  std::vector<float> d(4, 0.1f);
  ASSERT_TRUE(core->Push(Header(0, 1, 0, 10, 1), Fp32Payload(d), clock.Now()).ok());
  EXPECT_TRUE(core->Poll(clock.Now(), clock).empty());  // waiting for learner 1 in the grace window
  auto closed = core->CloseAllPending(clock.Now(), clock);
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].fragment, 1);
  EXPECT_NE(closed[0].reason.find("final"), std::string::npos);
  EXPECT_EQ(core->version(1), 1);
  EXPECT_TRUE(core->CloseAllPending(clock.Now(), clock).empty());
}

}  // namespace
}  // namespace atl::syncer
