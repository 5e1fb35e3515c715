// Leadership against a real etcd on unix sockets: one leader among candidates, a strictly larger
// epoch for every later leader, the fence of a leader that stops renewing (it stops leading
// before a standby can take over, and never leads again), and the errors of bad setups.
#include "atoll/coord/leadership.h"

#include <gtest/gtest.h>

#include <cmath>

#include "testing/await.h"
#include "testing/etcd.h"

namespace atl::coord {
namespace {

using testing::EtcdServer;
using SteadyTime = std::chrono::steady_clock::time_point;

LeadershipOptions Options(const std::string& endpoints, const std::string& id, double ttl_s = 1) {
  LeadershipOptions o;
  o.endpoints = endpoints;
  o.prefix = "/atoll/run-1/shard-0-of-1";
  o.candidate_id = id;
  o.address = "127.0.0.1:9" + std::to_string(id.size());
  o.lease_ttl_s = ttl_s;
  o.dial_timeout_s = 10;
  return o;
}

class LeadershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = EtcdServer::Start("leadership");
    ASSERT_TRUE(s.ok()) << s.status();
    etcd_ = std::move(*s);
  }
  // TTL 2 s by default: a leader that must keep leading while the test looks has a margin of 1.5 s
  // between renewals (every 250 ms) on a busy machine; the takeover test uses 1 s.
  std::unique_ptr<Leadership> Candidate(const std::string& id, double ttl_s = 2) {
    auto l = Leadership::Start(Options(etcd_->endpoint(), id, ttl_s));
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? std::move(*l) : nullptr;
  }
  std::unique_ptr<EtcdServer> etcd_;
};

// AwaitLeadership on another thread, with the steady-clock time at which it returned.
struct Waiter {
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  StatusOr<uint64_t> result = UnknownError();
  SteadyTime at{};
  std::thread thread;
  void Run(Leadership* l) {
    thread = std::thread([this, l] {
      result = l->AwaitLeadership(stop);
      at = std::chrono::steady_clock::now();
      done = true;
    });
  }
  ~Waiter() {
    stop = true;
    if (thread.joinable()) thread.join();
  }
  static Status UnknownError() { return Status(StatusCode::kUnknown, "not returned"); }
};

TEST_F(LeadershipTest, OneCandidateLeadsAndTheOtherTakesOverWithALargerEpochWhenItResigns) {
  auto a = Candidate("a");
  auto b = Candidate("b");
  ASSERT_TRUE(a && b);
  std::atomic<bool> stop{false};
  auto ea = a->AwaitLeadership(stop);
  ASSERT_TRUE(ea.ok()) << ea.status();
  EXPECT_TRUE(a->Leading());
  EXPECT_EQ(a->epoch(), *ea);
  EXPECT_GT(a->lease_deadline(), std::chrono::steady_clock::now());
  auto value = b->leader_value();
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(*value, "a " + a->options().address);

  Waiter wb;
  wb.Run(b.get());
  // b waits while a leads (a leader holds the key until it resigns or its lease ends).
  ASSERT_TRUE(testing::AwaitFor([&] { return a->Leading(); }, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(wb.done.load());
  EXPECT_FALSE(b->Leading());

  a->Resign();
  EXPECT_FALSE(a->Leading());
  wb.thread.join();
  ASSERT_TRUE(wb.result.ok()) << wb.result.status();
  EXPECT_GT(*wb.result, *ea);
  EXPECT_TRUE(b->Leading());
  auto now_value = b->leader_value();
  ASSERT_TRUE(now_value.ok());
  EXPECT_EQ(*now_value, "b " + b->options().address);
  auto again = a->AwaitLeadership(stop);  // a resigned candidate never leads again
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status();
}

TEST_F(LeadershipTest, ALeaderThatStopsRenewingIsFencedBeforeTheStandbyLeadsAndNeverLeadsAgain) {
  auto a = Candidate("a", 1);
  auto b = Candidate("b", 1);
  ASSERT_TRUE(a && b);
  std::atomic<bool> stop{false};
  auto ea = a->AwaitLeadership(stop);
  ASSERT_TRUE(ea.ok()) << ea.status();
  // Watch a's Leading() from another thread: it may turn false once, never true again.
  std::atomic<bool> watching{true};
  std::atomic<int> reopened{0};
  std::thread watcher([&] {
    bool was_false = false;
    while (watching) {
      const bool leading = a->Leading();
      if (leading && was_false) ++reopened;
      was_false = was_false || !leading;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  Waiter wb;
  wb.Run(b.get());
  a->PauseRenewalForTesting(true);  // a paused process: no more keep-alives
  wb.thread.join();
  ASSERT_TRUE(wb.result.ok()) << wb.result.status();
  EXPECT_GT(*wb.result, *ea);
  // a stopped leading strictly before b began to.
  EXPECT_LT(a->lease_deadline(), wb.at);
  EXPECT_FALSE(a->Leading());
  EXPECT_TRUE(a->Lost());
  EXPECT_FALSE(a->lost_reason().empty());

  a->PauseRenewalForTesting(false);  // the paused process resumes: it stays fenced
  const int64_t old_lease = a->lease_id();
  ASSERT_TRUE(testing::AwaitFor([&] { return !a->Leading(); }, 1));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // a few renew rounds
  EXPECT_FALSE(a->Leading());
  EXPECT_EQ(a->lease_id(), old_lease);
  EXPECT_TRUE(b->Leading());
  auto again = a->AwaitLeadership(stop);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status();
  watching = false;
  watcher.join();
  EXPECT_EQ(reopened.load(), 0);
}

TEST_F(LeadershipTest, AStandbyWhoseLeaseExpiredWhileItWaitedStandsAgainWithANewOne) {
  auto a = Candidate("a");
  auto b = Candidate("b", 1);
  ASSERT_TRUE(a && b);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(a->AwaitLeadership(stop).ok());
  Waiter wb;
  wb.Run(b.get());
  const int64_t first_lease = b->lease_id();
  b->PauseRenewalForTesting(true);
  auto raw = EtcdClient::Connect(etcd_->endpoint(), 10);
  ASSERT_TRUE(raw.ok());
  const std::string b_key = b->options().prefix + "/candidates/b";
  ASSERT_TRUE(testing::AwaitFor(
      [&] {
        auto kv = (*raw)->Get(b_key);
        return kv.ok() && !kv->has_value();
      },
      20, std::chrono::milliseconds(50)));  // b's lease expired with its candidate key
  b->PauseRenewalForTesting(false);
  ASSERT_TRUE(testing::AwaitFor(
      [&] {
        auto kv = (*raw)->Get(b_key);
        return kv.ok() && kv->has_value() && (*kv)->lease != first_lease;
      },
      20, std::chrono::milliseconds(50)));  // registered again under a new lease
  EXPECT_FALSE(wb.done.load());
  a->Resign();
  wb.thread.join();
  ASSERT_TRUE(wb.result.ok()) << wb.result.status();
  EXPECT_TRUE(b->Leading());
  EXPECT_NE(b->lease_id(), first_lease);
}

TEST_F(LeadershipTest, AWaitingCandidateReturnsCancelledWhenStopped) {
  auto a = Candidate("a");
  auto b = Candidate("b");
  ASSERT_TRUE(a && b);
  std::atomic<bool> stop{false};
  ASSERT_TRUE(a->AwaitLeadership(stop).ok());
  Waiter wb;
  wb.Run(b.get());
  wb.stop = true;
  wb.thread.join();
  EXPECT_EQ(wb.result.status().code(), StatusCode::kCancelled) << wb.result.status();
  EXPECT_FALSE(b->Leading());
  EXPECT_TRUE(a->Leading());
}

TEST_F(LeadershipTest, TwoLiveCandidatesWithTheSameIdAreRefused) {
  auto a = Candidate("same");
  ASSERT_TRUE(a);
  auto twin = Leadership::Start(Options(etcd_->endpoint(), "same"));
  ASSERT_FALSE(twin.ok());
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(twin.status().message(),
            "another syncer is running as candidate 'same' for /atoll/run-1/shard-0-of-1 (give each syncer of a shard "
            "its own --candidate-id)");
}

TEST_F(LeadershipTest, ACandidateKeyOfADeadProcessWithTheSameIdIsWaitedOut) {
  auto raw = EtcdClient::Connect(etcd_->endpoint(), 10);
  ASSERT_TRUE(raw.ok());
  auto dead_lease = (*raw)->Grant(1);  // never renewed: the process holding it is gone
  ASSERT_TRUE(dead_lease.ok());
  ASSERT_TRUE((*raw)->PutIfAbsent("/atoll/run-1/shard-0-of-1/candidates/a", "a old", *dead_lease).ok());
  auto a = Candidate("a");
  ASSERT_TRUE(a);
  auto kv = (*raw)->Get("/atoll/run-1/shard-0-of-1/candidates/a");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->lease, a->lease_id());
}

TEST_F(LeadershipTest, ALeaderKeyOfTheSameIdUnderAnotherLeaseIsRefused) {
  auto raw = EtcdClient::Connect(etcd_->endpoint(), 10);
  ASSERT_TRUE(raw.ok());
  auto other = (*raw)->Grant(60);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*raw)->PutIfAbsent("/atoll/run-1/shard-0-of-1/leader", "a 10.0.0.9:1", *other).ok());
  auto a = Candidate("a");
  ASSERT_TRUE(a);
  std::atomic<bool> stop{false};
  auto led = a->AwaitLeadership(stop);
  ASSERT_FALSE(led.ok());
  EXPECT_EQ(led.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(led.status().message().find("another syncer is running as candidate 'a'"), std::string::npos)
      << led.status();
  EXPECT_FALSE(a->Leading());
}

TEST_F(LeadershipTest, TheRunBeganMarkerOutlivesItsLeader) {
  {
    auto a = Candidate("a");
    ASSERT_TRUE(a);
    auto began = a->LatestLeader();
    ASSERT_TRUE(began.ok()) << began.status();
    EXPECT_EQ(*began, "");
    ASSERT_TRUE(a->MarkRunBegan().ok());
  }
  auto b = Candidate("b");
  ASSERT_TRUE(b);
  auto began = b->LatestLeader();
  ASSERT_TRUE(began.ok());
  EXPECT_EQ(*began, "a");  // the marker names the leader that set it
  auto leader = b->leader_value();
  ASSERT_TRUE(leader.ok());
  EXPECT_EQ(*leader, "");  // a resigned when it was destroyed
}

TEST_F(LeadershipTest, OnlyTheLeaderWritesTheReplicaSetAndItOutlivesTheLeader) {
  auto a = Candidate("a");
  auto b = Candidate("b");
  ASSERT_TRUE(a && b);
  // Not leading: refused, nothing written.
  auto refused = b->PutReplicas("{\"leader\":\"b\"}");
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  std::atomic<bool> stop{false};
  ASSERT_TRUE(a->AwaitLeadership(stop).ok());
  EXPECT_EQ(b->PutReplicas("{\"leader\":\"b\"}").code(), StatusCode::kFailedPrecondition);
  auto none = b->Replicas();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, "");
  ASSERT_TRUE(a->PutReplicas("{\"leader\":\"a\"}").ok());
  a->Resign();
  auto kept = b->Replicas();  // for the next leader to read
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "{\"leader\":\"a\"}");
  EXPECT_EQ(a->PutReplicas("{}").code(), StatusCode::kFailedPrecondition);  // resigned
}

TEST(Leadership, AnEtcdThatIsNotThereIsUnavailableWithinTheDialTimeout) {
  LeadershipOptions o = Options("unix:" + testing::ScratchDir("leadership_nowhere") + "/no.sock", "a");
  o.dial_timeout_s = 1;
  auto l = Leadership::Start(o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(l.status().message().find("did not answer within 1 s"), std::string::npos) << l.status();
}

TEST(Leadership, BadOptionsAreRefused) {
  const LeadershipOptions good = Options("127.0.0.1:2379", "a");
  EXPECT_TRUE(ValidateLeadershipOptions(good).ok());
  std::vector<std::pair<LeadershipOptions, std::string>> bad;
  for (double ttl : {0.0, 1.5, 61.0, -1.0, std::nan("")}) {
    bad.push_back({good, "whole seconds"});
    bad.back().first.lease_ttl_s = ttl;
  }
  bad.push_back({good, "dial timeout"});
  bad.back().first.dial_timeout_s = 0;
  bad.push_back({good, "prefix is empty"});
  bad.back().first.prefix = "";
  for (const char* id : {"", "a b", "a/b"}) {
    bad.push_back({good, "candidate id"});
    bad.back().first.candidate_id = id;
  }
  bad.push_back({good, "contains a space"});
  bad.back().first.address = "host 1";
  for (const char* e : {"", "https://etcd:2379", "etcd"}) {
    bad.push_back({good, "etcd"});
    bad.back().first.endpoints = e;
  }
  for (const auto& [o, why] : bad) {
    auto l = Leadership::Start(o);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument) << l.status();
    EXPECT_NE(l.status().message().find(why), std::string::npos) << l.status();
  }
}

}  // namespace
}  // namespace atl::coord
