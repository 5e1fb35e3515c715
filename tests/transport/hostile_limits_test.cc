// Denial of service with and without a credential against the real gRPC server on 127.0.0.1
// (issue 32): push streams that never send and long polls held by one learner's credential
// (300 of each once took every handler thread), a push whose token is checked only after its
// first read, malformed push headers that never counted toward a disconnect, heartbeat floods,
// revoked learners, and thousands of idle connections that exhausted the descriptors a commit
// needs. Each test asserts an honest learner is still served. Waits are bounded, never thresholds.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include <grpcpp/grpcpp.h>

#include "atoll.grpc.pb.h"
#include "atoll/syncer/durable_state.h"
#include "atoll/transport/credentials.h"
#include "testing/toy_server.h"
#include "testing/scratch.h"
#include "testing/await.h"

namespace atl {
namespace {

using Server = testing::ToyServer;
using testing::ToyServerOptions;
constexpr const char* kSecret = "run-secret-0123456789";

std::string Token(int id) { return transport::LearnerToken(kSecret, "grpc", id); }

std::unique_ptr<atl::v1::Syncer::Stub> Stub(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own (streams per connection are capped)
  return atl::v1::Syncer::NewStub(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
}

// Many calls of one learner started at once on a completion queue and left open: how many the
// server refused at once (RESOURCE_EXHAUSTED), the rest held until Cancel().
class HeldCalls {
 public:
  HeldCalls(const std::string& target, int channels) {
    for (int i = 0; i < channels; ++i) stubs_.push_back(Stub(target));
  }
  ~HeldCalls() { Cancel(); }
  void Push(int learner, const std::string& token) {
    auto c = NewCall(token);
    c->ctx.AddMetadata("x-atoll-learner", std::to_string(learner));
    c->push = stubs_[calls_.size() % stubs_.size()]->PrepareAsyncPush(&c->ctx, &c->push_reply, &cq_);
    c->push->StartCall(nullptr);
    c->push->Finish(&c->status, c.get());
    calls_.push_back(std::move(c));
  }
  void Pull(int learner, const std::string& token, int64_t have) {
    auto c = NewCall(token);
    c->pull_request.set_learner_id(learner);
    c->pull_request.set_fragment(0);
    c->pull_request.set_have_version(have);
    c->pull_request.set_want_version(-1);
    c->pull_request.set_wait_seconds(60);
    c->pull = stubs_[calls_.size() % stubs_.size()]->PrepareAsyncPull(&c->ctx, c->pull_request, &cq_);
    c->pull->StartCall(nullptr);
    c->pull->Finish(&c->status, c.get());
    calls_.push_back(std::move(c));
  }
  // Waits (bounded: 60 s) until `n` calls have ended; counts them by code.
  int WaitEnded(size_t n) {
    const auto bound = std::chrono::system_clock::now() + std::chrono::seconds(60);
    while (ended_ < n) {
      void* tag = nullptr;
      bool ok = false;
      const auto r = cq_.AsyncNext(&tag, &ok, bound);
      if (r != grpc::CompletionQueue::GOT_EVENT) break;
      if (tag == nullptr) continue;  // a StartCall
      auto* c = static_cast<Call*>(tag);
      ++ended_;
      if (c->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused_;
    }
    return static_cast<int>(ended_);
  }
  int refused() const { return refused_; }
  void Cancel() {
    if (cancelled_) return;
    cancelled_ = true;
    for (auto& c : calls_) c->ctx.TryCancel();
    WaitEnded(calls_.size());
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

 private:
  struct Call {
    grpc::ClientContext ctx;
    grpc::Status status;
    atl::v1::PushReply push_reply;
    atl::v1::PullRequest pull_request;
    std::unique_ptr<grpc::ClientAsyncWriter<atl::v1::PushChunk>> push;
    std::unique_ptr<grpc::ClientAsyncReader<atl::v1::PullChunk>> pull;
  };
  std::unique_ptr<Call> NewCall(const std::string& token) {
    auto c = std::make_unique<Call>();
    c->ctx.AddMetadata("x-atoll-token", token);
    return c;
  }
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<atl::v1::Syncer::Stub>> stubs_;
  std::vector<std::unique_ptr<Call>> calls_;
  size_t ended_ = 0;
  int refused_ = 0;
  bool cancelled_ = false;
};

// Learner `id` with its own token joins, takes the fragment, pushes, long-polls and heartbeats.
void ExpectAnHonestLearnerIsServed(Server& s, int id) {
  auto c = s.Client(Token(id));
  ASSERT_TRUE(c->Join(s.Join(id)).ok());
  auto full = c->Pull(id, 0, -1, 0, -1);
  ASSERT_TRUE(full.ok()) << full.status();
  std::vector<float> delta(static_cast<size_t>(s.plan.fragments[0].numel), 0.01f);
  std::vector<std::byte> payload;
  ASSERT_TRUE(diloco::Encode({diloco::Encoding::kInt4, 64}, delta, payload).ok());
  auto header = s.Header(id);
  header.base_version = full->version;
  auto pushed = c->Push(header, payload);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  auto polled = c->Pull(id, 0, full->version, 0.2, -1);
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_TRUE(c->Heartbeat(id, syncer::LearnerProgress{}).ok());
  ASSERT_TRUE(s.Client(transport::OperatorToken(kSecret, "grpc"))->StatusJson().ok());
}

// Issue 32: 300 silent push streams and 300 long polls from one learner's credential gave every
// client "Server Threadpool Exhausted". Now 4 of each are admitted and the rest refused at once.
TEST(HostileGrpc, SilentPushesAndLongPollsOfOneLearnerCannotStarveTheOthers) {
  Server s(ToyServerOptions().Secret(kSecret));
  auto attacker = s.Client(Token(7));
  ASSERT_TRUE(attacker->Join(s.Join(7)).ok());
  auto held = attacker->Pull(7, 0, -1, 0, -1);
  ASSERT_TRUE(held.ok());
  HeldCalls calls(s.target, 10);
  for (int i = 0; i < 300; ++i) calls.Push(7, Token(7));
  for (int i = 0; i < 300; ++i) calls.Pull(7, Token(7), held->version);
  EXPECT_EQ(calls.WaitEnded(592), 592) << "all but 4 of each refused at once";
  EXPECT_EQ(calls.refused(), 592);
  ExpectAnHonestLearnerIsServed(s, 0);
  ExpectAnHonestLearnerIsServed(s, 1);
  // The attacker's next push is refused before anything is read.
  std::vector<std::byte> payload(diloco::EncodedSize({diloco::Encoding::kInt4, 64}, 256));
  auto refused = attacker->Push(s.Header(7), payload);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("already has 4 pushes in flight"), std::string::npos) << refused.status();
  calls.Cancel();
  EXPECT_TRUE(attacker->Push(s.Header(7), payload).status().code() != StatusCode::kResourceExhausted)
      << "its slots are free again once its calls end";
}

// A push that never sends holds its slot only until the push deadline.
TEST(HostileGrpc, ASilentPushIsCancelledAtThePushDeadline) {
  transport::ServerLimits limits;
  limits.push_timeout_ms = 300;
  Server s(ToyServerOptions().Limits(limits).Secret(kSecret));
  ASSERT_TRUE(s.Client(Token(3))->Join(s.Join(3)).ok());
  HeldCalls calls(s.target, 1);
  for (int i = 0; i < 4; ++i) calls.Push(3, Token(3));
  EXPECT_EQ(calls.WaitEnded(4), 4) << "each ended by the server, not by this test";
  EXPECT_EQ(calls.refused(), 0);
  ExpectAnHonestLearnerIsServed(s, 9);
}

// Issue 32: Push accepted any token before its first read. The learner named in the metadata is
// authenticated first: a wrong token or no learner id ends the call before the client sends
// anything (before the fix this call waited for a header until its 10 s deadline).
TEST(HostileGrpc, APushIsAuthenticatedBeforeItsFirstRead) {
  Server s(ToyServerOptions().Secret(kSecret));
  const auto silent_push = [&](const std::string& token, const std::string& learner) {
    auto stub = Stub(s.target);
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-atoll-token", token);
    if (!learner.empty()) ctx.AddMetadata("x-atoll-learner", learner);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    atl::v1::PushReply reply;
    auto writer = stub->Push(&ctx, &reply);
    return writer->Finish();  // nothing written
  };
  EXPECT_EQ(silent_push(Token(1), "2").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(silent_push("secret", "2").error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << "the shared token means nothing here";
  EXPECT_EQ(silent_push(Token(2), "").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(silent_push(Token(2), "two").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Its own token, but a header naming another learner.
  ASSERT_TRUE(s.Client(Token(2))->Join(s.Join(2)).ok());
  auto stub = Stub(s.target);
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-atoll-token", Token(2));
  ctx.AddMetadata("x-atoll-learner", "2");
  atl::v1::PushReply reply;
  auto writer = stub->Push(&ctx, &reply);
  atl::v1::PushChunk chunk;
  chunk.mutable_header()->set_learner_id(5);
  writer->Write(chunk);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ExpectAnHonestLearnerIsServed(s, 12);
}

// Issue 32: pushes refused at the header (a wrong announced size, a malformed header) never
// counted toward the disconnect after 8 invalid pushes in a row.
TEST(HostileGrpc, InvalidPushHeadersCountTowardTheDisconnect) {
  Server s(ToyServerOptions().Secret(kSecret));
  auto c = s.Client(Token(4));
  ASSERT_TRUE(c->Join(s.Join(4)).ok());
  ASSERT_TRUE(c->Pull(4, 0, -1, 0, -1).ok());
  std::vector<std::byte> wrong_size(3);
  Status last;
  for (int i = 0; i < 8; ++i) {
    auto h = s.Header(4);
    if (i % 2 == 1) h.block_size = 7;  // not a valid int4 block: refused when the header is parsed
    last = c->Push(h, wrong_size).status();
    EXPECT_EQ(last.code(), StatusCode::kInvalidArgument) << i << ": " << last;
  }
  EXPECT_NE(last.message().find("this learner is now disconnected"), std::string::npos) << last;
  EXPECT_EQ(c->Join(s.Join(4)).status().code(), StatusCode::kPermissionDenied);
  ExpectAnHonestLearnerIsServed(s, 5);
}

TEST(HostileGrpc, HeartbeatsAreRateLimitedPerLearner) {
  transport::ServerLimits limits;
  limits.max_heartbeats_per_s = 1;  // bursts of 2
  Server s(ToyServerOptions().Limits(limits).Secret(kSecret));
  auto c = s.Client(Token(6));
  ASSERT_TRUE(c->Join(s.Join(6)).ok());
  int refused = 0;
  for (int i = 0; i < 20; ++i)
    refused += c->Heartbeat(6, syncer::LearnerProgress{}).status().code() == StatusCode::kResourceExhausted;
  EXPECT_GE(refused, 1);
  auto other = s.Client(Token(8));
  ASSERT_TRUE(other->Join(s.Join(8)).ok());
  EXPECT_TRUE(other->Heartbeat(8, syncer::LearnerProgress{}).ok()) << "one learner's flood is its own";
}

// A learner id left out of allowed_learners — a revoked credential — is refused whatever its token.
TEST(HostileGrpc, OnlyAllowedLearnersAreAccepted) {
  Server s(ToyServerOptions().Secret(kSecret).Allowed("0-1,5"));
  EXPECT_EQ(s.Client(Token(2))->Join(s.Join(2)).status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(s.Client(Token(2))->Join(s.Join(2)).status().message().find("allowed learners (0-1,5)"), std::string::npos);
  EXPECT_TRUE(s.Client(Token(5))->Join(s.Join(5)).ok());
  ExpectAnHonestLearnerIsServed(s, 1);
  EXPECT_TRUE(transport::LearnerIdSet::Parse("").value().any());
  for (const char* bad : {"x", "3-1", "-1", "1,", "2000000", "1--2"}) {
    EXPECT_FALSE(transport::LearnerIdSet::Parse(bad).ok()) << bad;
  }
  transport::ServerOptions shared;
  shared.token = "t";
  shared.allowed_learners = "0-3";
  EXPECT_EQ(transport::GrpcSyncerServer::Start(shared, *s.loop, nullptr).status().code(), StatusCode::kInvalidArgument)
      << "a shared token is every learner's: an allow-list needs per-learner credentials";
}

// Opens `n` connections to `port` in a child process (its own descriptors) that each send the
// HTTP/2 preface and a SETTINGS frame and then stay silent; the child writes a byte to `ready`
// once they are open and waits to be killed. Only system calls after fork.
pid_t HoldConnections(int port, int n, int ready) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
    (void)!::write(fd, kPreface, sizeof(kPreface) - 1);
  }
  (void)!::write(ready, "r", 1);
  for (;;) ::pause();
}

// Issue 32: ~20,000 preface-only connections exhausted the syncer's descriptors; its next
// commit failed ("Too many open files") and it aborted, and gRPC stopped accepting for good.
// Here the process may hold 400 descriptors: connections are capped below that, a commit still
// succeeds, and once the flood is gone new learners connect again.
TEST(HostileGrpc, ThousandsOfIdleConnectionsCannotStarveACommit) {
  const std::string dir = testing::ScratchDir("hostile-conns");
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = 400;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::atomic<int> commits{0}, failed{0};
  syncer::DurableState state(dir);
  {
    Server s(
        ToyServerOptions().Secret(kSecret).OnRound([&](const syncer::SyncerCore& core, const syncer::RoundReport& r) {
          const Status st = state.SaveFragment(core, r.fragment);
          ++(st.ok() ? commits : failed);
          if (!st.ok()) std::fprintf(stderr, "commit failed: %s\n", st.ToString().c_str());
        }));
    ASSERT_TRUE(s.loop->Call([&](syncer::SyncerCore& c, TimePoint) { return state.SaveAll(c); }).ok());
    auto honest = s.Client(Token(0));  // connected before the flood
    ASSERT_TRUE(honest->Join(s.Join(0)).ok());
    ASSERT_TRUE(honest->Pull(0, 0, -1, 0, -1).ok());
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t flood = HoldConnections(s.server->port(), 2000, ready[1]);
    char byte;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1);
    // The whole flood accepted: the port holds all the connections it may, the rest were closed.
    const int cap = 400 - transport::kFdHeadroom;
    testing::AwaitFor([&] { return s.server->connections_refused() >= 2000 - cap; }, 60.0);
    EXPECT_GE(s.server->connections_refused(), 2000 - cap);
    std::vector<float> delta(static_cast<size_t>(s.plan.fragments[0].numel), 0.01f);
    std::vector<std::byte> payload;
    ASSERT_TRUE(diloco::Encode({diloco::Encoding::kInt4, 64}, delta, payload).ok());
    auto pushed = honest->Push(s.Header(0), payload);
    EXPECT_TRUE(pushed.ok()) << pushed.status();
    testing::AwaitFor([&] { return commits.load() + failed.load() > 0; }, 30.0);
    const bool committed = commits.load() == 1;
    EXPECT_TRUE(committed) << "commits " << commits.load() << ", failed " << failed.load();
    ::kill(flood, SIGKILL);
    ::waitpid(flood, nullptr, 0);
    // The port still accepts (gRPC's own accept loop stopped for good at its first EMFILE).
    EXPECT_TRUE(testing::AwaitFor([&] { return s.Client(Token(1))->Join(s.Join(1)).ok(); }, 30.0,
                                  std::chrono::milliseconds(100)));
    ::close(ready[0]);
    ::close(ready[1]);
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
