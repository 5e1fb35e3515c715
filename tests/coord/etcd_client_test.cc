// EtcdClient against a real etcd on unix sockets: endpoints, a dial that fails within its
// timeout, keys, put-if-absent and delete-if-lease transactions, leases and the keep-alive stream.
#include "atoll/coord/etcd_client.h"

#include <gtest/gtest.h>

#include "testing/await.h"
#include "testing/etcd.h"

namespace atl::coord {
namespace {

using testing::EtcdServer;

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = EtcdServer::Start("etcd_client");
    ASSERT_TRUE(s.ok()) << s.status();
    etcd_ = std::move(*s);
    auto c = EtcdClient::Connect(etcd_->endpoint(), 10);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  std::unique_ptr<EtcdServer> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST(EtcdEndpoints, AreParsedIntoGrpcTargets) {
  auto t = ParseEtcdEndpoints("10.0.0.1:2379, http://etcd-b:2379/,unix:///run/etcd.sock,[::1]:2379");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, (std::vector<std::string>{"10.0.0.1:2379", "etcd-b:2379", "unix:/run/etcd.sock", "[::1]:2379"}));
}

TEST(EtcdEndpoints, MalformedOnesAreRefusedWithTheReason) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "no etcd endpoints"},
      {"a:1,,b:2", "empty entry"},
      {"https://etcd:2379", "TLS to etcd is not supported"},
      {"etcd", "want host:port"},
      {"etcd:0", "want host:port"},
      {"etcd:70000", "want host:port"},
      {"etcd:port", "want host:port"},
      {"unix:relative.sock", "absolute path"},
      {"grpc://etcd:1", "unknown scheme"},
  };
  for (const auto& [endpoints, why] : bad) {
    auto t = ParseEtcdEndpoints(endpoints);
    ASSERT_FALSE(t.ok()) << endpoints;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << endpoints;
    EXPECT_NE(t.status().message().find(why), std::string::npos) << t.status();
    auto c = EtcdClient::Connect(endpoints, 1);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << endpoints;
  }
}

TEST(EtcdEndpoints, AnEtcdThatIsNotThereIsUnavailableWithinTheDialTimeout) {
  const std::string nowhere = "unix:" + testing::ScratchDir("etcd_nowhere") + "/no-such.sock";
  auto c = EtcdClient::Connect(nowhere, 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("etcd at " + nowhere + " did not answer within 1 s: "), std::string::npos)
      << c.status();
}

TEST_F(EtcdClientTest, KeysRoundTrip) {
  auto missing = client_->Get("/t/a");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
  ASSERT_TRUE(client_->Put("/t/a", std::string("v\0w", 3)).ok());
  auto got = client_->Get("/t/a");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->key, "/t/a");
  EXPECT_EQ((*got)->value, std::string("v\0w", 3));
  EXPECT_GT((*got)->create_revision, 0);
  EXPECT_EQ((*got)->mod_revision, (*got)->create_revision);
  EXPECT_EQ((*got)->lease, 0);
  ASSERT_TRUE(client_->Put("/t/a", "x").ok());
  auto again = client_->Get("/t/a");
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->create_revision, (*got)->create_revision);
  EXPECT_GT((*again)->mod_revision, (*got)->mod_revision);
  auto deleted = client_->Delete("/t/a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  auto twice = client_->Delete("/t/a");
  ASSERT_TRUE(twice.ok());
  EXPECT_FALSE(*twice);
}

TEST_F(EtcdClientTest, PutIfAbsentCreatesOnceAndOtherwiseReturnsTheKeyAsItIs) {
  auto first = client_->PutIfAbsent("/t/k", "one", 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  auto second = client_->PutIfAbsent("/t/k", "two", 0);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created);
  EXPECT_EQ(second->existing.value, "one");
  EXPECT_EQ(second->existing.create_revision, first->revision);  // the creating transaction's revision
  auto now = client_->Get("/t/k");
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_EQ((*now)->value, "one");
  ASSERT_TRUE(client_->Delete("/t/k").ok());
  auto third = client_->PutIfAbsent("/t/k", "three", 0);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(third->created);
  EXPECT_GT(third->revision, first->revision);
}

TEST_F(EtcdClientTest, DeleteIfLeavesAKeyOfAnotherLease) {
  auto mine = client_->Grant(60);
  auto theirs = client_->Grant(60);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  ASSERT_TRUE(client_->PutIfAbsent("/t/l", "v", *theirs).ok());
  auto foreign = client_->DeleteIf("/t/l", *mine);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  EXPECT_FALSE(*foreign);
  auto still = client_->Get("/t/l");
  ASSERT_TRUE(still.ok() && still->has_value());
  EXPECT_EQ((*still)->lease, *theirs);
  auto own = client_->DeleteIf("/t/l", *theirs);
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(*own);
  auto gone = client_->Get("/t/l");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

TEST_F(EtcdClientTest, PutIfBoundWritesOnlyWhileTheGuardIsBoundToTheLease) {
  auto mine = client_->Grant(60);
  auto theirs = client_->Grant(60);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  // No guard key at all: nothing is written.
  auto none = client_->PutIfBound("/t/set", "a", "/t/guard", *mine);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(*none);
  ASSERT_TRUE(client_->PutIfAbsent("/t/guard", "g", *theirs).ok());
  auto foreign = client_->PutIfBound("/t/set", "b", "/t/guard", *mine);
  ASSERT_TRUE(foreign.ok());
  EXPECT_FALSE(*foreign);
  auto unset = client_->Get("/t/set");
  ASSERT_TRUE(unset.ok());
  EXPECT_FALSE(unset->has_value());
  auto own = client_->PutIfBound("/t/set", "c", "/t/guard", *theirs);
  ASSERT_TRUE(own.ok());
  EXPECT_TRUE(*own);
  auto set = client_->Get("/t/set");
  ASSERT_TRUE(set.ok() && set->has_value());
  EXPECT_EQ((*set)->value, "c");
  EXPECT_EQ((*set)->lease, 0);  // the value outlives the guard's lease
}

TEST_F(EtcdClientTest, ALeaseIsRenewedUntilRevokedAndTakesItsKeysWithIt) {
  int64_t granted = 0;
  auto lease = client_->Grant(1, &granted);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(granted, 1);  // the test etcd's election timeout allows 1 s leases
  ASSERT_TRUE(client_->PutIfAbsent("/t/leased", "v", *lease).ok());
  for (int i = 0; i < 3; ++i) {  // one stream, several round trips
    auto ttl = client_->KeepAliveOnce(*lease);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, 1);
  }
  ASSERT_TRUE(client_->Revoke(*lease).ok());
  auto gone = client_->Get("/t/leased");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  auto after = client_->KeepAliveOnce(*lease);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kNotFound);
  EXPECT_NE(after.status().message().find("not found (expired or revoked)"), std::string::npos) << after.status();
  EXPECT_TRUE(client_->Revoke(*lease).ok());  // revoking a gone lease is fine
}

TEST_F(EtcdClientTest, AKeyCannotBeBoundToALeaseThatDoesNotExist) {
  Status st = client_->Put("/t/x", "v", 0x7eadbeef);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("etcd at " + etcd_->endpoint() + ": Put: "), std::string::npos) << st;
  auto p = client_->PutIfAbsent("/t/x", "v", 0x7eadbeef);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kNotFound) << p.status();
  auto gone = client_->Get("/t/x");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
}

TEST_F(EtcdClientTest, TheKeepAliveStreamIsOpenedAgainAfterEtcdRestarts) {
  auto lease = client_->Grant(30);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->KeepAliveOnce(*lease).ok());
  etcd_->Stop();
  auto down = client_->KeepAliveOnce(*lease, 1);
  ASSERT_FALSE(down.ok());
  EXPECT_NE(down.status().message().find("etcd at "), std::string::npos) << down.status();
  auto get = client_->Get("/t/a");
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable) << get.status();
  ASSERT_TRUE(etcd_->Restart().ok());
  StatusOr<int64_t> ttl = UnavailableError("not tried");
  EXPECT_TRUE(testing::AwaitFor(
      [&] {
        ttl = client_->KeepAliveOnce(*lease, 1);
        return ttl.ok();
      },
      30, std::chrono::milliseconds(100)))
      << ttl.status();
}

}  // namespace
}  // namespace atl::coord
