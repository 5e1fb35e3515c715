// Replicator (docs/decisions/023): the replica set a leader records, and what a commit waits for.
#include "replicator.h"

#include <gtest/gtest.h>

#include <future>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

namespace atl::runtime {
namespace {

TEST(ReplicaSet, ACandidateResumesOnlyFromASetTheLatestLeaderWroteNamingIt) {
  const std::string set = ReplicaSetJson("a", 7, {"b", "c"});
  EXPECT_TRUE(InReplicaSet(set, "a", "b"));
  EXPECT_TRUE(InReplicaSet(set, "a", "c"));
  EXPECT_FALSE(InReplicaSet(set, "a", "d"));  // not in sync
  EXPECT_FALSE(InReplicaSet(set, "e", "b"));  // written by a leader that is not the latest
  EXPECT_FALSE(InReplicaSet("", "a", "b"));   // none written
  EXPECT_FALSE(InReplicaSet("{garbage", "a", "b"));
  EXPECT_FALSE(InReplicaSet("{\"leader\":\"a\",\"in_sync\":\"b\"}", "a", "b"));
  EXPECT_FALSE(InReplicaSet(ReplicaSetJson("a", 7, {}), "a", "b"));
}

// The replica set as etcd would hold it, written by the fake.
struct Etcd {
  std::mutex mu;
  std::vector<std::string> writes;
  bool fail = false;
  Status Put(const std::string& v) {
    std::lock_guard<std::mutex> lock(mu);
    if (fail) return UnavailableError("etcd is down");
    writes.push_back(v);
    return Status::Ok();
  }
  std::vector<std::string> InSync() {
    std::lock_guard<std::mutex> lock(mu);
    if (writes.empty()) return {};
    return nlohmann::json::parse(writes.back())["in_sync"].get<std::vector<std::string>>();
  }
};

struct Leader {
  Etcd etcd;
  bool leading = true;
  std::shared_ptr<syncer::ReplicationLog> log =
      std::make_shared<syncer::ReplicationLog>(5, std::vector<std::string>{"learners.json", "meta.json"});
  Replicator r{log, {"a", 5, 0.05, [this](const std::string& v) { return etcd.Put(v); }, [this] { return leading; }}};
};

TEST(Replicator, TheSetStartsEmptyAndNamesAStandbyOnceItHoldsTheLatestCommit) {
  Leader l;
  ASSERT_TRUE(l.r.Reset().ok());
  ASSERT_EQ(l.etcd.writes.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(l.etcd.writes[0]), nlohmann::json::parse(ReplicaSetJson("a", 5, {})));
  l.r.Committed({"learners.json"});                 // nobody follows yet: nothing to wait for
  ASSERT_TRUE(l.log->Follow({"b", 5, 1, 0}).ok());  // b holds commit 1, the latest
  EXPECT_EQ(l.etcd.InSync(), std::vector<std::string>{"b"});
}

TEST(Replicator, ACommitWaitsForTheStandbyAndDropsOneThatDoesNotAnswerBeforeItReturns) {
  Leader l;
  ASSERT_TRUE(l.r.Reset().ok());
  ASSERT_TRUE(l.log->Follow({"b", 5, 0, 0}).ok());
  ASSERT_EQ(l.etcd.InSync(), std::vector<std::string>{"b"});
  // b acknowledges commit 1 while the commit waits: it stays in the set.
  auto ack = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return l.log->Follow({"b", 5, 1, 0});
  });
  l.r.Committed({"learners.json"});
  ASSERT_TRUE(ack.get().ok());
  EXPECT_EQ(l.etcd.InSync(), std::vector<std::string>{"b"});
  // b is silent on commit 2: dropped, and the set without it is written before Committed returns.
  l.r.Committed({"learners.json"});
  EXPECT_TRUE(l.etcd.InSync().empty());
  const auto stats = l.r.Stats();
  EXPECT_EQ(stats["commits"], 2);
  EXPECT_EQ(stats["dropped"], 1);
  EXPECT_GE(stats["wait_ms_max"].get<double>(), 40.0);  // the 50 ms timeout, less scheduling slack
}

TEST(Replicator, ALeaderThatLostItsLeaseStopsRetryingTheSet) {
  Leader l;
  ASSERT_TRUE(l.r.Reset().ok());
  ASSERT_TRUE(l.log->Follow({"b", 5, 0, 0}).ok());
  l.etcd.fail = true;
  l.leading = false;                 // its server is fenced: nothing is published anyway
  l.r.Committed({"learners.json"});  // returns (b dropped, the set not recorded)
  EXPECT_EQ(l.r.Stats()["dropped"], 1);
  EXPECT_EQ(l.etcd.InSync(), std::vector<std::string>{"b"});
}

}  // namespace
}  // namespace atl::runtime
