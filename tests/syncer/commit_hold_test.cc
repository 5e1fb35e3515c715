// Holding rounds instead of aborting when a commit cannot succeed (issue 32): CommitHeadroom's
// checks — free space through an injected file-system measure (a full disk without root), file
// descriptors through a lowered RLIMIT_NOFILE — the SyncerLoop gate that holds every round while
// they fail, and a round close that throws, which must stop the syncer rather than serve a half
// closed round. Waits are bounded polls, never timing thresholds.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <thread>

#include "atoll/core/file.h"
#include "atoll/syncer/commit_headroom.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/syncer/syncer_loop.h"
#include "testing/small_core.h"
#include "testing/await.h"
#include "testing/scratch.h"

namespace atl::syncer {
namespace {

SyncerCore MakeCore() { return testing::SmallCore(testing::SmallOptions()); }
JoinRequestData Req(int id) { return testing::SmallJoin(id); }
PushHeaderData Header(int id, int p, int64_t base) { return testing::SmallHeader(id, p, base); }
std::vector<std::byte> Fp32(float v) { return testing::Fp32Values(v); }

// At most 30 s (the bound of the test, not a threshold).
bool Eventually(const std::function<bool()>& done) {
  return testing::AwaitFor(done, 30.0, std::chrono::milliseconds(5));
}

// The version of fragment 0 on disk, read back through a restore.
int64_t CommittedVersion(const std::string& dir) {
  SyncerCore fresh = MakeCore();
  DurableState state(dir);
  if (!state.Restore(fresh, TimePoint{}).ok()) return -1;
  return fresh.version(0);
}

TEST(CommitHold, AFullDiskHoldsRoundsUntilThereIsRoomAndNoLearnerSeesAnUncommittedVersion) {
  const std::string dir = testing::ScratchDir("commit-hold-disk");
  DurableState state(dir);
  ASSERT_TRUE(state.SaveAll(MakeCore()).ok());
  std::atomic<uint64_t> free_bytes{100};  // a full disk
  CommitHeadroom headroom(dir, CommitBytes(testing::SmallStridedPlan(), 1 << 20), 4,
                          [&](const std::string&) -> StatusOr<uint64_t> { return free_bytes.load(); });
  std::atomic<int> commits{0};
  RealClock clock;
  SyncerLoop loop(
      MakeCore(), clock,
      [&](const SyncerCore& core, const RoundReport& r) {
        ATOLL_CHECK(state.SaveFragment(core, r.fragment).ok());
        ++commits;
      },
      std::chrono::milliseconds(5), [&](const SyncerCore&) { return headroom.Check(); });
  ASSERT_TRUE(loop.Join(Req(0)).ok());
  ASSERT_TRUE(loop.Pull(0, 0, -1, 0, -1).ok());
  auto pushed = loop.Push(Header(0, 0, 0), Fp32(0.5f));
  ASSERT_TRUE(pushed.ok()) << pushed.status() << ": pushes still join the open round";
  ASSERT_TRUE(Eventually([&] { return !loop.holding().empty(); }));
  EXPECT_NE(loop.holding().find("free in " + dir), std::string::npos) << loop.holding();
  // Many ticks later: still held, nothing closed, nothing new to see, the loop answers.
  for (int i = 0; i < 20; ++i) {
    auto pull = loop.Pull(0, 0, 0, 0.01, -1);
    ASSERT_TRUE(pull.ok()) << pull.status();
    EXPECT_TRUE(pull->not_modified) << "a learner is served the last committed state";
  }
  EXPECT_EQ(loop.Call([](SyncerCore& c, TimePoint) { return c.version(0); }), 0);
  EXPECT_EQ(commits.load(), 0);
  EXPECT_EQ(CommittedVersion(dir), 0);
  EXPECT_TRUE(loop.Heartbeat(0, LearnerProgress{}).ok());
  // Room again: the held round closes, is committed, then seen.
  free_bytes = uint64_t{1} << 40;
  ASSERT_TRUE(Eventually([&] { return loop.Call([](SyncerCore& c, TimePoint) { return c.version(0); }) == 1; }));
  EXPECT_EQ(commits.load(), 1);
  EXPECT_TRUE(loop.holding().empty());
  auto pull = loop.Pull(0, 0, 0, 0, -1);
  ASSERT_TRUE(pull.ok());
  EXPECT_EQ(pull->version, 1);
  EXPECT_EQ(CommittedVersion(dir), 1) << "what a learner sees is on disk";
  loop.Stop();
  std::filesystem::remove_all(dir);
}

// Descriptors exhausted by anything else in the process (connections, in the syncer): the
// reserve lets a commit through; when even the reserve cannot be taken back, rounds are held.
TEST(CommitHold, TheDescriptorReserveLetsACommitThroughAndItsLossHoldsRounds) {
  const std::string dir = testing::ScratchDir("commit-hold-fds");
  DurableState state(dir);
  SyncerCore core = MakeCore();
  ASSERT_TRUE(state.SaveAll(core).ok());
  CommitHeadroom headroom(dir, 0, 8);
  ASSERT_EQ(headroom.reserved(), 8);
  ASSERT_TRUE(headroom.Check().ok());
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::vector<int> fillers;  // everything else takes every descriptor left
  for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  const Status starved = state.SaveFragment(core, 0);
  Status with_reserve;
  {
    const auto released = headroom.ReleaseForCommit();
    with_reserve = state.SaveFragment(core, 0);
  }
  const int reserved_after = headroom.reserved();
  // Something else grabs the reserve's descriptors while a commit has them released.
  Status held;
  {
    const auto released = headroom.ReleaseForCommit();
    for (int fd; (fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) fillers.push_back(fd);
  }
  held = headroom.Check();
  for (int fd : fillers) ::close(fd);
  const Status recovered = headroom.Check();
  ::setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_EQ(starved.code(), StatusCode::kUnavailable) << starved;
  EXPECT_TRUE(with_reserve.ok()) << with_reserve;
  EXPECT_EQ(reserved_after, 8) << "taken back after the commit";
  EXPECT_EQ(held.code(), StatusCode::kResourceExhausted) << held;
  EXPECT_NE(held.message().find("out of file descriptors: 0 of the 8"), std::string::npos) << held;
  EXPECT_TRUE(recovered.ok()) << recovered;
  std::filesystem::remove_all(dir);
}

TEST(CommitHold, CommitBytesAndTheFileSystemMeasure) {
  const diloco::FragmentPlan plan = testing::SmallStridedPlan();  // fragments of 4 values
  EXPECT_EQ(CommitBytes(plan, 1000), 64 + 3 * 4 * 4 + 4 + 1000u);
  auto free = CommitHeadroom::FileSystemFreeBytes(::testing::TempDir());
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_GT(*free, 0u);
  EXPECT_EQ(CommitHeadroom::FileSystemFreeBytes("/nonexistent/atoll").status().code(), StatusCode::kUnavailable);
  CommitHeadroom missing("/nonexistent/atoll", 1, 1);
  EXPECT_EQ(missing.Check().code(), StatusCode::kUnavailable) << "cannot measure: held, not guessed";
}

// Issue 32: `Guarded("round close")` swallowed an exception out of closing a round, after the
// version was counted and before it was committed, and the loop served it.
TEST(CommitHoldDeathTest, AnExceptionWhileClosingARoundStopsTheSyncerInsteadOfServingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        RealClock clock;
        SyncerLoop loop(
            MakeCore(), clock,
            [](const SyncerCore&, const RoundReport&) { throw std::runtime_error("the disk caught fire"); },
            std::chrono::milliseconds(5));
        ATOLL_CHECK(loop.Join(Req(0)).ok());
        ATOLL_CHECK(loop.Pull(0, 0, -1, 0, -1).ok());
        ATOLL_CHECK(loop.Push(Header(0, 0, 0), Fp32(0.5f)).ok());
        for (;;) (void)loop.Pull(0, 0, 0, 1.0, -1);  // until the loop dies
      },
      "a round close or its commit threw \\(the disk caught fire\\)");
}

}  // namespace
}  // namespace atl::syncer
