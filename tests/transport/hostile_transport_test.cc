// Hostile clients against the real gRPC server on 127.0.0.1 (issue 10): text cut inside a UTF-8
// character, pushes that announce absurd payloads (from strangers, with wrong sizes, beyond the
// in-flight budget), poisoned values, and connections that never speak. Each test asserts the
// syncer is alive, still serves an honest learner, and its committed state is unchanged.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include <grpcpp/grpcpp.h>

#include "atoll.grpc.pb.h"
#include "atoll/core/checksum.h"
#include "atoll/exchange/fragment_exchange.h"
#include "atoll/transport/credentials.h"
#include "atoll/transport/grpc_server.h"
#include "testing/toy_server.h"

namespace atl {
namespace {

using diloco::Encoding;
using Server = testing::ToyServer;
using testing::ToyServerOptions;

// A raw push: a header announcing `payload_bytes`, then nothing.
grpc::Status RawPush(const std::string& target, int learner_id, int64_t payload_bytes) {
  auto stub = atl::v1::Syncer::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-atoll-token", "secret");
  ctx.AddMetadata("x-atoll-learner", std::to_string(learner_id));
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  atl::v1::PushReply reply;
  auto writer = stub->Push(&ctx, &reply);
  atl::v1::PushChunk chunk;
  auto* h = chunk.mutable_header();
  h->set_learner_id(learner_id);
  h->set_fragment(0);
  h->set_base_version(0);
  h->set_c_tokens(1);
  h->set_c_steps(1);
  h->set_encoding("int4");
  h->set_block_size(64);
  h->set_num_values(256);
  h->set_payload_bytes(payload_bytes);
  writer->Write(chunk);
  writer->WritesDone();
  return writer->Finish();
}

TEST(HostileGrpc, HostCutInsideAUtf8CharacterDoesNotKillTheSyncer) {
  Server s;
  const uint64_t before = s.Committed();
  auto c = s.Client();
  ASSERT_TRUE(c->Join(s.Join(0, std::string(255, 'a') + "\xC3\xA9")).ok());  // 257 bytes
  auto status = c->StatusJson();
  ASSERT_TRUE(status.ok()) << status.status();
  auto j = nlohmann::json::parse(*status);
  EXPECT_EQ(j["learners"][0]["host"].get<std::string>(), std::string(255, 'a'));
  EXPECT_EQ(s.Committed(), before);
  s.ExpectServesAnHonestLearner(1);
}

TEST(HostileGrpc, AbsurdPushAnnouncementsAreRefusedBeforeAnyMemoryIsReserved) {
  Server s;
  const uint64_t before = s.Committed();
  // A stranger announcing 3 GiB: refused as NOT_FOUND before anything is reserved.
  grpc::Status st = RawPush(s.target, 77, int64_t{3} << 30);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  // A joined learner announcing more than its fragment encodes to.
  auto c = s.Client();
  ASSERT_TRUE(c->Join(s.Join(0)).ok());
  st = RawPush(s.target, 0, int64_t{3} << 30);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("announces"), std::string::npos) << st.error_message();
  EXPECT_EQ(s.Committed(), before);
  s.ExpectServesAnHonestLearner(1);
}

TEST(HostileGrpc, PushesBeyondTheInFlightBudgetAreResourceExhausted) {
  transport::ServerLimits limits;
  limits.max_inflight_push_bytes = 16;  // less than one push of this fragment
  Server s(ToyServerOptions().Limits(limits));
  auto c = s.Client();
  ASSERT_TRUE(c->Join(s.Join(0)).ok());
  ASSERT_TRUE(c->Pull(0, 0, -1, 0, -1).ok());
  std::vector<float> delta(256, 0.01f);
  std::vector<std::byte> payload;
  ASSERT_TRUE(diloco::Encode({Encoding::kInt4, 64}, delta, payload).ok());
  auto pushed = c->Push(s.Header(0), payload);
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), StatusCode::kResourceExhausted) << pushed.status();
  EXPECT_TRUE(c->StatusJson().ok());  // alive
}

TEST(HostileGrpc, PoisonedInt4PushIsRefusedAndNothingIsCommitted) {
  Server s;
  const uint64_t before = s.Committed();
  auto c = s.Client();
  ASSERT_TRUE(c->Join(s.Join(0)).ok());
  ASSERT_TRUE(c->Pull(0, 0, -1, 0, -1).ok());
  // Four blocks of 64 values, scale 1e37, every code +7: finite, absurd.
  std::vector<std::byte> payload(diloco::EncodedSize({Encoding::kInt4, 64}, 256));
  for (size_t off = 0; off < payload.size(); off += 36) {
    const float scale = 1e37f;
    std::memcpy(payload.data() + off, &scale, 4);
    std::memset(payload.data() + off + 4, 0xFF, 32);
  }
  auto pushed = c->Push(s.Header(0), payload);
  ASSERT_FALSE(pushed.ok());
  EXPECT_EQ(pushed.status().code(), StatusCode::kInvalidArgument) << pushed.status();
  EXPECT_EQ(s.Committed(), before);
  EXPECT_TRUE(c->Pull(0, 0, 0, 0, -1).ok());  // the pull path still works
  s.ExpectServesAnHonestLearner(1);
}

TEST(HostileGrpc, AConnectionThatNeverSpeaksIsClosed) {
  transport::ServerLimits limits;
  limits.handshake_timeout_ms = 200;
  limits.max_connection_idle_ms = 200;
  Server s(ToyServerOptions().Limits(limits));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{30, 0};  // the bound of this test, not a threshold: the server closes much sooner
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  ssize_t n = 0;
  do {
    n = ::recv(fd, buf, sizeof(buf), 0);  // the server's settings frame may come first
  } while (n > 0);
  EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << "connection still open: " << std::strerror(errno);
  ::close(fd);
  s.ExpectServesAnHonestLearner(0);
}

TEST(HostileGrpc, PerLearnerCredentialsLetALearnerActOnlyAsItself) {
  const std::string secret = "run-secret-0123456789";
  Server s(ToyServerOptions().Secret(secret));
  EXPECT_EQ(transport::LearnerToken(secret, "grpc", 0).size(), 64u);
  EXPECT_NE(transport::LearnerToken(secret, "grpc", 0), transport::LearnerToken(secret, "grpc", 1));
  EXPECT_NE(transport::LearnerToken(secret, "grpc", 0), transport::LearnerToken(secret, "other-run", 0));
  EXPECT_TRUE(transport::TokensEqual("abc", "abc"));
  EXPECT_FALSE(transport::TokensEqual("abc", "abd"));
  EXPECT_FALSE(transport::TokensEqual("abc", "abcd"));
  auto zero = s.Client(transport::LearnerToken(secret, "grpc", 0));
  auto one = s.Client(transport::LearnerToken(secret, "grpc", 1));
  auto shared = s.Client("secret");  // the shared token means nothing once a secret is set
  auto op = s.Client(transport::OperatorToken(secret, "grpc"));
  ASSERT_TRUE(zero->Join(s.Join(0)).ok());
  ASSERT_TRUE(zero->Pull(0, 0, -1, 0, -1).ok());
  // Learner 1's token cannot take over learner 0: not by rejoin, heartbeat, push, pull or leave.
  auto rejoin = s.Join(0);
  rejoin.rejoin = true;
  EXPECT_EQ(one->Join(rejoin).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(one->Heartbeat(0, syncer::LearnerProgress{}).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(one->Leave(0).code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(one->Pull(0, 0, -1, 0, -1).status().code(), StatusCode::kUnauthenticated);
  std::vector<std::byte> payload(diloco::EncodedSize({Encoding::kInt4, 64}, 256));
  EXPECT_EQ(one->Push(s.Header(0), payload).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(one->Join(s.Join(-1)).status().code(), StatusCode::kUnauthenticated);  // no id: no token
  EXPECT_EQ(shared->Join(s.Join(2)).status().code(), StatusCode::kUnauthenticated);
  // Status and Finish are the operator's.
  EXPECT_EQ(zero->StatusJson().status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(zero->Finish(false).status().code(), StatusCode::kUnauthenticated);
  auto status = op->StatusJson();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(nlohmann::json::parse(*status)["learners"].size(), 1u);  // learner 0 only, untouched
  EXPECT_TRUE(zero->Heartbeat(0, syncer::LearnerProgress{}).ok());
  EXPECT_TRUE(one->Join(s.Join(1)).ok());  // learner 1 acts as itself
  EXPECT_TRUE(op->Finish(false).ok());
}

}  // namespace
}  // namespace atl
