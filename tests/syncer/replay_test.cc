// Replays refused (docs/decisions/019): every push carries the push session of its learner's latest
// join and a sequence number above every one the syncer judged in it. A captured push sent again
// is refused and counted nowhere (no merge, no tokens, no disconnect); a session ends with the
// learner's next join and with the syncer process.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <unistd.h>

#include "atoll/core/clock.h"
#include "atoll/syncer/durable_state.h"
#include "testing/small_core.h"

namespace atl::syncer {
namespace {

using testing::Fp32Values;
using testing::SmallCore;
using testing::SmallHeader;
using testing::SmallJoin;
using testing::SmallOptions;

class Replay : public ::testing::Test {
 protected:
  Replay() : core_(SmallCore(SmallOptions())) {
    for (int id = 0; id < 2; ++id) {
      auto j = core_.Join(SmallJoin(id), clock_.Now());
      EXPECT_TRUE(j.ok());
      EXPECT_NE(j->push_session, 0u);
    }
  }
  StatusOr<PushResult> Push(const PushHeaderData& h) {
    auto r = core_.Push(h, Fp32Values(0.01f), clock_.Now());
    core_.Poll(clock_.Now(), clock_);
    return r;
  }

  ManualClock clock_;
  SyncerCore core_;
};

TEST_F(Replay, ACapturedPushSentAgainIsRefusedAndNeverCounted) {
  const PushHeaderData captured = SmallHeader(core_, 0, 0, core_.version(0));
  ASSERT_TRUE(Push(captured).ok());
  const int64_t rounds = core_.rounds_closed();
  const double tokens = core_.tokens_merged();
  // The transport's check before it reads a payload refuses it too, and changes nothing.
  EXPECT_EQ(core_.CheckPush(captured, 16, clock_.Now()).code(), StatusCode::kAlreadyExists);
  for (int i = 0; i < 20; ++i) {  // more than the 8 invalid pushes in a row that disconnect a learner
    auto again = Push(captured);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
    EXPECT_NE(again.status().message().find("a replay, refused"), std::string::npos) << again.status();
  }
  EXPECT_EQ(core_.rounds_closed(), rounds);
  EXPECT_EQ(core_.tokens_merged(), tokens);
  const LearnerRecord& l = core_.learners().at(0);
  EXPECT_EQ(l.pushes, 1);
  EXPECT_EQ(l.replays_refused, 20);
  EXPECT_EQ(l.pushes_rejected, 0);
  EXPECT_EQ(l.consecutive_rejects, 0);
  // Its learner is not disconnected for what someone else replayed: its next push is merged.
  EXPECT_TRUE(Push(SmallHeader(core_, 0, 0, core_.version(0))).ok());
  EXPECT_EQ(core_.rounds_closed(), rounds + 1);
}

TEST_F(Replay, AnOlderNumberOfTheSessionIsAReplayToo) {
  PushHeaderData first = SmallHeader(core_, 1, 0, core_.version(0));
  PushHeaderData later = first;
  later.push_seq = first.push_seq + 5;  // numbers may skip (pushes refused before the syncer saw them)
  ASSERT_TRUE(Push(later).ok());
  first.base_version = core_.version(0);
  EXPECT_EQ(Push(first).status().code(), StatusCode::kAlreadyExists);
}

TEST_F(Replay, APushOfAnEarlierSessionIsRefusedAfterTheLearnerJoinsAgain) {
  const PushHeaderData before = SmallHeader(core_, 0, 0, core_.version(0));
  ASSERT_TRUE(Push(before).ok());
  JoinRequestData again = SmallJoin(0);
  again.rejoin = true;
  auto j = core_.Join(again, clock_.Now());
  ASSERT_TRUE(j.ok());
  EXPECT_NE(j->push_session, before.push_session);
  PushHeaderData replayed = before;
  replayed.push_seq += 100;  // a number never used in that session does not help
  replayed.base_version = core_.version(0);
  auto r = Push(replayed);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("join again first"), std::string::npos) << r.status();
  // The new session starts its numbers afresh.
  PushHeaderData fresh = SmallHeader(core_, 0, 0, core_.version(0));
  EXPECT_EQ(fresh.push_seq, 1u);
  EXPECT_TRUE(Push(fresh).ok());
}

TEST_F(Replay, ARefusedPushSpendsItsNumberSoThatItIsNeverAcceptedLater) {
  // Refused for want of room in the open rounds: sent again once there is room, it would be
  // merged next to the work its learner pushes again. It is refused as a replay instead.
  SyncerOptions o = SmallOptions();
  o.max_pending_bytes = 1;
  SyncerCore core = SmallCore(o);
  ASSERT_TRUE(core.Join(SmallJoin(0), clock_.Now()).ok());
  const PushHeaderData h = SmallHeader(core, 0, 0, 0);
  EXPECT_EQ(core.Push(h, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(core.Push(h, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kAlreadyExists);
  // A header refused as malformed spends its number too.
  PushHeaderData bad = SmallHeader(core, 0, 0, 0);
  bad.c_steps = -1;
  EXPECT_EQ(core.Push(bad, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kInvalidArgument);
  bad.c_steps = 1;
  EXPECT_EQ(core.Push(bad, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(core.learners().at(0).replays_refused, 2);
}

TEST_F(Replay, ARestartedSyncerRefusesEveryEarlierSessionUntilTheLearnerJoinsIt) {
  const PushHeaderData before = SmallHeader(core_, 0, 0, core_.version(0));
  ASSERT_TRUE(Push(before).ok());
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("atoll-replay-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  DurableState state(dir);
  ASSERT_TRUE(state.SaveAll(core_).ok());
  SyncerOptions o = SmallOptions();
  o.incarnation = 7;  // a new process
  SyncerCore restarted = SmallCore(o);
  ASSERT_TRUE(state.Restore(restarted, clock_.Now()).ok());
  std::filesystem::remove_all(dir);
  PushHeaderData replayed = before;
  replayed.push_seq += 1;
  replayed.base_version = restarted.version(0);
  EXPECT_EQ(restarted.Push(replayed, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kNotFound);
  JoinRequestData again = SmallJoin(0);
  again.rejoin = true;
  auto j = restarted.Join(again, clock_.Now());
  ASSERT_TRUE(j.ok());
  EXPECT_NE(j->push_session, before.push_session);
  EXPECT_EQ(restarted.Push(replayed, Fp32Values(0.01f), clock_.Now()).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(restarted.Push(SmallHeader(restarted, 0, 0, restarted.version(0)), Fp32Values(0.01f), clock_.Now()).ok());
}

TEST(ReplaySessions, EveryJoinOfEveryProcessGetsItsOwnSession) {
  std::set<uint64_t> seen;
  for (uint64_t incarnation : {1u, 2u}) {
    SyncerOptions o = SmallOptions();
    o.incarnation = incarnation;
    SyncerCore core = SmallCore(o);
    ManualClock clock;
    for (int i = 0; i < 20; ++i) {
      JoinRequestData r = SmallJoin(i % 3);
      r.rejoin = true;
      auto j = core.Join(r, clock.Now());
      ASSERT_TRUE(j.ok());
      EXPECT_TRUE(seen.insert(j->push_session).second) << "session reused: " << j->push_session;
    }
  }
}

}  // namespace
}  // namespace atl::syncer
