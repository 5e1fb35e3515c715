// Wire parsing and chunking of the gRPC transport (src/transport/wire.h): every field survives a
// round trip, and malformed headers and chunks are refused with the payload unchanged.
#include "wire.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "atoll/core/checksum.h"
#include "atoll/transport/grpc_client.h"

namespace atl::transport {
namespace {

atl::v1::DataChunk Chunk(int64_t offset, const std::string& data) {
  atl::v1::DataChunk c;
  c.set_offset(offset);
  c.set_data(data);
  c.set_checksum(Checksum64(data));
  return c;
}

TEST(Wire, PushHeaderRoundTrips) {
  syncer::PushHeaderData h;
  h.learner_id = 3;
  h.fragment = 7;
  h.base_version = 11;
  h.c_tokens = 4096;
  h.c_steps = 2;
  h.encoding = diloco::Encoding::kInt4;
  h.block_size = 128;
  h.num_values = 1000;
  h.local_step = 99;
  h.compression = diloco::Compression::kDeflate;
  h.final_sync = true;
  h.push_session = 0xfedcba9876543210u;
  h.push_seq = 12345;
  atl::v1::PushHeader msg;
  FillPushHeader(h, 532, 0xabcdef, &msg);
  auto parsed = ParsePushHeader(msg);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& [d, checksum] = *parsed;
  EXPECT_EQ(checksum, 0xabcdefu);
  EXPECT_EQ(d.learner_id, 3);
  EXPECT_EQ(d.fragment, 7);
  EXPECT_EQ(d.base_version, 11);
  EXPECT_EQ(d.c_tokens, 4096);
  EXPECT_EQ(d.c_steps, 2);
  EXPECT_EQ(d.encoding, diloco::Encoding::kInt4);
  EXPECT_EQ(d.block_size, 128);
  EXPECT_EQ(d.num_values, 1000);
  EXPECT_EQ(d.local_step, 99);
  EXPECT_EQ(d.compression, diloco::Compression::kDeflate);
  EXPECT_TRUE(d.final_sync);
  EXPECT_EQ(d.push_session, 0xfedcba9876543210u);
  EXPECT_EQ(d.push_seq, 12345u);
  // A learner from before compression existed leaves the field empty: none.
  msg.clear_compression();
  auto old = ParsePushHeader(msg);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->first.compression, diloco::Compression::kNone);
}

TEST(Wire, BadPushHeadersAreInvalidArgument) {
  syncer::PushHeaderData h;
  h.encoding = diloco::Encoding::kInt4;
  h.block_size = 128;
  h.num_values = 10;
  atl::v1::PushHeader good;
  FillPushHeader(h, 16, 1, &good);
  ASSERT_TRUE(ParsePushHeader(good).ok());

  auto bad = good;
  bad.set_encoding("int3");
  EXPECT_EQ(ParsePushHeader(bad).status().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.set_num_values(-1);
  EXPECT_EQ(ParsePushHeader(bad).status().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.set_payload_bytes(-1);
  EXPECT_EQ(ParsePushHeader(bad).status().code(), StatusCode::kInvalidArgument);
  // Any size parses: what a fragment's push may carry is the syncer's plan to say (CheckPush,
  // before memory is reserved), not a fixed cap.
  bad = good;
  bad.set_payload_bytes(int64_t{1} << 40);
  EXPECT_TRUE(ParsePushHeader(bad).ok());
  bad = good;
  bad.set_block_size(0);
  EXPECT_EQ(ParsePushHeader(bad).status().code(), StatusCode::kInvalidArgument);
  bad = good;
  bad.set_compression("zstd");
  EXPECT_EQ(ParsePushHeader(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(Wire, ChunksAppendInOrderAndBadOnesLeaveThePayloadUnchanged) {
  std::vector<std::byte> payload;
  ASSERT_TRUE(AppendChunk(Chunk(0, "hello "), 11, payload).ok());
  // Out of order (lost chunk), wrong checksum, beyond the announced size: refused, nothing added.
  EXPECT_EQ(AppendChunk(Chunk(7, "world"), 11, payload).code(), StatusCode::kDataLoss);
  auto corrupt = Chunk(6, "world");
  corrupt.set_checksum(corrupt.checksum() ^ 1);
  EXPECT_EQ(AppendChunk(corrupt, 11, payload).code(), StatusCode::kDataLoss);
  EXPECT_EQ(AppendChunk(Chunk(6, "world!"), 11, payload).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(payload.size(), 6u);
  ASSERT_TRUE(AppendChunk(Chunk(6, "world"), 11, payload).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(payload.data()), payload.size()), "hello world");
}

TEST(Wire, AChunkOverOneMebibyteIsRefused) {
  std::vector<std::byte> payload;
  const std::string big((1 << 20) + 1, 'x');
  EXPECT_EQ(AppendChunk(Chunk(0, big), int64_t{1} << 30, payload).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(payload.empty());
}

TEST(Wire, JoinReplyRoundTripsAndUnknownNamesAreRefused) {
  syncer::JoinReplyData r;
  r.learner_id = 2;
  r.versions = {4, 5};
  r.fragment_numel = {100, 200};
  r.H = 24;
  r.tau = 1;
  r.mode = diloco::Mode::kDiloco;
  r.uplink = {diloco::Encoding::kInt4, 256};
  r.downlink = {diloco::Encoding::kInt8, 256};
  r.incarnation = 77;
  r.fragment_held = {7, -1};
  r.fragment_initial = {false, true};
  r.merged_versions = {3, -1};
  r.push_session = 0x1234567890abcdefu;
  r.uplink.compression = r.downlink.compression = diloco::Compression::kDeflate;
  atl::v1::JoinReply msg;
  FillJoinReply(r, &msg);
  auto d = ParseJoinReply(msg);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->learner_id, 2);
  EXPECT_EQ(d->versions, r.versions);
  EXPECT_EQ(d->fragment_numel, r.fragment_numel);
  EXPECT_EQ(d->H, 24);
  EXPECT_EQ(d->tau, 1);
  EXPECT_EQ(d->mode, diloco::Mode::kDiloco);
  EXPECT_EQ(d->uplink.encoding, diloco::Encoding::kInt4);
  EXPECT_EQ(d->downlink.encoding, diloco::Encoding::kInt8);
  EXPECT_EQ(d->downlink.block_size, 256);
  EXPECT_EQ(d->incarnation, 77u);
  EXPECT_EQ(d->push_session, 0x1234567890abcdefu);
  EXPECT_EQ(d->fragment_held, r.fragment_held);
  EXPECT_EQ(d->fragment_initial, r.fragment_initial);
  EXPECT_EQ(d->merged_versions, r.merged_versions);
  EXPECT_EQ(d->uplink.compression, diloco::Compression::kDeflate);
  EXPECT_EQ(d->downlink.compression, diloco::Compression::kDeflate);

  auto bad = msg;
  bad.set_mode("federated");
  EXPECT_EQ(ParseJoinReply(bad).status().code(), StatusCode::kInvalidArgument);
  bad = msg;
  bad.set_downlink_encoding("int1");
  EXPECT_EQ(ParseJoinReply(bad).status().code(), StatusCode::kInvalidArgument);
  bad = msg;
  bad.set_compression("lz4");
  EXPECT_EQ(ParseJoinReply(bad).status().code(), StatusCode::kInvalidArgument);
  bad = msg;  // a syncer from before compression existed: none
  bad.clear_compression();
  auto old = ParseJoinReply(bad);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->uplink.compression, diloco::Compression::kNone);
}

TEST(Wire, JoinRequestRoundTripsWithTheHostCut) {
  syncer::JoinRequestData r;
  r.protocol_version = 5;
  r.run_id = "run-7";
  r.model_signature = 0xabcdef;
  r.learner_id = 3;
  r.host = std::string(300, 'h');
  r.rejoin = true;
  r.fragment_checksums = {1, 2, 3};
  r.shard = {1, 2};
  atl::v1::JoinRequest msg;
  FillJoinRequest(r, &msg);
  const syncer::JoinRequestData d = ParseJoinRequest(msg);
  EXPECT_EQ(d.protocol_version, 5u);
  EXPECT_EQ(d.run_id, "run-7");
  EXPECT_EQ(d.model_signature, 0xabcdefu);
  EXPECT_EQ(d.learner_id, 3);
  EXPECT_EQ(d.host, std::string(256, 'h'));  // cut to its bound
  EXPECT_TRUE(d.rejoin);
  EXPECT_EQ(d.fragment_checksums, r.fragment_checksums);
  EXPECT_EQ(d.shard.index, 1);
  EXPECT_EQ(d.shard.count, 2);
  r.shard = {};  // unsharded: the fields stay unset and read back as {0, 1}
  msg.Clear();
  FillJoinRequest(r, &msg);
  EXPECT_EQ(msg.shard_count(), 0);
  EXPECT_EQ(ParseJoinRequest(msg).shard.count, 1);
}

TEST(Wire, HeartbeatAndItsReplyRoundTripAndBadProgressIsRefused) {
  syncer::LearnerProgress p;
  p.step = 12;
  p.tokens = 4096;
  p.loss = 3.5;
  p.step_seconds = 0.25;
  p.tokens_per_second = 16384;
  p.version_held = 9;
  p.state = syncer::LearnerState::kDone;
  atl::v1::HeartbeatRequest msg;
  FillHeartbeat(4, p, &msg);
  EXPECT_EQ(msg.learner_id(), 4);
  auto d = ParseHeartbeat(msg);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->step, 12);
  EXPECT_EQ(d->tokens, 4096);
  EXPECT_EQ(d->loss, 3.5);
  EXPECT_EQ(d->step_seconds, 0.25);
  EXPECT_EQ(d->tokens_per_second, 16384);
  EXPECT_EQ(d->version_held, 9);
  EXPECT_EQ(d->state, syncer::LearnerState::kDone);
  auto bad = msg;
  bad.set_state("sleeping");
  EXPECT_EQ(ParseHeartbeat(bad).status().message(),
            "heartbeat: learner state must be joining, training or done (got 'sleeping')");
  bad = msg;
  bad.set_loss(std::nan(""));
  EXPECT_EQ(ParseHeartbeat(bad).status().code(), StatusCode::kInvalidArgument);
  bad = msg;
  bad.set_step(-1);
  EXPECT_EQ(ParseHeartbeat(bad).status().code(), StatusCode::kInvalidArgument);

  syncer::HeartbeatReplyData r{{3, 4, 5}, true, 99};
  atl::v1::HeartbeatReply reply;
  FillHeartbeatReply(r, &reply);
  const syncer::HeartbeatReplyData back = ParseHeartbeatReply(reply);
  EXPECT_EQ(back.versions, r.versions);
  EXPECT_TRUE(back.finish);
  EXPECT_EQ(back.incarnation, 99u);

  atl::v1::PushReply push_reply;
  FillPushReply({7, 8, "late", 99}, &push_reply);
  const syncer::PushResult pr = ParsePushReply(push_reply);
  EXPECT_EQ(pr.round, 7);
  EXPECT_EQ(pr.merged_version, 8);
  EXPECT_EQ(pr.note, "late");
  EXPECT_EQ(pr.incarnation, 99u);
}

atl::v1::PullChunk PullHeaderOf(int64_t version, const std::string& bytes, int64_t resume_offset = 0) {
  atl::v1::PullChunk header;
  auto* h = header.mutable_header();
  h->set_fragment(2);
  h->set_version(version);
  h->set_encoding(kLatticeEncoding);
  h->set_compression("none");
  h->set_payload_bytes(static_cast<int64_t>(bytes.size()));
  h->set_payload_checksum(Checksum64(bytes));
  h->set_resume_offset(resume_offset);
  return header;
}

atl::v1::PullChunk PullData(int64_t offset, const std::string& data) {
  atl::v1::PullChunk c;
  *c.mutable_data() = Chunk(offset, data);
  return c;
}

std::string Text(const syncer::PullPayload& p) {
  return std::string(reinterpret_cast<const char*>(p.bytes.data()), p.bytes.size());
}

// A pull's stream read back: one header, then its chunks; anything else is DataLoss.
TEST(Wire, APullIsAssembledFromAHeaderAndItsChunksOnly) {
  const std::string bytes = "0123456789";
  const atl::v1::PullChunk header = PullHeaderOf(5, bytes);
  const atl::v1::PullChunk first = PullData(0, bytes.substr(0, 4)), second = PullData(4, bytes.substr(4));

  PullAssembler ok(1 << 20);
  ASSERT_TRUE(ok.Add(header).ok());
  ASSERT_TRUE(ok.Add(first).ok());
  ASSERT_TRUE(ok.Add(second).ok());
  auto payload = std::move(ok).Finish();
  ASSERT_TRUE(payload.ok()) << payload.status();
  EXPECT_EQ(payload->fragment, 2);
  EXPECT_EQ(payload->version, 5);
  EXPECT_EQ(Text(*payload), bytes);

  PullAssembler data_first(1 << 20);
  EXPECT_EQ(data_first.Add(first).code(), StatusCode::kDataLoss);
  PullAssembler two_headers(1 << 20);
  ASSERT_TRUE(two_headers.Add(header).ok());
  EXPECT_EQ(two_headers.Add(header).code(), StatusCode::kDataLoss);
  PullAssembler empty(1 << 20);
  EXPECT_EQ(std::move(empty).Finish().status().code(), StatusCode::kDataLoss);
  PullAssembler truncated(1 << 20);
  ASSERT_TRUE(truncated.Add(header).ok());
  ASSERT_TRUE(truncated.Add(first).ok());
  EXPECT_EQ(std::move(truncated).Finish().status().code(), StatusCode::kDataLoss);
  PullAssembler too_large(4);  // the header announces more than the run's largest fragment
  EXPECT_EQ(too_large.Add(header).code(), StatusCode::kDataLoss);
}

// A broken pull resumed: the new stream continues the payload held, or (the syncer has moved on)
// starts over; a continuation that does not fit what is held is DataLoss.
TEST(Wire, AResumedPullContinuesThePayloadHeldOrStartsOver) {
  const std::string v5 = "0123456789", v6 = "abcdefghijklmnop";
  PullAssembler cont(1 << 20);
  ASSERT_TRUE(cont.Add(PullHeaderOf(5, v5)).ok());
  ASSERT_TRUE(cont.Add(PullData(0, v5.substr(0, 4))).ok());
  EXPECT_TRUE(cont.Resumable());
  EXPECT_EQ(cont.missing_bytes(), 6);
  atl::v1::PullRequest req;
  cont.Resume(req);
  EXPECT_EQ(req.resume_offset(), 4);
  EXPECT_EQ(req.resume_version(), 5);
  EXPECT_EQ(req.resume_payload_checksum(), Checksum64(v5));
  ASSERT_TRUE(cont.Add(PullHeaderOf(5, v5, 4)).ok());
  ASSERT_TRUE(cont.Add(PullData(4, v5.substr(4))).ok());
  auto whole = std::move(cont).Finish();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(Text(*whole), v5);

  PullAssembler over(1 << 20);
  ASSERT_TRUE(over.Add(PullHeaderOf(5, v5)).ok());
  ASSERT_TRUE(over.Add(PullData(0, v5.substr(0, 4))).ok());
  over.Resume(req);
  ASSERT_TRUE(over.Add(PullHeaderOf(6, v6)).ok());  // a newer version, from its start
  ASSERT_TRUE(over.Add(PullData(0, v6)).ok());
  auto newer = std::move(over).Finish();
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ(newer->version, 6);
  EXPECT_EQ(Text(*newer), v6);

  PullAssembler wrong(1 << 20);
  ASSERT_TRUE(wrong.Add(PullHeaderOf(5, v5)).ok());
  ASSERT_TRUE(wrong.Add(PullData(0, v5.substr(0, 4))).ok());
  EXPECT_EQ(wrong.Add(PullHeaderOf(5, v5, 4)).code(), StatusCode::kDataLoss);  // not resumed: two headers
  wrong.Resume(req);
  EXPECT_EQ(wrong.Add(PullHeaderOf(5, v5, 3)).code(), StatusCode::kDataLoss);  // not where it stopped
  PullAssembler other(1 << 20);
  ASSERT_TRUE(other.Add(PullHeaderOf(5, v5)).ok());
  ASSERT_TRUE(other.Add(PullData(0, v5.substr(0, 4))).ok());
  other.Resume(req);
  EXPECT_EQ(other.Add(PullHeaderOf(6, v6, 4)).code(), StatusCode::kDataLoss);  // another payload's tail
  PullAssembler first(1 << 20);
  EXPECT_EQ(first.Add(PullHeaderOf(5, v5, 4)).code(), StatusCode::kDataLoss);  // a tail with no head
  EXPECT_FALSE(first.Resumable());
}

// The syncer's side: a resume continues only the very payload it names, inside its bounds.
TEST(Wire, AResumeOffsetIsHonouredOnlyForTheSamePayload) {
  syncer::PullPayload p;
  p.version = 5;
  const std::string v5 = "0123456789";
  p.bytes.resize(v5.size());
  std::memcpy(p.bytes.data(), v5.data(), v5.size());
  const uint64_t sum = Checksum64(v5);
  atl::v1::PullRequest r;
  r.set_resume_offset(4);
  r.set_resume_version(5);
  r.set_resume_payload_checksum(sum);
  EXPECT_EQ(*ResumeOffset(r, p, sum), 4);
  r.set_resume_version(4);
  EXPECT_EQ(*ResumeOffset(r, p, sum), 0);
  r.set_resume_version(5);
  r.set_resume_payload_checksum(sum ^ 1);
  EXPECT_EQ(*ResumeOffset(r, p, sum), 0);
  r.set_resume_payload_checksum(sum);
  r.set_resume_offset(10);  // nothing left to send: from the start
  EXPECT_EQ(*ResumeOffset(r, p, sum), 0);
  r.set_resume_offset(-1);
  EXPECT_EQ(ResumeOffset(r, p, sum).status().code(), StatusCode::kInvalidArgument);
}

TEST(Wire, StatusCodesMapBothWays) {
  for (StatusCode code : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kAborted,
                          StatusCode::kUnavailable, StatusCode::kDataLoss, StatusCode::kPermissionDenied,
                          StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition}) {
    const Status st(code, "why");
    const Status back = FromGrpc(ToGrpc(st), "call");
    EXPECT_EQ(back.code(), code);
    EXPECT_NE(back.message().find("why"), std::string::npos) << back;
  }
  EXPECT_TRUE(FromGrpc(ToGrpc(Status::Ok()), "call").ok());
}

}  // namespace
}  // namespace atl::transport

namespace atl::transport {
namespace {

TEST(GrpcDeadlines, APayloadGetsTheTimeItsBytesTakeAtTheSlowestLinkRate) {
  EXPECT_DOUBLE_EQ(PayloadDeadlineSeconds(60, 0, 10), 60);
  EXPECT_DOUBLE_EQ(PayloadDeadlineSeconds(60, 125'000'000, 10), 160);  // 1 Gbit at 10 Mbit/s: 100 s more
  EXPECT_DOUBLE_EQ(PayloadDeadlineSeconds(60, 125'000'000, 0), 60);    // no allowance
}

}  // namespace
}  // namespace atl::transport
