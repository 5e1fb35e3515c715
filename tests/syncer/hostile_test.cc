// Hostile or broken clients against SyncerCore and SyncerLoop (issue 10): poisoned values, bad
// text, an unbounded learner table, absurd telemetry. Each test asserts that the syncer stays up,
// its committed state is unchanged, and it still serves an honest learner.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/guards.h"
#include "atoll/syncer/syncer_core.h"
#include "atoll/syncer/syncer_loop.h"
#include "testing/small_core.h"
#include "testing/scratch.h"

namespace atl::syncer {
namespace {

using diloco::Encoding;

SyncerOptions Options(Encoding up = Encoding::kFp32) { return testing::SmallOptions(up); }
SyncerCore MakeCore(const SyncerOptions& o, float init = 1.0f) { return testing::SmallCore(o, init); }
JoinRequestData Req(const SyncerCore&, int id, std::string host = "test") {
  return testing::SmallJoin(id, std::move(host));
}

void JoinAndPull(SyncerCore& core, int id, TimePoint now) {
  ASSERT_TRUE(core.Join(Req(core, id), now).ok());
  for (int p = 0; p < 2; ++p) ASSERT_TRUE(core.Pull(id, p, -1).ok());
}

PushHeaderData Header(int id, int p, int64_t base, Encoding enc = Encoding::kFp32) {
  return testing::SmallHeader(id, p, base, enc);
}
std::vector<std::byte> Fp32(float v) { return testing::Fp32Values(v); }

const TimePoint kT0 = TimePoint{} + std::chrono::seconds(100);

// --- 1. Poisoned model ---------------------------------------------------------------------

TEST(Hostile, HugeInt4BlockScalesAreRefusedFromTheFirstPush) {
  SyncerCore core = MakeCore(Options(Encoding::kInt4));
  JoinAndPull(core, 0, kT0);
  JoinAndPull(core, 1, kT0);
  // One int4 block of 4 values: scale 1e37, every code +7 → Δ̂ = 7e37, finite but absurd.
  std::vector<std::byte> payload(diloco::EncodedSize({Encoding::kInt4, 8}, 4));
  const float scale = 1e37f;
  std::memcpy(payload.data(), &scale, 4);
  payload[4] = payload[5] = std::byte{0xFF};
  auto bad = core.Push(Header(0, 0, 0, Encoding::kInt4), payload, kT0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("absurd"), std::string::npos) << bad.status();
  EXPECT_TRUE(core.Poll(kT0, RealClock::Default()).empty());
  EXPECT_EQ(core.version(0), 0);
  for (float v : core.theta(0)) EXPECT_EQ(v, 1.0f);
  // An honest learner is still served: its push merges and it can pull the result.
  std::vector<float> small(4, 0.01f);
  std::vector<std::byte> honest;
  ASSERT_TRUE(diloco::Encode({Encoding::kInt4, 8}, small, honest).ok());
  ASSERT_TRUE(core.Push(Header(1, 0, 0, Encoding::kInt4), honest, kT0).ok());
  auto closed = core.Poll(kT0, RealClock::Default());
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_FALSE(closed[0].refused);
  EXPECT_EQ(core.version(0), 1);
  EXPECT_TRUE(exchange::AllFinite(core.theta(0)));
  EXPECT_TRUE(core.Pull(1, 0, 0).ok());
}

TEST(Hostile, ARoundThatWouldPoisonThetaIsRefusedAndLeavesNoTrace) {
  SyncerOptions o = Options();
  o.max_gradient_ratio = 0;  // let the poison reach the round: the last line of defence
  SyncerCore a = MakeCore(o), b = MakeCore(o);
  for (SyncerCore* c : {&a, &b}) {
    JoinAndPull(*c, 0, kT0);
    JoinAndPull(*c, 1, kT0);
  }
  ASSERT_TRUE(a.Push(Header(0, 0, 0), Fp32(1e30f), kT0).ok());
  auto refused = a.Poll(kT0, RealClock::Default());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_TRUE(refused[0].refused);
  EXPECT_NE(refused[0].refusal.find("step norm"), std::string::npos) << refused[0].refusal;
  EXPECT_EQ(refused[0].version, 0);
  EXPECT_EQ(a.version(0), 0);
  EXPECT_EQ(a.rounds_closed(), 0);
  EXPECT_EQ(a.rounds_refused(), 1);
  EXPECT_EQ(a.learners().at(0).contributions_refused, 1);
  EXPECT_EQ(a.SnapshotFragment(0).version, 0);
  for (float v : a.theta(0)) EXPECT_EQ(v, 1.0f);
  for (float v : a.SnapshotFragment(0).momentum) EXPECT_EQ(v, 0.0f);
  EXPECT_TRUE(a.Poll(kT0, RealClock::Default()).empty());  // nothing left pending
  // The refused round left no trace (Θ, momentum, sweep): the same honest round on a twin that
  // never saw the poison gives bit-identical results.
  for (SyncerCore* c : {&a, &b}) {
    ASSERT_TRUE(c->Leave(0, kT0).ok());
    ASSERT_TRUE(c->Push(Header(1, 0, 0), Fp32(0.05f), kT0).ok());
    auto r = c->Poll(kT0, RealClock::Default());
    ASSERT_EQ(r.size(), 1u);
    EXPECT_FALSE(r[0].refused);
  }
  EXPECT_EQ(a.version(0), 1);
  EXPECT_EQ(exchange::ValuesChecksum(a.theta(0)), exchange::ValuesChecksum(b.theta(0)));
  EXPECT_EQ(exchange::ValuesChecksum(a.SnapshotFragment(0).momentum),
            exchange::ValuesChecksum(b.SnapshotFragment(0).momentum));
}

// Θ may legally reach ±3e38 with the numeric bounds off; the public copy's lattice cannot hold
// such values (docs/decisions/014): they saturate at its edge, counted, and every pull still
// lands the learner on the syncer's bits. Nothing aborts.
TEST(Hostile, ValuesBeyondTheLatticesRangeSaturateAndNeverAbort) {
  SyncerOptions o = Options();
  o.max_gradient_ratio = 0;
  o.max_step_ratio = 0;  // only finiteness: Θ may legally reach ±3e38
  o.outer = {1.0, 0.0, true};
  o.outer_step = OuterStepRule::kRound;
  SyncerCore core = MakeCore(o, 3e38f);
  JoinAndPull(core, 0, kT0);
  JoinAndPull(core, 1, kT0);
  const int64_t before = core.public_copy(0)->saturated();
  std::vector<float> phi0(core.public_values(0).begin(), core.public_values(0).end());
  ASSERT_TRUE(core.Push(Header(0, 0, 0), Fp32(phi0[0]), kT0).ok());  // θ_0 = 0 → Θ = 0
  ASSERT_EQ(core.Poll(kT0, RealClock::Default()).size(), 1u);
  ASSERT_TRUE(core.Pull(1, 0, 0).ok());
  ASSERT_TRUE(core.Push(Header(1, 0, 1), Fp32(3e38f), kT0).ok());  // θ_1 = −3e38 → Θ = −3e38
  ASSERT_EQ(core.Poll(kT0, RealClock::Default()).size(), 1u);
  EXPECT_GT(core.public_copy(0)->saturated(), before);
  // Learner 0 still holds version 0: one delta, the syncer's bits.
  auto pulled = core.Pull(0, 0, 0);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  exchange::Lattice lattice = core.public_copy(0)->lattice();
  std::vector<float> copy = phi0;
  ASSERT_TRUE(ApplyPulled(*pulled, 0, copy.size(), copy, lattice).ok());
  EXPECT_EQ(exchange::ValuesChecksum(copy), exchange::ValuesChecksum(core.public_values(0)));
  for (float v : copy) EXPECT_TRUE(std::isfinite(v));
}

TEST(Hostile, GuardsHoldWithoutHistory) {
  std::vector<float> theta(4, 1.0f), honest(4, 0.9f), huge(4, -1e30f);
  EXPECT_TRUE(CheckOuterGradientBound(theta, honest, true, 1e3).ok());
  EXPECT_FALSE(CheckOuterGradientBound(theta, huge, true, 1e3).ok());
  EXPECT_TRUE(CheckOuterGradientBound(theta, huge, true, 0).ok());  // off
  diloco::SweepState sweep;
  std::vector<float> after(4, 1.1f), momentum(4, 0.1f), inf(4, -INFINITY);
  EXPECT_TRUE(CheckRoundResult(theta, after, momentum, sweep, 1e3).ok());
  EXPECT_FALSE(CheckRoundResult(theta, inf, momentum, sweep, 0).ok());
  EXPECT_FALSE(CheckRoundResult(theta, after, inf, sweep, 0).ok());
  sweep.accum = inf;
  EXPECT_FALSE(CheckRoundResult(theta, after, momentum, sweep, 0).ok());
}

// --- 2. Text -------------------------------------------------------------------------------

TEST(Hostile, TruncateUtf8NeverSplitsACharacterAndRepairsBadBytes) {
  const std::string e = "\xC3\xA9";  // é
  EXPECT_EQ(TruncateUtf8(std::string(255, 'a') + e, 256), std::string(255, 'a'));
  EXPECT_EQ(TruncateUtf8("ab" + e, 4), "ab" + e);
  EXPECT_EQ(TruncateUtf8("a\xFF"
                         "b\xC3",
                         10),
            "a?b?");
  EXPECT_EQ(TruncateUtf8("\xED\xA0\x80", 10), "???");   // a surrogate is not UTF-8
  EXPECT_EQ(TruncateUtf8("\xF0\x9F\x98\x80x", 3), "");  // a 4-byte character that does not fit
  EXPECT_TRUE(IsValidUtf8(TruncateUtf8("\xC0\xAF\x80 ok", 100)));
  EXPECT_FALSE(IsValidUtf8("a\xC3"));
  nlohmann::json j = {{"host", "bad \xFF bytes"}};
  EXPECT_THROW((void)j.dump(), nlohmann::json::exception);
  EXPECT_NO_THROW((void)DumpJson(j));
}

TEST(Hostile, HostCutInsideACharacterOrWithBadBytesNeverBreaksStatusJson) {
  SyncerCore core = MakeCore(Options());
  ASSERT_TRUE(core.Join(Req(core, 0, std::string(255, 'a') + "\xC3\xA9"), kT0).ok());
  ASSERT_TRUE(core.Join(Req(core, 1, "bad \xFF\xFE bytes"), kT0).ok());
  EXPECT_LE(core.learners().at(0).host.size(), 256u);
  EXPECT_TRUE(IsValidUtf8(core.learners().at(0).host));
  EXPECT_TRUE(IsValidUtf8(core.learners().at(1).host));
  EXPECT_NO_THROW((void)core.StatusJson(kT0).dump());  // even the throwing dump
}

TEST(Hostile, ATaskThatThrowsIsAnErrorForItsCallerAndTheLoopRunsOn) {
  RealClock clock;
  SyncerLoop loop(MakeCore(Options()), clock, nullptr, std::chrono::milliseconds(5));
  EXPECT_THROW(loop.Call([](SyncerCore&, TimePoint) -> int { throw std::runtime_error("boom"); }), std::runtime_error);
  auto join = loop.Join(Req(MakeCore(Options()), 0));
  EXPECT_TRUE(join.ok()) << join.status();
  EXPECT_TRUE(loop.Pull(0, 0, -1, 0, -1).ok());
  loop.Stop();
}

// --- 3. Learner table ----------------------------------------------------------------------

TEST(Hostile, LearnerIdsAreValidatedAndTheTableIsCapped) {
  EXPECT_EQ(SyncerOptions{}.max_learners, 4096);
  SyncerOptions o = Options();
  o.max_learners = 8;
  SyncerCore core = MakeCore(o);
  for (int bad : {-2, -1000, o.max_learner_id + 1}) {
    auto r = core.Join(Req(core, bad), kT0);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
  }
  for (int id = 0; id < 8; ++id) ASSERT_TRUE(core.Join(Req(core, id * 1000), kT0).ok());
  for (int id : {-1, 999'999}) {
    auto r = core.Join(Req(core, id), kT0);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status();
  }
  EXPECT_EQ(core.learners().size(), 8u);
  JoinRequestData again = Req(core, 3000);
  again.rejoin = true;
  EXPECT_TRUE(core.Join(again, kT0).ok());  // a known id still rejoins
  EXPECT_EQ(core.learners().size(), 8u);
}

// --- 4. Telemetry --------------------------------------------------------------------------

TEST(Hostile, AbsurdTelemetryIsIgnoredAndCounted) {
  SyncerCore core = MakeCore(Options());
  ASSERT_TRUE(core.Join(Req(core, 0), kT0).ok());
  LearnerProgress p;
  p.step = 10;
  p.step_seconds = 0.5;
  p.tokens_per_second = 1000;
  ASSERT_TRUE(core.Heartbeat(0, p, kT0).ok());
  const double t_step = core.estimates().step_seconds;
  EXPECT_DOUBLE_EQ(t_step, 0.5);
  LearnerProgress bad = p;
  bad.step_seconds = 1e308;
  bad.tokens_per_second = -5;
  bad.loss = std::nan("");
  bad.tokens = -1;
  ASSERT_TRUE(core.Heartbeat(0, bad, kT0).ok());  // liveness still counts
  EXPECT_DOUBLE_EQ(core.estimates().step_seconds, t_step);
  const LearnerRecord& l = core.learners().at(0);
  EXPECT_EQ(l.telemetry_rejected, 4);
  EXPECT_DOUBLE_EQ(l.step_seconds, 0.5);
  EXPECT_DOUBLE_EQ(l.tokens_per_second, 1000);
  EXPECT_EQ(l.tokens, 0);
  EXPECT_NO_THROW((void)core.StatusJson(kT0).dump());
}

// --- 5. Commits out of file descriptors --------------------------------------------------------

TEST(Hostile, ACommitOutOfFileDescriptorsIsRetriedAndReportedAsTransient) {
  SyncerCore core = MakeCore(Options());
  const std::string dir = testing::ScratchDir("hostile-emfile");
  DurableState state(dir);
  ASSERT_TRUE(state.SaveAll(core).ok());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  const int next_fd = ::dup(0);
  ASSERT_GE(next_fd, 0);
  ::close(next_fd);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(next_fd);  // no new descriptor can be opened
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  Status st = state.SaveFragment(core, 0);
  ::setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st;
  EXPECT_NE(st.message().find("attempts"), std::string::npos) << st;
  EXPECT_TRUE(state.SaveFragment(core, 0).ok());  // descriptors back: the commit goes through
  std::filesystem::remove_all(dir);
}

// Found while writing fuzz/fuzz_durable_state.cc: a learners.json whose checksum is right but
// whose fields have the wrong JSON types threw out of Restore (terminating the syncer). The table
// is not committed state: it is ignored with a warning, and the fragments are restored.
TEST(Hostile, AWellChecksummedLearnerTableOfWrongTypesIsIgnoredNotACrash) {
  SyncerCore core = MakeCore(Options());
  const std::string dir = testing::ScratchDir("hostile-types");
  DurableState state(dir);
  ASSERT_TRUE(state.SaveAll(core).ok());
  for (const char* rows : {R"({"learners":[{"id":"zero","host":7}]})", R"({"learners":[5],"rounds_closed":"x"})"}) {
    nlohmann::json j = nlohmann::json::parse(rows);
    j["checksum"] = ChecksumHex(Checksum64(DumpJson(j)));
    ASSERT_TRUE(WriteFileAtomic(dir + "/learners.json", DumpJson(j, 2)).ok());
    SyncerCore restored = MakeCore(Options());
    DurableState reader(dir);
    Status st = reader.Restore(restored, kT0);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_TRUE(restored.learners().empty());
    ASSERT_EQ(reader.warnings().size(), 1u);
    EXPECT_NE(reader.warnings()[0].find("wrong type"), std::string::npos) << reader.warnings()[0];
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl::syncer
