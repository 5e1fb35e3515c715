// A syncer rebuilt from the learners' public copies (docs/decisions/021): SyncerCore::BeginRebuild,
// the copies a join is asked for, AdoptCopy's adoption and every refusal (nothing changes).
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "atoll/exchange/fragment_exchange.h"
#include "atoll/syncer/syncer_core.h"
#include "testing/small_core.h"

namespace atl::syncer {
namespace {

using testing::SmallCore;
using testing::SmallJoin;

const TimePoint kT0{std::chrono::seconds(100)};
const TimePoint kUntil = kT0 + std::chrono::seconds(30);

// Four values on the fragment's lattice (Θ⁰ = 1: a unit of 2^-14).
std::vector<float> OnLattice(float shift) { return {1.5f + shift, 0.25f, -2.0f, 3.0f}; }

SyncerOptions MomentumOptions() {
  SyncerOptions o = testing::SmallOptions();
  o.outer.momentum = 0.9;  // the core keeps a momentum buffer, which the adoption must reset
  return o;
}

// A join that declares `versions` per fragment, with the checksums of `copies`.
JoinRequestData Declaring(int id, const std::vector<std::vector<float>>& copies, const std::vector<int64_t>& versions) {
  JoinRequestData r = SmallJoin(id);
  r.rejoin = true;  // the tests join the same learner again
  for (const auto& c : copies) r.fragment_checksums.push_back(exchange::ValuesChecksum(c));
  r.fragment_versions = versions;
  return r;
}

// The offer of learner `id`'s copy of fragment `p` at `version`, stamped for `core`.
PushHeaderData Offer(const SyncerCore& core, int id, int p, int64_t version, int64_t n = 4) {
  PushHeaderData h;
  h.learner_id = id;
  h.fragment = p;
  h.base_version = version;
  h.encoding = diloco::Encoding::kFp32;
  h.compression = diloco::Compression::kNone;
  h.num_values = n;
  h.public_copy = true;
  return testing::Stamped(core, h);
}

struct Fingerprint {
  int64_t version;
  uint64_t theta, phi;
  bool operator==(const Fingerprint&) const = default;
};
Fingerprint Of(const SyncerCore& core, int p) {
  return {core.version(p), exchange::ValuesChecksum(core.theta(p)), core.public_copy(p)->checksum()};
}

TEST(Rebuild, ANewerCopyIsAdoptedAsThetaAndPhiWithMomentumReset) {
  SyncerCore core = SmallCore(MomentumOptions());
  core.BeginRebuild(kUntil);
  const std::vector<std::vector<float>> copies = {OnLattice(0), OnLattice(1)};
  auto reply = core.Join(Declaring(0, copies, {5, 0}), kT0);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->rebuild_wanted, std::vector<int>{0});  // fragment 1 at version 0: nothing newer
  auto adopted = core.AdoptCopy(Offer(core, 0, 0, 5), copies[0], kT0);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(adopted->reason, "adopted");
  EXPECT_EQ(adopted->version, 5);
  EXPECT_EQ(core.version(0), 5);
  const auto theta = core.theta(0), phi = core.public_values(0);
  EXPECT_EQ(std::vector<float>(theta.begin(), theta.end()), copies[0]);
  EXPECT_EQ(std::vector<float>(phi.begin(), phi.end()), copies[0]);
  const auto snap = core.SnapshotFragment(0);
  ASSERT_EQ(snap.momentum.size(), 4u);
  for (float m : snap.momentum) EXPECT_EQ(m, 0.0f);
  EXPECT_EQ(snap.sweep_share, 0.0);
  // The learner that offered it holds it: no pull, and a join again matches version 5.
  auto pull = core.Pull(0, 0, 5);
  ASSERT_TRUE(pull.ok()) << pull.status();
  EXPECT_TRUE(pull->not_modified);
  auto again = core.Join(Declaring(0, copies, {5, 0}), kT0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->fragment_held[0], 5);
  EXPECT_TRUE(again->rebuild_wanted.empty());
  const nlohmann::json rebuilt = core.StatusJson(kT0)["rebuilt"];
  EXPECT_TRUE(rebuilt["rebuilding"].get<bool>());
  EXPECT_TRUE(rebuilt["momentum_reset"].get<bool>());
  ASSERT_EQ(rebuilt["adopted"].size(), 1u);
  EXPECT_EQ(rebuilt["adopted"][0]["fragment"], 0);
  EXPECT_EQ(rebuilt["adopted"][0]["version"], 5);
  EXPECT_EQ(rebuilt["adopted"][0]["learner"], 0);
}

TEST(Rebuild, AnOlderOrEqualCopyIsNotAskedForAndRefusedIfOffered) {
  SyncerCore core = SmallCore(testing::SmallOptions());
  core.BeginRebuild(kUntil);
  const std::vector<std::vector<float>> newest = {OnLattice(0), OnLattice(0)};
  ASSERT_TRUE(core.Join(Declaring(0, newest, {5, 0}), kT0).ok());
  ASSERT_TRUE(core.AdoptCopy(Offer(core, 0, 0, 5), newest[0], kT0).ok());
  const Fingerprint before = Of(core, 0);
  for (int64_t v : {int64_t{3}, int64_t{5}}) {
    const std::vector<std::vector<float>> older = {OnLattice(2), OnLattice(0)};
    auto reply = core.Join(Declaring(1, older, {v, 0}), kT0);
    ASSERT_TRUE(reply.ok());
    EXPECT_TRUE(reply->rebuild_wanted.empty()) << "version " << v;
    auto refused = core.AdoptCopy(Offer(core, 1, 0, v), older[0], kT0);
    EXPECT_EQ(refused.status().code(), StatusCode::kAlreadyExists) << refused.status();
    EXPECT_NE(refused.status().message().find("not newer"), std::string::npos) << refused.status();
    EXPECT_EQ(Of(core, 0), before);
  }
  // A newer one from another learner replaces it.
  const std::vector<std::vector<float>> newer = {OnLattice(3), OnLattice(0)};
  auto reply = core.Join(Declaring(1, newer, {7, 0}), kT0);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->rebuild_wanted, std::vector<int>{0});
  ASSERT_TRUE(core.AdoptCopy(Offer(core, 1, 0, 7), newer[0], kT0).ok());
  EXPECT_EQ(core.version(0), 7);
  EXPECT_EQ(core.StatusJson(kT0)["rebuilt"]["adopted"].size(), 2u);
}

// The wait ends early once every learner the run expects has joined declaring its copies and none
// holds a copy newer than the core's: rounds need not wait out --rebuild-wait.
TEST(Rebuild, TheWaitEndsOnceEveryExpectedLearnerHasOffered) {
  SyncerCore core = SmallCore(testing::SmallOptions());
  core.BeginRebuild(kUntil, /*expected_learners=*/2);
  const std::vector<std::vector<float>> a = {OnLattice(0), OnLattice(0)}, b = {OnLattice(1), OnLattice(0)};
  ASSERT_TRUE(core.Join(Declaring(0, a, {5, 0}), kT0).ok());
  ASSERT_TRUE(core.AdoptCopy(Offer(core, 0, 0, 5), a[0], kT0).ok());
  EXPECT_TRUE(core.rebuilding(kT0)) << "one of two learners declared";
  // Learner 1 holds a newer copy: still wanted, so the wait goes on until it is adopted.
  auto reply = core.Join(Declaring(1, b, {6, 0}), kT0);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->rebuild_wanted, std::vector<int>{0});
  EXPECT_TRUE(core.rebuilding(kT0));
  ASSERT_TRUE(core.AdoptCopy(Offer(core, 1, 0, 6), b[0], kT0).ok());
  EXPECT_FALSE(core.rebuilding(kT0)) << "every expected learner offered what it had";
  EXPECT_FALSE(core.StatusJson(kT0)["rebuilt"]["rebuilding"].get<bool>());
  // Without an expected count the wait lasts until its end, whoever joins.
  SyncerCore timed = SmallCore(testing::SmallOptions());
  timed.BeginRebuild(kUntil);
  for (int id : {0, 1, 2}) ASSERT_TRUE(timed.Join(Declaring(id, a, {0, 0}), kT0).ok());
  EXPECT_TRUE(timed.rebuilding(kT0));
  // A learner whose copies are no newer than the core's ends it at its join.
  SyncerCore quick = SmallCore(testing::SmallOptions());
  quick.BeginRebuild(kUntil, 1);
  ASSERT_TRUE(quick.Join(Declaring(0, a, {0, 0}), kT0).ok());
  EXPECT_FALSE(quick.rebuilding(kT0));
}

TEST(Rebuild, InvalidCopiesAreRefusedWithNothingChanged) {
  SyncerCore core = SmallCore(MomentumOptions());
  core.BeginRebuild(kUntil);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> off_lattice = {1.0f + 1e-6f, 0.25f, -2.0f, 3.0f};
  const std::vector<float> not_finite = {nan, 0.25f, -2.0f, 3.0f};
  // Learner 0 declares the off-lattice values for fragment 0, the non-finite ones for fragment 1.
  ASSERT_TRUE(core.Join(Declaring(0, {off_lattice, not_finite}, {4, 4}), kT0).ok());
  const Fingerprint f0 = Of(core, 0), f1 = Of(core, 1);
  struct Case {
    const char* name;
    int learner, fragment;
    int64_t version, n;
    std::vector<float> values;
    StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"off the lattice", 0, 0, 4, 4, off_lattice, StatusCode::kInvalidArgument, "lattice"},
      {"not finite", 0, 1, 4, 4, not_finite, StatusCode::kInvalidArgument, "not finite"},
      {"wrong checksum", 0, 0, 4, 4, OnLattice(0), StatusCode::kInvalidArgument, "checksum"},
      {"wrong size", 0, 0, 4, 3, {1.5f, 0.25f, -2.0f}, StatusCode::kInvalidArgument, "values"},
      {"undeclared version", 0, 0, 6, 4, off_lattice, StatusCode::kInvalidArgument, "declared"},
      {"no such fragment", 0, 2, 4, 4, off_lattice, StatusCode::kInvalidArgument, "no such fragment"},
      {"unknown learner", 9, 0, 4, 4, off_lattice, StatusCode::kNotFound, "not joined"},
  };
  for (const Case& c : cases) {
    auto r = core.AdoptCopy(Offer(core, c.learner, c.fragment, c.version, c.n), c.values, kT0);
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.name << ": " << r.status();
    EXPECT_EQ(Of(core, 0), f0) << c.name;
    EXPECT_EQ(Of(core, 1), f1) << c.name;
  }
  // The same offer sent again (a replay) is refused as one.
  PushHeaderData replay = Offer(core, 0, 0, 4);
  replay.push_seq -= 1;
  EXPECT_EQ(core.AdoptCopy(replay, off_lattice, kT0).status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(core.StatusJson(kT0)["rebuilt"]["adopted"].empty());
}

TEST(Rebuild, ACoreThatIsNotRebuildingRefusesCopies) {
  const std::vector<std::vector<float>> copies = {OnLattice(0), OnLattice(0)};
  SyncerCore plain = SmallCore(testing::SmallOptions());
  auto reply = plain.Join(Declaring(0, copies, {5, 5}), kT0);
  ASSERT_TRUE(reply.ok());
  EXPECT_TRUE(reply->rebuild_wanted.empty());
  const Fingerprint before = Of(plain, 0);
  auto r = plain.AdoptCopy(Offer(plain, 0, 0, 5), copies[0], kT0);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("not rebuilding"), std::string::npos) << r.status();
  EXPECT_EQ(Of(plain, 0), before);
  EXPECT_FALSE(plain.StatusJson(kT0).contains("rebuilt"));
  // After the wait, the same.
  SyncerCore rebuilt = SmallCore(testing::SmallOptions());
  rebuilt.BeginRebuild(kUntil);
  ASSERT_TRUE(rebuilt.Join(Declaring(0, copies, {5, 5}), kT0).ok());
  auto late = rebuilt.AdoptCopy(Offer(rebuilt, 0, 0, 5), copies[0], kUntil);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition) << late.status();
  EXPECT_EQ(rebuilt.version(0), 0);
  EXPECT_FALSE(rebuilt.StatusJson(kUntil)["rebuilt"]["rebuilding"].get<bool>());
}

TEST(Rebuild, PushesAreUnavailableAndNoRoundClosesUntilTheWaitEnds) {
  SyncerCore core = SmallCore(testing::SmallOptions());
  core.BeginRebuild(kUntil);
  ASSERT_TRUE(core.Join(SmallJoin(0), kT0).ok());
  auto push = core.Push(testing::SmallHeader(core, 0, 0, 0), testing::Fp32Values(0.1f), kT0);
  EXPECT_EQ(push.status().code(), StatusCode::kUnavailable) << push.status();
  EXPECT_NE(push.status().message().find("rebuilding"), std::string::npos) << push.status();
  EXPECT_EQ(core.CheckPush(testing::SmallHeader(core, 0, 0, 0), 16, kT0).code(), StatusCode::kUnavailable);
  EXPECT_EQ(core.learners().at(0).pushes_rejected, 0);  // not the learner's fault: never toward a disconnect
  ManualClock clock(kT0);
  EXPECT_TRUE(core.Poll(kT0, clock).empty());
  // Once the wait ended (a join again: the learner rejoins after Unavailable), pushes count again.
  ASSERT_TRUE(core.Join(SmallJoin(0), kUntil).ok());
  auto later = core.Push(testing::SmallHeader(core, 0, 0, 0), testing::Fp32Values(0.1f), kUntil);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_EQ(core.Poll(kUntil, clock).size(), 1u);
}

TEST(Rebuild, ALearnerOfTheEarlierProtocolStillJoinsAndIsAskedForNothing) {
  SyncerCore core = SmallCore(testing::SmallOptions());
  core.BeginRebuild(kUntil);
  JoinRequestData r = SmallJoin(0);
  r.protocol_version = kOldestProtocolVersion;
  r.fragment_checksums = {exchange::ValuesChecksum(OnLattice(0)), exchange::ValuesChecksum(OnLattice(0))};
  auto reply = core.Join(r, kT0);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->rebuild_wanted.empty());
  r.protocol_version = kOldestProtocolVersion - 1;
  EXPECT_EQ(core.Join(r, kT0).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace atl::syncer
