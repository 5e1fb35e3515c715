// ReplicationLog: what a standby is sent, when it is tracked, and what a commit waits for.
#include "atoll/syncer/replication.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <thread>

namespace atl::syncer {
namespace {

using std::chrono::milliseconds;

const std::vector<std::string> kAll = {"fragment-000.bin", "fragment-001.bin", "learners.json", "meta.json"};

ReplicateAsk Ask(const std::string& who, uint64_t epoch, int64_t applied, double wait = 0) {
  return {who, epoch, applied, wait};
}

TEST(ReplicationLog, AFollowerWithNothingGetsASnapshotAtTheLatestCommit) {
  ReplicationLog log(7, kAll);
  log.Append({"learners.json", "fragment-001.bin"});
  auto b = log.Follow(Ask("b", 0, -1));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->snapshot);
  EXPECT_EQ(b->epoch, 7u);
  EXPECT_EQ(b->seq, 1);
  EXPECT_EQ(b->files, kAll);
  EXPECT_TRUE(log.Tracked().empty());  // not until it acknowledges the latest commit
}

TEST(ReplicationLog, AFollowerOfAnotherEpochOrBeyondTheLogGetsASnapshot) {
  ReplicationLog log(7, kAll);
  log.Append({"learners.json"});
  EXPECT_TRUE(log.Follow(Ask("b", 6, 1))->snapshot);  // its files came from an earlier leader
  EXPECT_TRUE(log.Follow(Ask("b", 7, 5))->snapshot);  // claims commits this leader never made
}

TEST(ReplicationLog, AFollowerIsSentTheFilesOfEveryCommitItLacksOnceEach) {
  ReplicationLog log(3, kAll);
  log.Append({"learners.json", "fragment-000.bin"});
  log.Append({"learners.json", "fragment-001.bin"});
  log.Append({"learners.json", "fragment-000.bin"});
  auto b = log.Follow(Ask("b", 3, 1));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->snapshot);
  EXPECT_EQ(b->seq, 3);
  EXPECT_EQ(b->files, (std::vector<std::string>{"learners.json", "fragment-001.bin", "fragment-000.bin"}));
}

TEST(ReplicationLog, AFollowerFurtherBehindThanTheLogRemembersGetsASnapshot) {
  ReplicationLog log(3, kAll, /*keep=*/2);
  for (int i = 0; i < 5; ++i) log.Append({"learners.json"});
  EXPECT_TRUE(log.Follow(Ask("b", 3, 2))->snapshot);   // commit 3 is forgotten
  EXPECT_FALSE(log.Follow(Ask("b", 3, 3))->snapshot);  // 4 and 5 are remembered
}

TEST(ReplicationLog, AFollowerThatHoldsTheLatestCommitIsTrackedAndCommitsWaitForIt) {
  ReplicationLog log(3, kAll);
  int grew = 0;
  log.OnTrackedGrew([&] { ++grew; });
  log.Append({"learners.json"});
  ASSERT_TRUE(log.Follow(Ask("b", 3, 1)).ok());
  EXPECT_EQ(log.Tracked(), std::vector<std::string>{"b"});
  EXPECT_EQ(grew, 1);
  const int64_t seq = log.Append({"fragment-000.bin"});
  // The commit waits for b's acknowledgement, which its next ask carries.
  auto waited = std::async(std::launch::async, [&] { return log.AwaitFollowers(seq, milliseconds(5000)); });
  EXPECT_EQ(waited.wait_for(milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(log.Follow(Ask("b", 3, seq)).ok());
  EXPECT_TRUE(waited.get().empty());
  EXPECT_EQ(log.Tracked(), std::vector<std::string>{"b"});
}

TEST(ReplicationLog, ATrackedFollowerThatDoesNotAcknowledgeIsDroppedAndWaitedForAgainLater) {
  ReplicationLog log(3, kAll, 4096, /*retry_after=*/milliseconds(100));
  ASSERT_TRUE(log.Follow(Ask("b", 3, 0)).ok());  // an empty log: 0 is the latest
  ASSERT_EQ(log.Tracked().size(), 1u);
  const uint64_t gen = log.tracked_generation();
  const int64_t seq = log.Append({"learners.json"});
  EXPECT_EQ(log.AwaitFollowers(seq, milliseconds(20)), std::vector<std::string>{"b"});
  EXPECT_TRUE(log.Tracked().empty());
  EXPECT_NE(log.tracked_generation(), gen);
  EXPECT_EQ(log.followers().at("b").drops, 1);
  // Without followers waited for, a commit waits for nobody — b's catching up included, for a while.
  ASSERT_TRUE(log.Follow(Ask("b", 3, log.latest())).ok());
  EXPECT_TRUE(log.Tracked().empty());
  EXPECT_TRUE(log.AwaitFollowers(log.Append({"learners.json"}), milliseconds(0)).empty());
  // After retry_after it is waited for again, and in sync once it holds the latest commit.
  std::this_thread::sleep_for(milliseconds(120));
  ASSERT_TRUE(log.Follow(Ask("b", 3, log.latest())).ok());
  EXPECT_EQ(log.Tracked().size(), 1u);
}

TEST(ReplicationLog, AFollowerALittleBehindIsWaitedForAndInSyncOnceItHoldsWhatWasPublishedBefore) {
  ReplicationLog log(3, kAll);
  for (int i = 0; i < 5; ++i) log.Append({"learners.json"});
  // Three commits behind: not in sync, but every commit from now on waits for it (a leader that
  // commits faster than it follows would otherwise leave it behind for good).
  ASSERT_TRUE(log.Follow(Ask("b", 3, 2)).ok());
  EXPECT_TRUE(log.Tracked().empty());
  EXPECT_TRUE(log.followers().at("b").waited);
  const int64_t seq = log.Append({"fragment-000.bin"});
  auto waited = std::async(std::launch::async, [&] { return log.AwaitFollowers(seq, milliseconds(5000)); });
  EXPECT_EQ(waited.wait_for(milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(log.Follow(Ask("b", 3, seq)).ok());  // it holds commits 1-6: every one published
  EXPECT_TRUE(waited.get().empty());
  EXPECT_EQ(log.Tracked(), std::vector<std::string>{"b"});
}

TEST(ReplicationLog, AFollowerFarBehindIsNotWaitedFor) {
  ReplicationLog log(3, kAll);
  for (int i = 0; i < 3 + ReplicationLog::kCatchUpLag; ++i) log.Append({"learners.json"});
  ASSERT_TRUE(log.Follow(Ask("b", 3, 2)).ok());
  EXPECT_FALSE(log.followers().at("b").waited);
  EXPECT_TRUE(log.AwaitFollowers(log.Append({"learners.json"}), milliseconds(0)).empty());
}

TEST(ReplicationLog, ATrackedFollowerThatAsksForASnapshotIsNoLongerTracked) {
  ReplicationLog log(3, kAll);
  ASSERT_TRUE(log.Follow(Ask("b", 3, 0)).ok());
  ASSERT_EQ(log.Tracked().size(), 1u);
  EXPECT_TRUE(log.Follow(Ask("b", 0, -1))->snapshot);  // restarted with nothing
  EXPECT_TRUE(log.Tracked().empty());
}

TEST(ReplicationLog, AFollowerWithEverythingWaitsForTheNextCommit) {
  ReplicationLog log(3, kAll);
  log.Append({"learners.json"});
  auto none = log.Follow(Ask("b", 3, 1, /*wait=*/0.01));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->seq, 1);
  EXPECT_TRUE(none->files.empty());
  auto next = std::async(std::launch::async, [&] { return log.Follow(Ask("b", 3, 1, 5)); });
  std::this_thread::sleep_for(milliseconds(20));
  log.Append({"fragment-001.bin"});
  auto b = next.get();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->seq, 2);
  EXPECT_EQ(b->files, std::vector<std::string>{"fragment-001.bin"});
}

TEST(ReplicationLog, CloseEndsAWaitingFollow) {
  ReplicationLog log(3, kAll);
  auto waiting = std::async(std::launch::async, [&] { return log.Follow(Ask("b", 3, 0, 10)); });
  std::this_thread::sleep_for(milliseconds(20));
  log.Close();
  EXPECT_EQ(waiting.wait_for(milliseconds(2000)), std::future_status::ready);
}

TEST(ReplicationLog, BadAsksAreRefused) {
  ReplicationLog log(3, kAll);
  EXPECT_EQ(log.Follow(Ask("", 3, 0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Follow(Ask("b", 3, 0, -1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(log.Follow(Ask("b", 3, 0, std::nan(""))).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(log.followers().empty());  // nothing recorded
}

}  // namespace
}  // namespace atl::syncer
