// A sharded syncer (docs/decisions/011): "i/S" parsing, fragment ownership, the refusals of a
// shard (another shard's fragment, a learner that names another shard or shard count, bad
// options), and the property the design rests on: two shards fed the same pushes as one syncer
// produce the same fragments, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include <unistd.h>

#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_core.h"
#include "testing/scratch.h"

namespace atl::syncer {
namespace {

// Four tensors of 64 values, P = 4 strided: fragment p is tensor p.
diloco::FragmentPlan FourFragmentPlan() {
  std::vector<diloco::TensorSpec> t;
  for (int i = 0; i < 4; ++i) t.push_back({"layers." + std::to_string(i) + ".w", {8, 8}, 64, false});
  diloco::PlanOptions po;
  po.num_fragments = 4;
  po.strategy = diloco::PlanStrategy::kStrided;
  po.split_large = false;
  auto plan = diloco::MakeFragmentPlan(t, po);
  ATOLL_CHECK(plan.ok());
  return *plan;
}

std::vector<std::vector<float>> Initial(const diloco::FragmentPlan& plan) {
  std::vector<std::vector<float>> v;
  for (const auto& f : plan.fragments) {
    v.emplace_back(static_cast<size_t>(f.numel));
    for (size_t i = 0; i < v.back().size(); ++i) v.back()[i] = 0.01f * static_cast<float>((i * 7 + f.index * 3) % 23);
  }
  return v;
}

// Decoupled defaults (int4 both ways, RDA, token weights, the sweep outer step with Nesterov
// momentum); a round closes once all three learners contributed.
SyncerOptions Options(ShardSpec shard) {
  SyncerOptions o;
  o.run_id = "r";
  o.H = 4;
  o.round.quorum = 3;
  o.round.grace = false;
  o.learner_timeout_s = 1e6;
  o.shard = shard;
  return o;
}

SyncerCore MakeCore(ShardSpec shard) {
  auto plan = FourFragmentPlan();
  auto core = SyncerCore::Create(Options(shard), plan, Initial(plan));
  ATOLL_CHECK(core.ok());
  return std::move(*core);
}

JoinRequestData Req(int id, ShardSpec shard) {
  JoinRequestData r;
  r.protocol_version = kProtocolVersion;
  r.run_id = "r";
  r.model_signature = diloco::ModelSignature(FourFragmentPlan().tensors);
  r.learner_id = id;
  r.host = "test";
  r.shard = shard;
  return r;
}

TEST(ShardSpec, ParsesIndexOfCount) {
  auto a = ParseShardSpec("0/2");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->index, 0);
  EXPECT_EQ(a->count, 2);
  auto b = ParseShardSpec("3/4");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->ToString(), "3/4");
  EXPECT_TRUE(ParseShardSpec("0/1").ok());
}

TEST(ShardSpec, BadInputSaysWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {{"2/2", "below the shard count"},
                                                                  {"x", "no '/'"},
                                                                  {"x/2", "index is not a number"},
                                                                  {"0/y", "count is not a number"},
                                                                  {"0/0", "must be 1..1024"},
                                                                  {"-1/2", "index is not a number"},
                                                                  {"", "no '/'"},
                                                                  {"1/2/3", "count is not a number"},
                                                                  {"0/5000", "must be 1..1024"}};
  for (const auto& [text, why] : cases) {
    auto s = ParseShardSpec(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << text << ": " << s.status();
    EXPECT_NE(s.status().message().find("expected i/S"), std::string::npos) << s.status();
  }
}

TEST(ShardSpec, EachFragmentHasExactlyOneOwner) {
  for (int S = 1; S <= 5; ++S) {
    for (int p = 0; p < 17; ++p) {
      int owners = 0;
      for (int i = 0; i < S; ++i) owners += ShardSpec{i, S}.owns(p) ? 1 : 0;
      EXPECT_EQ(owners, 1) << p << " of " << S;
      EXPECT_TRUE((ShardSpec{OwnerShard(p, S), S}.owns(p)));
    }
  }
  EXPECT_TRUE((ShardSpec{1, 3}.owns(4)));
  EXPECT_FALSE((ShardSpec{1, 3}.owns(3)));
  EXPECT_TRUE(ShardSpec{}.owns(7)) << "unsharded: every fragment";
}

TEST(ShardedCore, BadShardOptionsAreRefused) {
  auto plan = FourFragmentPlan();
  for (ShardSpec bad : {ShardSpec{2, 2}, ShardSpec{-1, 2}, ShardSpec{0, 0}}) {
    auto core = SyncerCore::Create(Options(bad), plan, Initial(plan));
    ASSERT_FALSE(core.ok());
    EXPECT_EQ(core.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(core.status().message().find("bad shard"), std::string::npos) << core.status();
  }
  auto too_many = SyncerCore::Create(Options({0, 5}), plan, Initial(plan));
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("every shard must own a fragment"), std::string::npos)
      << too_many.status();
}

TEST(ShardedCore, LearnerWithAnotherShardCountOrOrderIsRefused) {
  SyncerCore core = MakeCore({0, 2});
  auto unsharded = core.Join(Req(0, {0, 1}), TimePoint{});
  ASSERT_FALSE(unsharded.ok());
  EXPECT_EQ(unsharded.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unsharded.status().message().find("shard count mismatch"), std::string::npos) << unsharded.status();
  auto three = core.Join(Req(0, {0, 3}), TimePoint{});
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.status().message().find("shard count mismatch"), std::string::npos) << three.status();
  auto swapped = core.Join(Req(0, {1, 2}), TimePoint{});
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("shard order mismatch"), std::string::npos) << swapped.status();
  EXPECT_TRUE(core.learners().empty()) << "a refused join changes nothing";
  // And the other way round: a learner that believes it joins shard 0 of 2 at the one syncer.
  SyncerCore one = MakeCore({});
  auto two = one.Join(Req(0, {0, 2}), TimePoint{});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("shard count mismatch"), std::string::npos) << two.status();
  auto ok = core.Join(Req(0, {0, 2}), TimePoint{});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->shard.index, 0);
  EXPECT_EQ(ok->shard.count, 2);
}

TEST(ShardedCore, AnotherShardsFragmentIsRefusedAndChangesNothing) {
  SyncerCore core = MakeCore({1, 2});
  ASSERT_TRUE(core.Join(Req(0, {1, 2}), TimePoint{}).ok());
  auto pull = core.Pull(0, 2, -1);
  ASSERT_FALSE(pull.ok());
  EXPECT_EQ(pull.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(pull.status().message().find("fragment 2 belongs to syncer shard 0 of 2; this is shard 1/2"),
            std::string::npos)
      << pull.status();
  EXPECT_TRUE(core.public_values(2).empty()) << "another shard's fragment is not held here";
  ASSERT_TRUE(core.Pull(0, 3, -1).ok());
  PushHeaderData h;
  h.learner_id = 0;
  h.fragment = 0;
  h.base_version = 0;
  h.c_tokens = 8;
  h.c_steps = 1;
  h.encoding = diloco::Encoding::kInt4;
  h.block_size = 128;
  h.num_values = 64;
  std::vector<std::byte> payload(diloco::EncodedSize(core.options().uplink, 64));
  const Status announced = core.CheckPush(h, payload.size(), TimePoint{});
  EXPECT_EQ(announced.code(), StatusCode::kFailedPrecondition);
  auto push = core.Push(h, payload, TimePoint{});
  ASSERT_FALSE(push.ok());
  EXPECT_EQ(push.status().code(), StatusCode::kFailedPrecondition) << push.status();
  const LearnerRecord& l = core.learners().at(0);
  EXPECT_EQ(l.pushes, 0);
  EXPECT_EQ(l.pushes_rejected, 0) << "a misrouted push is not the learner's bad input (no ban)";
  EXPECT_EQ(core.versions(), (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(ShardedCore, AShardsStateResumesOnlyAsThatShard) {
  const std::string dir = testing::ScratchDir("shard_state");
  SyncerCore s1 = MakeCore({1, 2});
  ASSERT_TRUE(DurableState(dir).SaveAll(s1).ok());
  for (ShardSpec other : {ShardSpec{0, 2}, ShardSpec{}, ShardSpec{1, 3}}) {
    SyncerCore core = MakeCore(other);
    Status st = DurableState(dir).Restore(core, TimePoint{});
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << other.ToString();
    EXPECT_NE(st.message().find("belongs to another shard"), std::string::npos) << st;
  }
  SyncerCore same = MakeCore({1, 2});
  EXPECT_TRUE(DurableState(dir).Restore(same, TimePoint{}).ok());
  // An unsharded state is not a shard's either.
  std::filesystem::remove_all(dir);
  SyncerCore one = MakeCore({});
  ASSERT_TRUE(DurableState(dir).SaveAll(one).ok());
  SyncerCore shard = MakeCore({0, 2});
  EXPECT_EQ(DurableState(dir).Restore(shard, TimePoint{}).code(), StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

// One learner's side of the exchange, as LearnerAgent does it: per fragment the copy Φ it holds
// and its version; every round it pulls, trains (a deterministic pseudo-random step) and pushes.
struct SimLearner {
  int id = 0;
  std::vector<std::vector<float>> phi;
  std::vector<exchange::Lattice> lattice;
  std::vector<int64_t> have;
};

// Drives `rounds` rounds of 3 learners through `route` (fragment → the core that owns it; join
// goes to every core in `cores`). Returns the rounds closed.
int Drive(std::vector<SyncerCore*> cores, const std::function<SyncerCore&(int)>& route, int rounds) {
  ManualClock clock;
  std::vector<SimLearner> learners(3);
  const int S = static_cast<int>(cores.size());
  for (int m = 0; m < 3; ++m) {
    learners[m].id = m;
    learners[m].phi.resize(4);
    learners[m].lattice.resize(4);
    learners[m].have.assign(4, -1);
    for (int i = 0; i < S; ++i)
      ATOLL_CHECK(
          cores[static_cast<size_t>(i)]->Join(Req(m, S == 1 ? ShardSpec{} : ShardSpec{i, S}), clock.Now()).ok());
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  int closed = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int p = 0; p < 4; ++p) {
      for (SimLearner& l : learners) {
        SyncerCore& core = route(p);
        auto pulled = core.Pull(l.id, p, l.have[p]);
        ATOLL_CHECK(pulled.ok());
        if (!pulled->not_modified) {
          ATOLL_CHECK(ApplyPulled(*pulled, l.have[p], 64, l.phi[p], l.lattice[p]).ok());
          l.have[p] = pulled->version;
        }
        std::vector<float> local = l.phi[p];
        for (float& x : local) x += noise(rng);
        PushHeaderData h;
        h.learner_id = l.id;
        h.fragment = p;
        h.base_version = l.have[p];
        h.c_steps = 2 + (l.id + r) % 3;             // learners at different speeds
        h.c_tokens = h.c_steps * (96 + 32 * l.id);  // and different batch sizes
        h.encoding = core.options().uplink.encoding;
        h.block_size = core.options().uplink.block_size;
        h.num_values = 64;
        std::vector<std::byte> payload;
        ATOLL_CHECK(exchange::EncodeOuterGradient(core.options().uplink, l.phi[p], local, payload).ok());
        ATOLL_CHECK(core.Push(h, payload, clock.Now()).ok());
        clock.AdvanceSeconds(0.01);
      }
      for (SyncerCore* c : cores) closed += static_cast<int>(c->Poll(clock.Now(), clock).size());
    }
  }
  return closed;
}

TEST(ShardedCore, TwoShardsMergeBitIdenticallyToOneSyncer) {
  SyncerCore one = MakeCore({});
  SyncerCore s0 = MakeCore({0, 2});
  SyncerCore s1 = MakeCore({1, 2});
  const int rounds = 12;
  ASSERT_EQ(Drive(
                {&one}, [&](int) -> SyncerCore& { return one; }, rounds),
            4 * rounds);
  ASSERT_EQ(Drive(
                {&s0, &s1}, [&](int p) -> SyncerCore& { return p % 2 == 0 ? s0 : s1; }, rounds),
            4 * rounds);
  EXPECT_EQ(s0.rounds_closed() + s1.rounds_closed(), one.rounds_closed());
  for (int p = 0; p < 4; ++p) {
    const SyncerCore& owner = p % 2 == 0 ? s0 : s1;
    const SyncerCore& other = p % 2 == 0 ? s1 : s0;
    EXPECT_EQ(owner.version(p), rounds) << "fragment " << p;
    EXPECT_EQ(owner.version(p), one.version(p));
    auto a = one.theta(p), b = owner.theta(p);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "fragment " << p << " differs";
    EXPECT_EQ(one.SnapshotFragment(p).momentum, owner.SnapshotFragment(p).momentum) << "momentum of fragment " << p;
    EXPECT_EQ(std::memcmp(one.public_values(p).data(), owner.public_values(p).data(), a.size() * sizeof(float)), 0)
        << "public copy of fragment " << p;
    // The shard that does not own it neither holds nor moves it.
    EXPECT_EQ(other.version(p), 0);
    EXPECT_TRUE(other.theta(p).empty());
  }
  // Accounting adds up across the shards: the tokens each learner got merged.
  for (int m = 0; m < 3; ++m) {
    EXPECT_DOUBLE_EQ(s0.learners().at(m).tokens_merged + s1.learners().at(m).tokens_merged,
                     one.learners().at(m).tokens_merged)
        << "learner " << m;
    EXPECT_EQ(s0.learners().at(m).pushes + s1.learners().at(m).pushes, one.learners().at(m).pushes);
  }
}

}  // namespace
}  // namespace atl::syncer
