// FailoverSyncerApi: a shard served by candidates, one leading. Fake candidates (each a SyncerApi
// that answers with its own epoch, or UNAVAILABLE when down) check that the learner's calls find
// the leader by themselves, and that a reply of an older leadership epoch is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "atoll/learner/failover_api.h"

namespace atl {
namespace {

// A candidate: down (UNAVAILABLE), or serving with `epoch` in every reply.
class FakeCandidate final : public syncer::SyncerApi {
 public:
  bool up = false;
  uint64_t epoch = 0;
  int calls = 0;

  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData&) override {
    ATOLL_RETURN_IF_ERROR(Gate());
    syncer::JoinReplyData r;
    r.epoch = epoch;
    return r;
  }
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int, const syncer::LearnerProgress&) override {
    ATOLL_RETURN_IF_ERROR(Gate());
    syncer::HeartbeatReplyData r;
    r.epoch = epoch;
    return r;
  }
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData&, std::span<const std::byte>) override {
    ATOLL_RETURN_IF_ERROR(Gate());
    syncer::PushResult r;
    r.epoch = epoch;
    return r;
  }
  StatusOr<syncer::PullPayload> Pull(int, int, int64_t, double, int64_t) override {
    ATOLL_RETURN_IF_ERROR(Gate());
    syncer::PullPayload r;
    r.epoch = epoch;
    return r;
  }
  Status Leave(int) override { return Gate(); }

 private:
  Status Gate() {
    ++calls;
    return up ? Status::Ok() : UnavailableError("connection refused");
  }
};

TEST(FailoverSyncerApi, CallsFindTheLeaderAfterOneRefusalEach) {
  FakeCandidate a, b, c;
  c.up = true;
  c.epoch = 7;
  learner::FailoverSyncerApi api({&a, &b, &c}, {"a:1", "b:1", "c:1"});
  // Down candidates answer UNAVAILABLE; the learner retries (as its rejoin loop does).
  EXPECT_EQ(api.Join({}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(api.Join({}).status().code(), StatusCode::kUnavailable);
  auto joined = api.Join({});
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined->epoch, 7u);
  EXPECT_EQ(api.current(), 2u);
  // Every kind of call now goes to the leader and nowhere else.
  EXPECT_TRUE(api.Heartbeat(0, {}).ok());
  EXPECT_TRUE(api.Push({}, {}).ok());
  EXPECT_TRUE(api.Pull(0, 0, -1, 0, 0).ok());
  EXPECT_TRUE(api.Leave(0).ok());
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(api.highest_epoch(), 7u);
}

TEST(FailoverSyncerApi, ANewLeaderIsFollowedAndTheFormerOnesRepliesAreRefused) {
  FakeCandidate old_leader, standby;
  old_leader.up = true;
  old_leader.epoch = 5;
  learner::FailoverSyncerApi api({&old_leader, &standby}, {"old:1", "new:1"});
  ASSERT_TRUE(api.Heartbeat(0, {}).ok());
  // The leader is lost; the standby takes over with a larger epoch.
  old_leader.up = false;
  standby.up = true;
  standby.epoch = 9;
  EXPECT_EQ(api.Heartbeat(0, {}).status().code(), StatusCode::kUnavailable);
  auto hb = api.Heartbeat(0, {});
  ASSERT_TRUE(hb.ok()) << hb.status().ToString();
  EXPECT_EQ(api.highest_epoch(), 9u);
  // The old leader comes back (it was paused) and still answers with epoch 5: the learner is sent
  // there only after the new leader fails, and then refuses what it says.
  old_leader.up = true;
  standby.up = false;
  EXPECT_EQ(api.Push({}, {}).status().code(), StatusCode::kUnavailable);  // the new leader is down
  auto stale = api.Pull(0, 0, -1, 0, 0);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(stale.status().message().find("older than epoch 9"), std::string::npos) << stale.status().ToString();
  EXPECT_EQ(api.stale_replies(), 1);
  EXPECT_EQ(api.current(), 1u);  // moved on from the former leader
  standby.up = true;
  EXPECT_TRUE(api.Join({}).ok());
}

TEST(FailoverSyncerApi, FailuresWalkTheRingOfCandidates) {
  FakeCandidate x, y;
  learner::FailoverSyncerApi ring({&x, &y}, {"x", "y"});
  for (int i = 0; i < 5; ++i) (void)ring.Leave(0);
  EXPECT_EQ(ring.current(), 1u);
  EXPECT_EQ(x.calls, 3);
  EXPECT_EQ(y.calls, 2);
}

TEST(FailoverSyncerApi, OneCandidateIsNeverLeftAndOtherErrorsDoNotMoveOn) {
  FakeCandidate only;
  learner::FailoverSyncerApi api({&only}, {"only"});
  EXPECT_FALSE(api.Join({}).ok());
  EXPECT_EQ(api.current(), 0u);
  // A refusal that is not UNAVAILABLE (a bad request) is the leader's answer: stay.
  class Refusing final : public syncer::SyncerApi {
   public:
    StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData&) override {
      return FailedPreconditionError("another model");
    }
    StatusOr<syncer::HeartbeatReplyData> Heartbeat(int, const syncer::LearnerProgress&) override {
      return syncer::HeartbeatReplyData{};
    }
    StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData&, std::span<const std::byte>) override {
      return syncer::PushResult{};
    }
    StatusOr<syncer::PullPayload> Pull(int, int, int64_t, double, int64_t) override { return syncer::PullPayload{}; }
    Status Leave(int) override { return Status::Ok(); }
  } refusing;
  FakeCandidate other;
  learner::FailoverSyncerApi two({&refusing, &other}, {"r", "o"});
  EXPECT_EQ(two.Join({}).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(two.current(), 0u);
}

}  // namespace
}  // namespace atl
