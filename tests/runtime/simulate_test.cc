// `atoll simulate` (runtime/simulate.h): the real syncer core and loop, learner agents and models
// on simulated time. The point of it is determinism — the same config gives the same rounds and
// losses bit for bit however loaded the machine is — so that is tested first; then that it is
// the protocol (every learner contributes, nothing is lost, the model learns, diloco rounds hold
// everyone), and that what it does not simulate is refused by name.
#include <gtest/gtest.h>

#include "atoll/model/data.h"
#include "atoll/runtime/simulate.h"
#include "testing/data.h"
#include "testing/scratch.h"

namespace atl::runtime {
namespace {

const std::string& DataDir() { return testing::TinyByteData("simulate", 60000); }

RunConfig Small() {
  RunConfig c;
  c.learners = 3;
  c.steps = 24;
  c.seq = 32;
  c.batch = 4;
  c.fragments = 4;
  c.H = 4;
  c.tau = 1;
  c.warmup = 4;
  c.eval_batches = 4;
  c.eval_every = 8;
  c.data = DataDir();
  c.run_id = "sim";
  return c;
}

SimulateOptions Drifting() {
  SimulateOptions o;
  o.step_seconds = 1.0;
  o.spread = 0.1;  // learners drift apart, so rounds hold different learners
  o.jitter = 0.3;
  return o;
}

TEST(Simulate, TheSameConfigGivesTheSameRunBitForBit) {
  auto a = Simulate(Small(), Drifting());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Simulate(Small(), Drifting());
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->eval_loss, b->eval_loss);
  EXPECT_EQ(a->rounds, b->rounds);
  EXPECT_EQ(a->contributors_histogram, b->contributors_histogram);
  EXPECT_EQ(a->global_eval_curve, b->global_eval_curve);
  EXPECT_EQ(a->simulated_seconds, b->simulated_seconds);
  EXPECT_EQ(a->round_log, b->round_log);
  for (size_t i = 0; i < std::min(a->round_log.size(), b->round_log.size()); ++i) {
    // gtest prints only a vector's first 32 elements: name the first line that differs.
    if (a->round_log[i] != b->round_log[i]) {
      ADD_FAILURE() << "round line " << i << " differs:\n" << a->round_log[i].dump() << "\n" << b->round_log[i].dump();
      break;
    }
  }
  // The round log (rounds.jsonl) holds every round, in order, with the global eval where it ran.
  ASSERT_EQ(static_cast<int64_t>(a->round_log.size()), a->rounds);
  int evaluated = 0;
  double t = 0;
  for (const auto& line : a->round_log) {
    EXPECT_EQ(line.value("kind", ""), "round");
    EXPECT_GE(line.value("t", -1.0), t) << "in order of simulated time";
    t = line.value("t", -1.0);
    EXPECT_GT(line.value("token_share", 0.0), 0.0);
    EXPECT_FALSE(line["contributors"].empty());
    evaluated += line.contains("eval_loss") ? 1 : 0;
  }
  EXPECT_EQ(evaluated, static_cast<int>(a->global_eval_curve.size()));
  // The drift is real: not every round held every learner.
  EXPECT_LT(a->contributors_histogram.back(), a->rounds);
  // Another drift is another run.
  SimulateOptions other = Drifting();
  other.jitter = 0.05;
  auto c = Simulate(Small(), other);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(a->contributors_histogram, c->contributors_histogram);
}

TEST(Simulate, EveryLearnerContributesNothingIsLostAndTheModelLearns) {
  auto r = Simulate(Small(), Drifting());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(r->eval_loss, r->eval_loss_start - 0.5);
  EXPECT_EQ(r->tokens_trained, 3 * 24 * 4 * 32);
  EXPECT_DOUBLE_EQ(r->tokens_merged, static_cast<double>(r->tokens_trained));
  ASSERT_EQ(r->learners.size(), 3u);
  for (const auto& l : r->learners) {
    EXPECT_EQ(l.at("steps").get<int64_t>(), 24);
    EXPECT_GT(l.at("pushes").get<int64_t>(), 4);
    EXPECT_EQ(l.at("rejected").get<int64_t>(), 0);
  }
  EXPECT_GE(r->global_eval_curve.size(), 2u);
  ASSERT_EQ(r->merged_norm_quarters.size(), 4u);
  // 24 steps of 1 s ± 30 %, learners 1 ± 10 % apart: the run lasts about 24 simulated seconds.
  EXPECT_GT(r->simulated_seconds, 24 * 0.9 * 0.7);
  EXPECT_LT(r->simulated_seconds, 24 * 1.1 * 1.3 + 5);
}

// The bytes on the wire are the learners' encoded pushes and pulls: summed over the learners,
// both ways non-zero, and twice as many syncs of each fragment (P = H = 2 instead of 4: the
// whole model every 2 steps instead of every 4) put about twice the bytes on the wire.
TEST(Simulate, CountsTheBytesOnTheWire) {
  auto r = Simulate(Small(), Drifting());
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t up = 0, down = 0;
  for (const auto& l : r->learners) {
    EXPECT_GT(l.at("payload_bytes_up").get<int64_t>(), 0);
    EXPECT_GT(l.at("payload_bytes_down").get<int64_t>(), 0);
    up += l.at("payload_bytes_up").get<int64_t>();
    down += l.at("payload_bytes_down").get<int64_t>();
  }
  EXPECT_EQ(r->payload_bytes_up, up);
  EXPECT_EQ(r->payload_bytes_down, down);
  EXPECT_GT(r->params, 0);
  // int4 (half a byte a value plus block scales) at most, for every value of every push.
  int64_t pushes = 0;
  for (const auto& l : r->learners) pushes += l.at("pushes").get<int64_t>();
  EXPECT_LT(r->payload_bytes_up, pushes * r->params);
  const auto summary = SimulateSummary(Small(), Drifting(), *r);
  EXPECT_EQ(summary.at("payload_bytes_up").get<int64_t>(), up);
  EXPECT_EQ(summary.at("params").get<int64_t>(), r->params);

  RunConfig often = Small();
  often.fragments = 2;
  often.H = 2;
  auto o = Simulate(often, Drifting());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_GT(o->payload_bytes_up, 3 * r->payload_bytes_up / 2);
  EXPECT_LT(o->payload_bytes_up, 3 * r->payload_bytes_up);
}

TEST(Simulate, DilocoRoundsHoldEveryLearner) {
  RunConfig c = Small();
  c.mode = diloco::Mode::kDiloco;
  auto r = Simulate(c, Drifting());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->contributors_histogram.size(), 4u);
  EXPECT_EQ(r->contributors_histogram[3], r->rounds);
  EXPECT_EQ(r->rounds, 4 * 24 / 4);  // every fragment at every barrier of H = 4 steps
  EXPECT_LT(r->eval_loss, r->eval_loss_start);
}

TEST(Simulate, WhatIsNotSimulatedIsRefusedByName) {
  struct Case {
    const char* what;
    std::function<void(RunConfig&, SimulateOptions&)> change;
  };
  const std::vector<Case> cases = {
      {"ddp mode", [](RunConfig& c, SimulateOptions&) { c.mode = diloco::Mode::kDdp; }},
      {"chaos", [](RunConfig& c, SimulateOptions&) { c.chaos.mode = chaos::ChaosMode::kRandom; }},
      {"WAN emulation", [](RunConfig& c, SimulateOptions&) { c.bandwidth_mbps = 10; }},
      {"sharded syncer", [](RunConfig& c, SimulateOptions&) { c.syncer_shards = 2; }},
      {"--step-time", [](RunConfig&, SimulateOptions& o) { o.step_seconds = 0; }},
      {"--spread", [](RunConfig&, SimulateOptions& o) { o.spread = 1; }},
      {"--jitter", [](RunConfig&, SimulateOptions& o) { o.jitter = -0.1; }},
  };
  for (const auto& k : cases) {
    RunConfig c = Small();
    SimulateOptions o = Drifting();
    k.change(c, o);
    auto r = Simulate(c, o);
    ASSERT_FALSE(r.ok()) << k.what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << k.what << ": " << r.status();
    EXPECT_NE(r.status().message().find(k.what), std::string::npos) << k.what << ": " << r.status();
  }
}

}  // namespace
}  // namespace atl::runtime
