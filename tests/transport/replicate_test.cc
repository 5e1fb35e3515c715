// Replicate (docs/decisions/023): a standby follows the leader's commits over gRPC — a snapshot of
// the state folder, then the files each commit rewrote — with the operator's credentials, and a
// syncer that does not lead, or keeps no log, refuses.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "atoll/core/file.h"
#include "atoll/syncer/replication.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc_client.h"
#include "testing/scratch.h"
#include "testing/toy_server.h"

namespace atl {
namespace {

using Server = testing::ToyServer;
using testing::ToyServerOptions;

const std::vector<std::string> kSnapshot = {"eval-start.json", "learners.json", "fragment-000.bin", "meta.json"};

struct Follower {
  std::map<std::string, std::string> files;
  bool snapshot = false;
  transport::ReplicaFileSink Sink() {
    return [this](const syncer::ReplicateBatch& r, const std::string& name, std::string bytes) {
      snapshot = r.snapshot;
      files[name] = std::move(bytes);
      return Status::Ok();
    };
  }
};

// A fragment file larger than one chunk (1 MiB), so files cross chunk boundaries.
std::string BigFile(char seed) {
  std::string s(static_cast<size_t>(2.5 * (1 << 20)), '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(seed + (i * 131) % 251);
  return s;
}

TEST(Replicate, AStandbyGetsASnapshotThenTheFilesOfEachCommit) {
  const std::string dir = testing::ScratchDir("replicate_state");
  ASSERT_TRUE(WriteFileAtomic(dir + "/meta.json", std::string_view("{\"m\":1}")).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/learners.json", std::string_view("l1")).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/fragment-000.bin", std::string_view(BigFile('a'))).ok());
  auto log = std::make_shared<syncer::ReplicationLog>(9, kSnapshot);
  Server s{ToyServerOptions().Replicated({log, dir})};
  auto c = s.Client();
  Follower f;
  auto snap = c->Replicate({"b", 0, -1, 0}, f.Sink());
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_TRUE(snap->snapshot);
  EXPECT_EQ(snap->epoch, 9u);
  EXPECT_EQ(snap->seq, 0);
  // eval-start.json does not exist yet: left out of the snapshot.
  EXPECT_EQ(snap->files, (std::vector<std::string>{"learners.json", "fragment-000.bin", "meta.json"}));
  EXPECT_EQ(f.files["fragment-000.bin"], BigFile('a'));
  EXPECT_EQ(f.files["meta.json"], "{\"m\":1}");

  // A commit rewrites two files; the follower is sent them as they are now.
  ASSERT_TRUE(WriteFileAtomic(dir + "/learners.json", std::string_view("l2")).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/fragment-000.bin", std::string_view(BigFile('b'))).ok());
  log->Append({"learners.json", "fragment-000.bin"});
  f.files.clear();
  auto next = c->Replicate({"b", 9, 0, 1}, f.Sink());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->snapshot);
  EXPECT_EQ(next->seq, 1);
  EXPECT_EQ(f.files.size(), 2u);
  EXPECT_EQ(f.files["learners.json"], "l2");
  EXPECT_EQ(f.files["fragment-000.bin"], BigFile('b'));

  // Its next ask acknowledges commit 1, the latest: it is tracked, and nothing new is sent.
  f.files.clear();
  auto idle = c->Replicate({"b", 9, 1, 0.05}, f.Sink());
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(f.files.empty());
  EXPECT_EQ(log->Tracked(), std::vector<std::string>{"b"});
}

TEST(Replicate, WrongCredentialsASyncerWithoutALogAndAFencedOneAreRefused) {
  const std::string dir = testing::ScratchDir("replicate_refused");
  ASSERT_TRUE(WriteFileAtomic(dir + "/meta.json", std::string_view("{}")).ok());
  auto log = std::make_shared<syncer::ReplicationLog>(3, kSnapshot);
  Follower f;
  {
    Server s{ToyServerOptions().Replicated({log, dir})};
    EXPECT_EQ(s.Client("wrong")->Replicate({"b", 0, -1, 0}, f.Sink()).status().code(), StatusCode::kUnauthenticated);
    EXPECT_EQ(s.Client()->Replicate({"", 0, -1, 0}, f.Sink()).status().code(), StatusCode::kInvalidArgument);
  }
  {
    Server plain{ToyServerOptions()};
    auto r = plain.Client()->Replicate({"b", 0, -1, 0}, f.Sink());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status();
    EXPECT_NE(r.status().message().find("no replication log"), std::string::npos) << r.status();
  }
  {
    std::atomic<bool> leading{false};
    Server fenced{ToyServerOptions().Replicated({log, dir}).Fenced({3, [&leading] { return leading.load(); }})};
    EXPECT_EQ(fenced.Client()->Replicate({"b", 0, -1, 0}, f.Sink()).status().code(), StatusCode::kUnavailable);
  }
  {  // per-learner credentials: a learner's token cannot replicate, the operator's can
    Server s{ToyServerOptions().Secret("run-secret").Replicated({log, dir})};
    auto learner = s.Client(transport::LearnerToken("run-secret", "grpc", 0));
    EXPECT_EQ(learner->Replicate({"b", 0, -1, 0}, f.Sink()).status().code(), StatusCode::kUnauthenticated);
    EXPECT_TRUE(f.files.empty());
    auto op = s.Client(transport::OperatorToken("run-secret", "grpc"));
    EXPECT_TRUE(op->Replicate({"b", 0, -1, 0}, f.Sink()).ok());
    f.files.clear();
  }
  EXPECT_TRUE(f.files.empty());  // nothing reached the follower
  // A snapshot whose meta.json is gone is refused, not sent incomplete.
  std::filesystem::remove(dir + "/meta.json");
  Server s{ToyServerOptions().Replicated({log, dir})};
  EXPECT_EQ(s.Client()->Replicate({"c", 0, -1, 0}, f.Sink()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace atl
