// The WAN shaper on simulated time: bandwidth serialises transfers per direction, latency adds,
// loss and partitions fail calls before they reach the syncer.
#include "atoll/learner/wan_shaper.h"

#include <gtest/gtest.h>

#include <atomic>

#include "atoll/core/sim_clock.h"

namespace atl {
namespace {

// A syncer that answers at once and counts what reached it.
class CountingApi final : public syncer::SyncerApi {
 public:
  StatusOr<syncer::JoinReplyData> Join(const syncer::JoinRequestData&) override {
    ++calls;
    return syncer::JoinReplyData{};
  }
  StatusOr<syncer::HeartbeatReplyData> Heartbeat(int, const syncer::LearnerProgress&) override {
    ++calls;
    return syncer::HeartbeatReplyData{};
  }
  Status Leave(int) override {
    ++calls;
    return Status::Ok();
  }
  StatusOr<syncer::PushResult> Push(const syncer::PushHeaderData&, std::span<const std::byte>) override {
    ++calls;
    return syncer::PushResult{};
  }
  StatusOr<syncer::PullPayload> Pull(int, int, int64_t, double, int64_t) override {
    ++calls;
    syncer::PullPayload p;
    p.bytes.resize(pull_bytes);
    return p;
  }
  std::atomic<int> calls{0};
  size_t pull_bytes = 0;
};

TEST(WanShaper, APushTakesItsBytesOverTheBandwidthPlusTheLatency) {
  SimClock clock;
  CountingApi inner;
  learner::ShaperOptions o;
  o.bandwidth_bps = 8e6;  // 1 MB/s
  o.latency_s = 0.05;
  learner::ShapedSyncerApi link(inner, o, clock);
  std::vector<std::byte> payload(1'000'000 - 96);  // + 96 bytes of header = 1 MB on the wire
  ASSERT_TRUE(link.Push({}, payload).ok());
  EXPECT_EQ(clock.Now(), FromSeconds(1.0) + FromSeconds(0.05));
  EXPECT_EQ(inner.calls.load(), 1);
}

TEST(WanShaper, TransfersInOneDirectionQueueBehindEachOther) {
  SimClock clock;
  CountingApi inner;
  learner::ShaperOptions o;
  o.bandwidth_bps = 8e6;
  learner::ShapedSyncerApi link(inner, o, clock);
  std::vector<std::byte> payload(500'000 - 96);  // 0.5 s each
  std::vector<TimePoint> done(2);
  std::vector<std::thread> threads;
  {
    ClockThread setup(clock);
    for (int i = 0; i < 2; ++i) {
      threads.push_back(StartThread(clock, [&, i] {
        EXPECT_TRUE(link.Push({}, payload).ok());
        done[static_cast<size_t>(i)] = clock.Now();
      }));
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::min(done[0], done[1]), FromSeconds(0.5));
  EXPECT_EQ(std::max(done[0], done[1]), FromSeconds(1.0));
}

TEST(WanShaper, APullPaysForTheBytesThatComeBack) {
  SimClock clock;
  CountingApi inner;
  inner.pull_bytes = 250'000 - 96;
  learner::ShaperOptions o;
  o.bandwidth_bps = 8e6;
  learner::ShapedSyncerApi link(inner, o, clock);
  ASSERT_TRUE(link.Pull(0, 0, 0, 0, -1).ok());
  // 64 bytes up (request), 250 kB down.
  EXPECT_EQ(clock.Now(), FromSeconds(64 * 8 / 8e6) + FromSeconds(0.25));
}

TEST(WanShaper, APartitionOrALossFailsTheCallBeforeItReachesTheSyncer) {
  SimClock clock;
  CountingApi inner;
  learner::ShapedSyncerApi link(inner, {}, clock);
  link.SetPartitioned(true);
  EXPECT_EQ(link.Heartbeat(0, {}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(link.Leave(0).code(), StatusCode::kUnavailable);
  EXPECT_EQ(inner.calls.load(), 0);
  link.SetPartitioned(false);
  EXPECT_TRUE(link.Leave(0).ok());
  EXPECT_EQ(inner.calls.load(), 1);

  learner::ShaperOptions lossy;
  lossy.loss = 1.0;
  link.SetOptions(lossy);
  auto r = link.Join({});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("loss"), std::string::npos) << r.status();
  EXPECT_EQ(inner.calls.load(), 1);
  EXPECT_EQ(link.options().loss, 1.0);
}

TEST(WanShaper, SeededLossDropsTheSameCallsEveryRun) {
  auto dropped = [] {
    SimClock clock;
    CountingApi inner;
    learner::ShaperOptions o;
    o.loss = 0.3;
    o.seed = 42;
    learner::ShapedSyncerApi link(inner, o, clock);
    std::vector<bool> out;
    for (int i = 0; i < 64; ++i) out.push_back(!link.Leave(0).ok());
    return out;
  };
  const auto a = dropped();
  EXPECT_EQ(a, dropped());
  const auto n = std::count(a.begin(), a.end(), true);
  EXPECT_GT(n, 5);
  EXPECT_LT(n, 40);
}

}  // namespace
}  // namespace atl
