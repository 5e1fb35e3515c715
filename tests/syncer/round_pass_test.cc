// The syncer's tiled round (docs/decisions/018) against the math it fuses, done step by step on
// whole vectors: decode every push, take its outer gradient, MergeFragment, the outer step, the
// public copy's lattice step. The bits must be the same, at any number of threads.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "atoll/core/rng.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/outer_optimizer.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/exchange/lattice.h"
#include "atoll/syncer/syncer_core.h"
#include "testing/small_core.h"

namespace atl::syncer {
namespace {

using testing::Stamped;

using diloco::Encoding;

// Tensors whose slices cross reduction chunks and tiles, one an embedding; P = 2.
diloco::FragmentPlan Plan() {
  std::vector<diloco::TensorSpec> t = {{"tok_embed.weight", {7, 3001}, 21007, true},
                                       {"layers.0.w", {100, 411}, 41100, false},
                                       {"layers.1.w", {5, 1999}, 9995, false},
                                       {"layers.2.b", {301}, 301, false}};
  diloco::PlanOptions po;
  po.num_fragments = 2;
  auto plan = diloco::MakeFragmentPlan(t, po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

SyncerOptions Options(int threads, double lr, double momentum) {
  SyncerOptions o;
  o.run_id = "r";
  o.H = 2;
  o.round.quorum = 3;
  o.round.grace = false;
  o.merge_rule = diloco::MergeRule::kRda;
  o.outer = {lr, momentum, true};
  o.outer_step = OuterStepRule::kSweep;
  o.uplink = {Encoding::kInt4, 256, diloco::Compression::kDeflate};
  o.downlink = {Encoding::kInt4, 256, diloco::Compression::kDeflate};
  o.threads = threads;
  // The pushes here are noise around a small drift, each weighted as the reference weights it: a
  // push's influence (admission, tested in robust_merge_test and the adversary test) is not this
  // test's subject.
  o.influence_size_factor = 0;
  o.influence_min_cosine = 0;
  return o;
}

struct Round {
  std::vector<std::vector<std::byte>> payloads;  // per learner
  std::vector<int64_t> bases;
};

// What SyncerCore must hold after a round of fragment `fragment` made of `r`, computed on whole
// vectors from the state before the round (Θ, Φ, its lattice), with the sweep and momentum the
// reference keeps in step with the core's: Θ_p, Φ_p.
struct Expected {
  std::vector<float> theta, phi;
};

Expected Reference(const diloco::Fragment& fragment, const SyncerOptions& o, std::vector<float> theta,
                   std::vector<float> phi, const exchange::Lattice& lattice, const Round& r,
                   const std::vector<std::vector<float>>& bases, double rho, diloco::SweepState& sweep,
                   std::vector<float>& momentum) {
  std::vector<std::vector<float>> v(r.payloads.size(), std::vector<float>(theta.size()));
  std::vector<std::span<const float>> spans;
  for (size_t m = 0; m < r.payloads.size(); ++m) {
    EXPECT_TRUE(diloco::Decode(o.uplink, r.payloads[m], v[m]).ok());
    for (size_t i = 0; i < theta.size(); ++i) v[m][i] = theta[i] - (bases[m][i] - v[m][i]);
    spans.emplace_back(v[m]);
  }
  const std::vector<double> w(r.payloads.size(), diloco::TokenWeight(100, 1));
  std::vector<float> merged(theta.size());
  EXPECT_TRUE(diloco::MergeFragment(fragment, o.merge_rule, spans, w, merged).ok());
  EXPECT_TRUE(diloco::SweepOuterStep(o.outer, fragment, merged, rho, sweep, momentum, theta).ok());
  std::vector<std::byte> delta;
  EXPECT_TRUE(exchange::EncodeLatticeStep(lattice, DownlinkQmax(o.downlink.encoding), theta, phi, delta).ok());
  return {std::move(theta), std::move(phi)};
}

// Learners 0..n−1 join (they start from the run's initial values, as a learner process does).
void Join(SyncerCore& core, const diloco::FragmentPlan& plan, int n, TimePoint now) {
  for (int id = 0; id < n; ++id) {
    JoinRequestData j;
    j.protocol_version = kProtocolVersion;
    j.run_id = "r";
    j.model_signature = diloco::ModelSignature(plan.tensors);
    j.learner_id = id;
    j.host = "t";
    ASSERT_TRUE(core.Join(j, now).ok());
  }
}

PushHeaderData Header(const SyncerOptions& o, int id, int p, int64_t base, int64_t numel) {
  PushHeaderData h;
  h.learner_id = id;
  h.fragment = p;
  h.base_version = base;
  h.c_tokens = 100;
  h.c_steps = 1;
  h.encoding = o.uplink.encoding;
  h.block_size = o.uplink.block_size;
  h.compression = o.uplink.compression;
  h.num_values = numel;
  return h;
}

// Runs `rounds` rounds of fragment 0 with three learners (one of them a round late) and checks
// every round against the reference; returns the final Θ_0 and Φ_0.
// downlink_block: 256 divides the pass's tiles (the lattice step fused into them); 384 does not
// (the lattice step runs whole after the pass).
Expected RunAndCheck(int threads, double lr, double mu, int rounds, int downlink_block = 256) {
  SyncerOptions o = Options(threads, lr, mu);
  o.downlink.block_size = downlink_block;
  const diloco::FragmentPlan plan = Plan();
  Rng rng(17);
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan.fragments) {
    initial.emplace_back(static_cast<size_t>(f.numel));
    for (float& x : initial.back()) x = static_cast<float>(rng.Normal(0, 0.05));
  }
  auto core = SyncerCore::Create(o, plan, initial);
  EXPECT_TRUE(core.ok()) << core.status();
  ManualClock clock;
  Join(*core, plan, 3, clock.Now());
  diloco::SweepState sweep;
  std::vector<float> momentum(mu > 0 ? initial[0].size() : 0, 0.0f);
  std::vector<std::vector<float>> previous_phi;  // Φ_0 one version back (the late learner's base)
  for (int r = 0; r < rounds; ++r) {
    const auto phi = core->public_values(0);
    Round round;
    std::vector<std::vector<float>> bases;
    for (int id = 0; id < 3; ++id) {
      const bool late = id == 2 && !previous_phi.empty();
      const std::vector<float> base = late ? previous_phi.back() : std::vector<float>(phi.begin(), phi.end());
      std::vector<float> local(base);
      for (float& x : local) x -= static_cast<float>(rng.Normal(0.001 * (id + 1), 0.01));
      std::vector<std::byte> payload;
      EXPECT_TRUE(exchange::EncodeOuterGradient(o.uplink, base, local, payload).ok());
      round.payloads.push_back(payload);
      round.bases.push_back(core->version(0) - (late ? 1 : 0));
      bases.push_back(base);
    }
    previous_phi.emplace_back(phi.begin(), phi.end());
    for (int id = 0; id < 3; ++id) {
      auto pushed =
          core->Push(Stamped(*core, Header(o, id, 0, round.bases[static_cast<size_t>(id)], plan.fragments[0].numel)),
                     round.payloads[static_cast<size_t>(id)], clock.Now());
      EXPECT_TRUE(pushed.ok()) << pushed.status();
    }
    const std::vector<float> theta_before(core->theta(0).begin(), core->theta(0).end());
    const std::vector<float> phi_before(core->public_values(0).begin(), core->public_values(0).end());
    const exchange::Lattice lattice = core->public_copy(0)->lattice();
    auto reports = core->Poll(clock.Now(), clock);
    EXPECT_EQ(reports.size(), 1u);
    if (reports.size() != 1) return {};
    EXPECT_FALSE(reports[0].refused) << reports[0].refusal;
    // ρ as the core computed it (its report says), the rest by the reference.
    const Expected e = Reference(plan.fragments[0], o, theta_before, phi_before, lattice, round, bases,
                                 reports[0].token_share, sweep, momentum);
    const auto theta = core->theta(0), pub = core->public_values(0);
    EXPECT_EQ(std::memcmp(theta.data(), e.theta.data(), theta.size() * sizeof(float)), 0) << "round " << r;
    EXPECT_EQ(std::memcmp(pub.data(), e.phi.data(), pub.size() * sizeof(float)), 0) << "round " << r;
    clock.AdvanceSeconds(1);
  }
  return {std::vector<float>(core->theta(0).begin(), core->theta(0).end()),
          std::vector<float>(core->public_values(0).begin(), core->public_values(0).end())};
}

TEST(RoundPass, EqualsTheStepByStepMathAtAnyThreadCount) {
  for (const int block : {256, 384}) {
    for (const auto& [lr, mu] : {std::pair{1.0, 0.0}, std::pair{0.7, 0.9}}) {
      const Expected one = RunAndCheck(1, lr, mu, 4, block);
      const Expected four = RunAndCheck(4, lr, mu, 4, block);
      ASSERT_EQ(one.theta.size(), four.theta.size());
      EXPECT_EQ(std::memcmp(one.theta.data(), four.theta.data(), one.theta.size() * sizeof(float)), 0)
          << block << " " << lr << " " << mu;
      EXPECT_EQ(std::memcmp(one.phi.data(), four.phi.data(), one.phi.size() * sizeof(float)), 0)
          << block << " " << lr << " " << mu;
    }
  }
}

TEST(RoundPass, ARefusedRoundPutsBackEveryValueItMoved) {
  for (const double mu : {0.0, 0.9}) {
    SyncerOptions o = Options(4, 0.7, mu);
    o.round.quorum = 1;
    o.max_step_ratio = 1e-9;  // every step is "absurd": numeric safety refuses the round
    const diloco::FragmentPlan plan = Plan();
    Rng rng(3);
    std::vector<std::vector<float>> initial;
    for (const auto& f : plan.fragments) {
      initial.emplace_back(static_cast<size_t>(f.numel));
      for (float& x : initial.back()) x = static_cast<float>(rng.Normal(0, 0.05));
    }
    auto core = SyncerCore::Create(o, plan, initial);
    ASSERT_TRUE(core.ok());
    ManualClock clock;
    Join(*core, plan, 1, clock.Now());
    const std::vector<float> theta(core->theta(0).begin(), core->theta(0).end());
    const std::vector<float> phi(core->public_values(0).begin(), core->public_values(0).end());
    const auto snapshot = core->SnapshotFragment(0);
    std::vector<float> local(phi);
    for (float& x : local) x -= static_cast<float>(rng.Normal(0.01, 0.02));
    std::vector<std::byte> payload;
    ASSERT_TRUE(exchange::EncodeOuterGradient(o.uplink, phi, local, payload).ok());
    ASSERT_TRUE(core->Push(Stamped(*core, Header(o, 0, 0, 0, plan.fragments[0].numel)), payload, clock.Now()).ok());
    auto reports = core->Poll(clock.Now(), clock);
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_TRUE(reports[0].refused);
    EXPECT_NE(reports[0].refusal.find("step norm"), std::string::npos) << reports[0].refusal;
    EXPECT_EQ(core->version(0), 0);
    EXPECT_EQ(std::memcmp(core->theta(0).data(), theta.data(), theta.size() * 4), 0) << mu;
    EXPECT_EQ(std::memcmp(core->public_values(0).data(), phi.data(), phi.size() * 4), 0) << mu;
    const auto after = core->SnapshotFragment(0);
    EXPECT_EQ(after.momentum, snapshot.momentum);
    EXPECT_EQ(after.sweep_share, snapshot.sweep_share);
    EXPECT_EQ(core->public_copy(0)->checksum(), exchange::ValuesChecksum(phi));
  }
}

TEST(RoundPass, PushesBeyondThePendingBoundAreRefusedAndChangeNothing) {
  SyncerOptions o = Options(1, 1.0, 0.0);
  const diloco::FragmentPlan plan = Plan();
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan.fragments) initial.emplace_back(static_cast<size_t>(f.numel), 0.5f);
  const size_t raw = diloco::EncodedSize(o.uplink, static_cast<size_t>(plan.fragments[0].numel));
  o.max_pending_bytes = static_cast<int64_t>(raw + raw / 2);  // room for one push of fragment 0
  auto core = SyncerCore::Create(o, plan, initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  Join(*core, plan, 2, clock.Now());
  std::vector<float> local(core->public_values(0).begin(), core->public_values(0).end());
  for (float& x : local) x -= 0.01f;
  std::vector<std::byte> payload;
  ASSERT_TRUE(exchange::EncodeOuterGradient(o.uplink, core->public_values(0), local, payload).ok());
  ASSERT_TRUE(core->Push(Stamped(*core, Header(o, 0, 0, 0, plan.fragments[0].numel)), payload, clock.Now()).ok());
  const auto held = core->held_bytes().pending;
  auto refused = core->Push(Stamped(*core, Header(o, 1, 0, 0, plan.fragments[0].numel)), payload, clock.Now());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("push again later"), std::string::npos);
  EXPECT_EQ(core->held_bytes().pending, held);
  EXPECT_EQ(core->learners().at(1).pushes, 0);
  EXPECT_EQ(core->learners().at(1).pushes_rejected, 0);  // not a bad push: it is asked to come back
}

TEST(RoundPass, ACorruptPayloadIsRefusedAfterTheHeadersOwnChecks) {
  const SyncerOptions o = Options(1, 1.0, 0.0);
  const diloco::FragmentPlan plan = Plan();
  std::vector<std::vector<float>> initial;
  for (const auto& f : plan.fragments) initial.emplace_back(static_cast<size_t>(f.numel), 0.5f);
  auto core = SyncerCore::Create(o, plan, initial);
  ASSERT_TRUE(core.ok());
  ManualClock clock;
  Join(*core, plan, 1, clock.Now());
  const std::vector<std::byte> garbage(100, std::byte{0x5a});
  PushHeaderData h = Header(o, 0, 0, 0, plan.fragments[0].numel);
  EXPECT_EQ(core->Push(Stamped(*core, h), garbage, clock.Now()).status().code(), StatusCode::kDataLoss);
  h.c_steps = -1;  // a bad header is reported as such, whatever the payload
  EXPECT_EQ(core->Push(Stamped(*core, h), garbage, clock.Now()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(core->learners().at(0).pushes_rejected, 2);
  EXPECT_EQ(core->held_bytes().pending, 0u);
}

}  // namespace
}  // namespace atl::syncer
