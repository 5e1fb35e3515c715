#include "atoll/syncer/durable_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "atoll/core/file.h"
#include "atoll/exchange/fragment_exchange.h"
#include "toy_cluster.h"

namespace atl::syncer {
namespace {

struct Env {
  std::string dir;
  diloco::FragmentPlan plan = testing::ToyPlan(3);
  SyncerOptions options;
  Env() {
    dir = (std::filesystem::temp_directory_path() / ("atoll_durable_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    options.run_id = "durable";
    options.H = 3;
    options.round.grace = false;
    options.uplink = {diloco::Encoding::kFp32, 64};
    options.downlink = {diloco::Encoding::kFp32, 64};
  }
  ~Env() { std::filesystem::remove_all(dir); }
  SyncerCore Fresh() {
    std::vector<std::vector<float>> init;
    for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.5f);
    auto c = SyncerCore::Create(options, plan, init);
    ATOLL_CHECK(c.ok());
    return std::move(*c);
  }
  // Learner 0 pushes `values` (fp32) for fragment 0 against `base`.
  static Status Push(SyncerCore& core, int64_t base, const std::vector<float>& values) {
    std::vector<std::byte> payload(values.size() * 4);
    std::memcpy(payload.data(), values.data(), payload.size());
    PushHeaderData h{0, 0, base, 100, 2, diloco::Encoding::kFp32, 64, static_cast<int64_t>(values.size()), 0};
    return core.Push(h, payload, TimePoint{}).status();
  }
  // Joins learner 0 and runs `rounds` rounds of fragment 0.
  void Train(SyncerCore& core, int rounds, DurableState* durable) {
    ManualClock clock;
    JoinRequestData r{kProtocolVersion, "durable", diloco::ModelSignature(plan.tensors), 0, "t", true, {}, {}};
    ATOLL_CHECK(core.Join(r, clock.Now()).ok());
    int64_t have = -1;
    for (int i = 0; i < rounds; ++i) {
      auto pulled = core.Pull(0, 0, have);
      ATOLL_CHECK(pulled.ok());
      have = pulled->version;
      ATOLL_CHECK(Push(core, have, std::vector<float>(static_cast<size_t>(plan.fragments[0].numel), 0.01f * (i + 1))).ok());
      for (const auto& rep : core.Poll(clock.Now(), clock)) {
        if (durable) ATOLL_CHECK(durable->SaveFragment(core, rep.fragment).ok());
      }
    }
    if (durable) ATOLL_CHECK(durable->SaveLearners(core).ok());
  }
};

TEST(DurableState, RestoreGivesBackTheCommittedState) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  EXPECT_FALSE(durable.Exists());
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 5, &durable);
  ASSERT_EQ(core.version(0), 5);
  const uint64_t theta_sum = exchange::ValuesChecksum(core.theta(0));

  // "Restart": a fresh core from the initial values, then restore.
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Exists());
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(restarted.versions(), core.versions());
  EXPECT_EQ(restarted.rounds_closed(), 5);
  EXPECT_EQ(exchange::ValuesChecksum(restarted.theta(0)), theta_sum);
  EXPECT_EQ(restarted.learners().at(0).rounds_joined, 5);
  // What each learner had merged, for its rejoin: fragment 0 at version 5, the others never.
  EXPECT_EQ(restarted.learners().at(0).merged_versions, (std::vector<int64_t>{5, -1, -1}));
  // Versions continue from the last committed round.
  env.Train(restarted, 1, nullptr);
  EXPECT_EQ(restarted.version(0), 6);
}

TEST(DurableState, AMergeTheTableRecordsButTheFragmentFileMissesIsNotClaimedAtRestart) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 2, &durable);
  // Killed between the two writes of a commit: the table (written first) holds round 3, the
  // fragment file still round 2.
  env.Train(core, 1, nullptr);
  ASSERT_TRUE(durable.SaveLearners(core).ok());
  ASSERT_EQ(core.learners().at(0).merged_versions[0], 3);
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(restarted.version(0), 2);
  // Version 3 never existed for the restarted syncer: the learner must push that work again.
  EXPECT_EQ(restarted.learners().at(0).merged_versions[0], -1);
}

TEST(DurableState, CorruptionIsDetectedWithAClearErrorAndNothingChanges) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 2, &durable);
  const std::string frag = env.dir + "/fragment-001.bin";
  auto original = ReadFile(frag);
  ASSERT_TRUE(original.ok());

  // A flipped byte in the body.
  std::string flipped = *original;
  flipped[flipped.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(flipped)).ok());
  SyncerCore target = env.Fresh();
  Status st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("fragment-001.bin is corrupted: checksum mismatch"), std::string::npos) << st;
  EXPECT_EQ(target.version(0), 0);  // unchanged, even though fragment 0 was fine

  // A truncated file.
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(original->data(), original->size() - 7)).ok());
  st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st;

  // A corrupted manifest.
  ASSERT_TRUE(WriteFileAtomic(frag, std::string_view(*original)).ok());
  auto meta = ReadFile(env.dir + "/meta.json");
  std::string bad_meta = *meta;
  bad_meta.replace(bad_meta.find("durable"), 7, "durabl3");
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/meta.json", std::string_view(bad_meta)).ok());
  st = durable.Restore(target, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("meta.json is corrupted"), std::string::npos) << st;

  // Intact again: restores.
  ASSERT_TRUE(WriteFileAtomic(env.dir + "/meta.json", std::string_view(*meta)).ok());
  EXPECT_TRUE(durable.Restore(target, TimePoint{}).ok());
  EXPECT_EQ(target.version(0), 2);
}

TEST(DurableState, RefusesTheStateOfAnotherRun) {
  Env env;
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.options.run_id = "other";
  SyncerCore other = env.Fresh();
  Status st = durable.Restore(other, TimePoint{});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("belongs to another run_id"), std::string::npos) << st;
}

// The public copy is committed with Θ_p: after a restart a learner whose copy's checksum matches
// the committed version resumes with deltas; a version older than that (the history is not
// committed) fetches in full once.
TEST(DurableState, ThePublicCopySurvivesARestartAndLearnersResumeWithDeltas) {
  Env env;
  env.options.downlink = {diloco::Encoding::kInt4, 64};  // Φ differs from Θ by the quantisation error
  SyncerCore core = env.Fresh();
  DurableState durable(env.dir);
  ASSERT_TRUE(durable.SaveAll(core).ok());
  env.Train(core, 3, &durable);
  {  // one more round with uneven values, so that the int4 delta below is not exact
    std::vector<float> local(static_cast<size_t>(env.plan.fragments[0].numel));
    for (size_t i = 0; i < local.size(); ++i) local[i] = 0.3f * std::sin(0.7f * static_cast<float>(i));
    ASSERT_TRUE(Env::Push(core, 2, local).ok());
    ManualClock clock;
    for (const auto& rep : core.Poll(TimePoint{}, clock)) ASSERT_TRUE(durable.SaveFragment(core, rep.fragment).ok());
  }
  ASSERT_EQ(core.version(0), 4);
  const std::vector<float> learner_phi(core.public_values(0).begin(), core.public_values(0).end());
  ASSERT_NE(exchange::ValuesChecksum(learner_phi), exchange::ValuesChecksum(core.theta(0)));

  auto rejoin = [&](SyncerCore& c, uint64_t checksum) {
    JoinRequestData r{kProtocolVersion, "durable", diloco::ModelSignature(env.plan.tensors), 0, "t", true, {}, {}};
    r.fragment_checksums = {checksum, 0, 0};
    auto reply = c.Join(r, TimePoint{});
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->fragment_held[0] : int64_t{-2};
  };
  SyncerCore restarted = env.Fresh();
  ASSERT_TRUE(durable.Restore(restarted, TimePoint{}).ok());
  EXPECT_EQ(std::memcmp(restarted.public_values(0).data(), learner_phi.data(), learner_phi.size() * 4), 0);
  // The learner holds version 4: nothing to fetch, and a push against it is accepted.
  EXPECT_EQ(rejoin(restarted, exchange::ValuesChecksum(learner_phi)), 4);
  auto again = restarted.Pull(0, 0, 4);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->not_modified);
  EXPECT_TRUE(Env::Push(restarted, 4, std::vector<float>(learner_phi.size(), 0.01f)).ok());
  // A learner at version 2 is not in the restarted syncer's reach: a full fetch, and a push
  // against version 2 asks for one (Aborted).
  EXPECT_EQ(rejoin(restarted, 12345), -1);
  auto full = restarted.Pull(0, 0, 2);
  ASSERT_TRUE(full.ok());
  EXPECT_FALSE(full->not_modified);
  EXPECT_FALSE(full->is_delta);
  EXPECT_EQ(Env::Push(restarted, 2, std::vector<float>(learner_phi.size(), 0.01f)).code(), StatusCode::kAborted);
}

}  // namespace
}  // namespace atl::syncer
