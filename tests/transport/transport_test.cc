// gRPC transport: a real server on 127.0.0.1 port 0, real clients, every rejection path, TLS and
// mutual TLS. Learners training over it: tests/learner/syncer_api_test.cc (the Grpc link).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "atoll/transport/grpc_server.h"
#include "atoll/transport/grpc_client.h"
#include "testing/toy_server.h"
#include "testing/scratch.h"

namespace atl {
namespace {

using diloco::Encoding;

using Server = testing::ToyServer;
using testing::ToyServerOptions;

syncer::JoinRequestData Join(const diloco::FragmentPlan& plan, int id) {
  syncer::JoinRequestData r;
  r.protocol_version = syncer::kProtocolVersion;
  r.run_id = "grpc";
  r.model_signature = diloco::ModelSignature(plan.tensors);
  r.learner_id = id;
  r.host = "test";
  return r;
}

class Rejections : public ::testing::Test {
 protected:
  Server s{ToyServerOptions().Shape(2, 2, 1).Encoded(Encoding::kFp32)};
  void SetUp() override {
    auto c = s.Client();
    auto joined = c->Join(Join(s.plan, 0));
    ASSERT_TRUE(joined.ok());
    session_ = joined->push_session;
    for (int p = 0; p < s.plan.num_fragments(); ++p) ASSERT_TRUE(c->Pull(0, p, -1, 0, -1).ok());
  }
  // A push header of learner 0 in its session, with a new sequence number.
  syncer::PushHeaderData Header(int fragment = 0) {
    syncer::PushHeaderData h;
    h.push_session = session_;
    h.push_seq = ++seq_;
    h.learner_id = 0;
    h.fragment = fragment;
    h.base_version = 0;
    h.c_tokens = 10;
    h.c_steps = 1;
    h.encoding = Encoding::kFp32;
    h.block_size = 64;
    h.num_values = s.plan.fragments[static_cast<size_t>(fragment)].numel;
    return h;
  }
  std::vector<std::byte> Payload(int fragment, float value) {
    std::vector<float> v(static_cast<size_t>(s.plan.fragments[static_cast<size_t>(fragment)].numel), value);
    std::vector<std::byte> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  uint64_t session_ = 0, seq_ = 0;
  void ExpectUnchanged() {
    auto st = s.Status();
    EXPECT_EQ(st["rounds"].get<int64_t>(), 0);
    EXPECT_EQ(st["learners"][0]["pushes"].get<int64_t>(), 0);
    for (auto v : st["versions"]) EXPECT_EQ(v.get<int64_t>(), 0);
  }
};

TEST_F(Rejections, WrongProtocolVersion) {
  auto r = Join(s.plan, 1);
  r.protocol_version = syncer::kProtocolVersion + 1;
  auto out = s.Client()->Join(r);
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("protocol version " + std::to_string(syncer::kProtocolVersion + 1)),
            std::string::npos)
      << out.status();
  EXPECT_EQ(s.Status()["learners"].size(), 1u);
}

TEST_F(Rejections, WrongModelSignature) {
  auto r = Join(s.plan, 1);
  r.model_signature += 1;
  auto out = s.Client()->Join(r);
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(out.status().message().find("model signature"), std::string::npos);
  EXPECT_EQ(s.Status()["learners"].size(), 1u);
}

TEST_F(Rejections, WrongOrMissingToken) {
  auto bad = s.Client("guess")->Join(Join(s.plan, 1));
  EXPECT_EQ(bad.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(bad.status().message().find("wrong auth token"), std::string::npos);
  auto none = s.Client("")->Push(Header(), Payload(0, 0.1f));
  EXPECT_EQ(none.status().code(), StatusCode::kUnauthenticated);
  ExpectUnchanged();
}

TEST_F(Rejections, TruncatedStream) {
  transport::GrpcSyncerClient::PushFault f;
  f.chunk_bytes = 64;
  f.truncate_after_chunks = 2;
  auto out = s.Client()->PushWithFault(Header(), Payload(0, 0.1f), f);
  EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("truncated"), std::string::npos) << out.status();
  ExpectUnchanged();
}

TEST_F(Rejections, ChunkChecksumMismatch) {
  transport::GrpcSyncerClient::PushFault f;
  f.chunk_bytes = 64;
  f.corrupt_chunk = 1;
  auto out = s.Client()->PushWithFault(Header(), Payload(0, 0.1f), f);
  EXPECT_EQ(out.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(out.status().message().find("checksum"), std::string::npos);
  ExpectUnchanged();
}

TEST_F(Rejections, NonFiniteValues) {
  auto nan = Payload(0, std::nanf(""));
  auto out = s.Client()->Push(Header(), nan);
  EXPECT_FALSE(out.ok());
  EXPECT_TRUE(out.status().code() == StatusCode::kInvalidArgument || out.status().code() == StatusCode::kDataLoss)
      << out.status();
  auto inf = Payload(0, INFINITY);
  EXPECT_FALSE(s.Client()->Push(Header(), inf).ok());
  ExpectUnchanged();
}

TEST_F(Rejections, OversizeChunkAndWrongSize) {
  std::vector<std::byte> big(1536 * 1024);  // one chunk of 1.5 MiB > the 1 MiB limit
  transport::GrpcSyncerClient::PushFault f;
  f.chunk_bytes = big.size();
  auto h = Header();
  auto out = s.Client()->PushWithFault(h, big, f);
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  // The announced size is checked against the fragment before any chunk is read or reserved.
  EXPECT_NE(out.status().message().find("announces"), std::string::npos) << out.status();
  // Right chunking, wrong size for the fragment.
  auto wrong = s.Client()->Push(Header(), std::vector<std::byte>(12));
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(Rejections, BadFragmentAndUnknownLearner) {
  auto h = Header();
  h.fragment = 9;
  EXPECT_EQ(s.Client()->Push(h, Payload(0, 0.1f)).status().code(), StatusCode::kInvalidArgument);
  auto u = Header();
  u.learner_id = 42;
  EXPECT_EQ(s.Client()->Push(u, Payload(0, 0.1f)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.Client()->Pull(0, 7, 0, 0, -1).status().code(), StatusCode::kInvalidArgument);
  ExpectUnchanged();
  // And a good push after all that is accepted and merged.
  auto ok = s.Client()->Push(Header(), Payload(0, 0.1f));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(s.WaitForRounds(1, 30));
  EXPECT_EQ(s.Status()["rounds"].get<int64_t>(), 1);
}

}  // namespace
}  // namespace atl

namespace atl {
namespace {

// Makes a CA and a server certificate for localhost/127.0.0.1 with the openssl CLI.
std::string MakeCertificates() {
  const std::string dir = testing::ScratchDir("tls");
  const std::string cmd =
      "cd " + dir +
      " && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=atoll-test-ca >/dev/null 2>&1 && "
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost >/dev/null 2>&1 && "
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext && "
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext >/dev/null 2>&1 && "
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other-ca.pem -days 2 -subj /CN=someone-else >/dev/null 2>&1 && "
      // A learner's client certificate signed by the CA (mutual TLS).
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=learner-0 >/dev/null 2>&1 && "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "openssl failed (scripts/setup installs it)";
  return dir;
}

// The syncer core behind the TLS tests: the toy plan at zero.
syncer::SyncerCore TlsTestCore(const diloco::FragmentPlan& plan) {
  std::vector<std::vector<float>> init;
  for (const auto& f : plan.fragments) init.emplace_back(static_cast<size_t>(f.numel), 0.0f);
  syncer::SyncerOptions o;
  o.run_id = "grpc";
  o.H = 2;
  auto core = syncer::SyncerCore::Create(o, plan, init);
  ATOLL_CHECK(core.ok());
  return std::move(*core);
}

// A pull whose stream breaks part way is resumed from the bytes it holds: the learner gets the
// same payload as an unbroken pull, having received its bytes about once; a stream that keeps
// breaking ends in UNAVAILABLE after the client's resumes.
TEST(GrpcTransport, ABrokenPullResumesFromTheBytesItHolds) {
  Server clean{ToyServerOptions().Encoded(Encoding::kFp32).CutPulls({16, 0, 1})};  // the same chunks, none cut
  auto whole = clean.Client();
  ASSERT_TRUE(whole->Join(clean.Join(0)).ok());
  const int64_t before = whole->bytes_received();
  auto expected = whole->Pull(0, 0, -1, 0, -1);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const int64_t unbroken = whole->bytes_received() - before;
  ASSERT_GT(expected->bytes.size(), 16u * 6) << "the toy fragment must span several 16-byte chunks";

  Server cut{ToyServerOptions().Encoded(Encoding::kFp32).CutPulls({16, 2, 3})};
  auto c = cut.Client();
  ASSERT_TRUE(c->Join(cut.Join(0)).ok());
  const int64_t start = c->bytes_received();
  auto got = c->Pull(0, 0, -1, 0, -1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(c->pulls_resumed(), 2);
  EXPECT_EQ(got->version, expected->version);
  EXPECT_EQ(got->value_checksum, expected->value_checksum);
  EXPECT_EQ(got->bytes, expected->bytes);
  // Three headers instead of one around the same chunks: far less than the payload twice.
  EXPECT_LT(c->bytes_received() - start, unbroken * 3 / 2);

  Server broken{ToyServerOptions().Encoded(Encoding::kFp32).CutPulls({16, 100, 1})};
  auto b = broken.Client();
  ASSERT_TRUE(b->Join(broken.Join(0)).ok());
  auto failed = b->Pull(0, 0, -1, 0, -1);
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status();
  EXPECT_EQ(b->pulls_resumed(), transport::ClientOptions{}.pull_resumes);
}

// Leadership (docs/decisions/022): every reply carries the leader's epoch, and a syncer whose lease
// may have lapsed answers every call UNAVAILABLE — a learner asks the next candidate — and changes
// nothing, while the operator's Status still answers.
TEST(GrpcTransport, RepliesCarryTheLeaderEpochAndAFencedSyncerAnswersNothing) {
  std::atomic<bool> leading{true};
  Server s{ToyServerOptions().Encoded(Encoding::kFp32).Fenced({42, [&leading] { return leading.load(); }})};
  auto c = s.Client();
  auto joined = c->Join(s.Join(0));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->epoch, 42u);
  auto hb = c->Heartbeat(0, {});
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->epoch, 42u);
  auto pulled = c->Pull(0, 0, -1, 0, -1);
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_EQ(pulled->epoch, 42u);

  leading = false;
  auto refused = c->Join(s.Join(1));
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status();
  EXPECT_NE(refused.status().message().find("does not lead its shard"), std::string::npos) << refused.status();
  EXPECT_EQ(c->Heartbeat(0, {}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->Pull(0, 0, -1, 0, -1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->Leave(0).code(), StatusCode::kUnavailable);
  auto st = s.Status();
  EXPECT_EQ(st["learners"].size(), 1u);           // learner 1 never joined
  EXPECT_NE(st["learners"][0]["state"], "done");  // learner 0 did not leave
  // The same server with its lease back serves again (a standby that leads).
  leading = true;
  EXPECT_TRUE(c->Heartbeat(0, {}).ok());

  // A syncer without leadership says epoch 0.
  Server plain{ToyServerOptions().Encoded(Encoding::kFp32)};
  auto p = plain.Client();
  auto j = p->Join(plain.Join(0));
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->epoch, 0u);
}

// A call that fails UNAVAILABLE (the server went away) makes the next join open a new channel;
// other failures keep the channel.
TEST(GrpcTransport, AJoinAfterTheServerWentAwayOpensANewChannel) {
  auto first = std::make_unique<Server>(ToyServerOptions().Encoded(Encoding::kFp32));
  const std::string target = first->target;
  auto c = first->Client();
  ASSERT_TRUE(c->Join(first->Join(0)).ok());
  EXPECT_EQ(c->channels_opened(), 1);
  auto wrong = first->Join(1);
  wrong.model_signature += 1;
  EXPECT_EQ(c->Join(wrong).status().code(), StatusCode::kFailedPrecondition);
  syncer::JoinRequestData again = first->Join(0);
  again.rejoin = true;
  auto rejoined = c->Join(again);
  EXPECT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(c->channels_opened(), 1) << "a refusal is not a broken channel";
  first.reset();  // the server goes away
  EXPECT_EQ(c->Heartbeat(0, {}).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->channels_opened(), 1) << "only a join opens a new channel";
  EXPECT_EQ(c->Join(again).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c->channels_opened(), 2);
}

TEST(GrpcTransport, TlsChannelWithTokenOnEveryCall) {
  const std::string certs = MakeCertificates();
  auto plan = testing::ToyPlan(2);
  RealClock clock;
  syncer::SyncerLoop loop(TlsTestCore(plan), clock, nullptr);
  transport::ServerOptions so;
  so.token = "tls-secret";
  so.tls = {true, certs + "/server.pem", certs + "/server.key", "", "", ""};
  auto server = transport::GrpcSyncerServer::Start(so, loop, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());
  auto connect = [&](bool tls, const std::string& ca, const std::string& token) {
    transport::ClientOptions co;
    co.target = target;
    co.token = token;
    co.call_timeout_s = 3;
    co.tls.enabled = tls;
    co.tls.ca_file = ca;
    auto c = transport::GrpcSyncerClient::Connect(co);
    ATOLL_CHECK(c.ok());
    return std::move(*c);
  };
  // TLS with the right CA and token: joins.
  auto good = connect(true, certs + "/ca.pem", "tls-secret")->Join(Join(plan, 0));
  EXPECT_TRUE(good.ok()) << good.status();
  // Right CA, wrong token: refused by the token check on top of TLS.
  EXPECT_EQ(connect(true, certs + "/ca.pem", "nope")->Join(Join(plan, 1)).status().code(),
            StatusCode::kUnauthenticated);
  // A plaintext client cannot talk to a TLS server.
  EXPECT_EQ(connect(false, "", "tls-secret")->Join(Join(plan, 2)).status().code(), StatusCode::kUnavailable);
  // A client that trusts another CA refuses the server's certificate.
  EXPECT_EQ(connect(true, certs + "/other-ca.pem", "tls-secret")->Join(Join(plan, 3)).status().code(),
            StatusCode::kUnavailable);
  // A missing or non-PEM certificate file is a clear start-up error.
  transport::ServerOptions bad = so;
  bad.tls.cert_file = certs + "/san.ext";
  auto refused = transport::GrpcSyncerServer::Start(bad, loop, nullptr);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("not a PEM file"), std::string::npos);
  (*server)->Shutdown();
  loop.Stop();
  std::filesystem::remove_all(certs);
}

TEST(GrpcTransport, MutualTlsRefusesLearnersWithoutACertificateFromTheClientCa) {
  const std::string certs = MakeCertificates();
  auto plan = testing::ToyPlan(2);
  RealClock clock;
  syncer::SyncerLoop loop(TlsTestCore(plan), clock, nullptr);
  transport::ServerOptions so;
  so.token = "tls-secret";
  so.tls.enabled = true;
  so.tls.cert_file = certs + "/server.pem";
  so.tls.key_file = certs + "/server.key";
  so.tls.client_ca_file = certs + "/ca.pem";
  auto server = transport::GrpcSyncerServer::Start(so, loop, nullptr);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string target = "127.0.0.1:" + std::to_string((*server)->port());
  auto join = [&](const std::string& cert, const std::string& key, int id) {
    transport::ClientOptions co;
    co.target = target;
    co.token = "tls-secret";
    co.call_timeout_s = 3;
    co.tls.enabled = true;
    co.tls.ca_file = certs + "/ca.pem";
    co.tls.cert_file = cert;
    co.tls.key_file = key;
    auto c = transport::GrpcSyncerClient::Connect(co);
    if (!c.ok()) return c.status();
    return (*c)->Join(Join(plan, id)).status();
  };
  // A certificate from the client CA: joins.
  EXPECT_TRUE(join(certs + "/client.pem", certs + "/client.key", 0).ok());
  // No client certificate, or one from another CA: the handshake fails, nothing is called.
  EXPECT_EQ(join("", "", 1).code(), StatusCode::kUnavailable);
  EXPECT_EQ(join(certs + "/other-ca.pem", certs + "/other.key", 2).code(), StatusCode::kUnavailable);
  auto table = loop.Call([](syncer::SyncerCore& c, TimePoint) { return c.learners().size(); });
  EXPECT_EQ(table, 1u);
  // A client certificate file that is not PEM is a clear error before any connection.
  EXPECT_EQ(join(certs + "/san.ext", certs + "/client.key", 3).code(), StatusCode::kInvalidArgument);
  (*server)->Shutdown();
  loop.Stop();
  std::filesystem::remove_all(certs);
}

}  // namespace
}  // namespace atl
