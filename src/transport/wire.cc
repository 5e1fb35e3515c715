#include "wire.h"

#include <cmath>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/text.h"
#include "atoll/transport/grpc_client.h"

namespace atl::transport {

grpc::Status ToGrpc(const Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(st.code())), st.message());
}

Status FromGrpc(const grpc::Status& st, const std::string& what) {
  if (st.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(static_cast<int>(st.error_code())), what + ": " + st.error_message());
}

StatusOr<diloco::Compression> ParseWireCompression(const std::string& s) {
  if (s.empty()) return diloco::Compression::kNone;  // a peer from before compression existed
  return diloco::ParseCompression(s);
}

StatusOr<std::pair<syncer::PushHeaderData, uint64_t>> ParsePushHeader(const atl::v1::PushHeader& h) {
  syncer::PushHeaderData d;
  d.learner_id = h.learner_id();
  d.fragment = h.fragment();
  d.base_version = h.base_version();
  d.c_tokens = h.c_tokens();
  d.c_steps = h.c_steps();
  d.block_size = h.block_size();
  d.num_values = h.num_values();
  d.local_step = h.local_step();
  d.final_sync = h.final_sync();
  d.push_session = h.push_session();
  d.push_seq = h.push_seq();
  d.public_copy = h.public_copy();
  auto enc = diloco::ParseEncoding(h.encoding());
  if (!enc.ok()) return enc.status().WithContext("push header");
  d.encoding = *enc;
  auto comp = ParseWireCompression(h.compression());
  if (!comp.ok()) return comp.status().WithContext("push header");
  d.compression = *comp;
  // The size is bounded by the plan (SyncerCore::CheckPush, before any memory is reserved).
  if (h.num_values() < 0 || h.payload_bytes() < 0) {
    return InvalidArgumentError("push header: sizes out of range (num_values " + std::to_string(h.num_values()) +
                                ", payload_bytes " + std::to_string(h.payload_bytes()) + ")");
  }
  if (d.encoding != diloco::Encoding::kFp32 && d.encoding != diloco::Encoding::kBf16) {
    Status st = diloco::ValidateCodecOptions({d.encoding, d.block_size});
    if (!st.ok()) return st.WithContext("push header");
  }
  return std::make_pair(d, static_cast<uint64_t>(h.payload_checksum()));
}

void FillPushHeader(const syncer::PushHeaderData& h, int64_t payload_bytes, uint64_t checksum,
                    atl::v1::PushHeader* out) {
  out->set_learner_id(h.learner_id);
  out->set_fragment(h.fragment);
  out->set_base_version(h.base_version);
  out->set_c_tokens(h.c_tokens);
  out->set_c_steps(h.c_steps);
  out->set_encoding(diloco::EncodingName(h.encoding));
  out->set_block_size(h.block_size);
  out->set_compression(diloco::CompressionName(h.compression));
  out->set_num_values(h.num_values);
  out->set_payload_bytes(payload_bytes);
  out->set_payload_checksum(checksum);
  out->set_local_step(h.local_step);
  out->set_final_sync(h.final_sync);
  out->set_push_session(h.push_session);
  out->set_push_seq(h.push_seq);
  out->set_public_copy(h.public_copy);
}

Status AppendChunk(const atl::v1::DataChunk& chunk, int64_t total, std::vector<std::byte>& payload) {
  const std::string& data = chunk.data();
  if (chunk.offset() != static_cast<int64_t>(payload.size())) {
    return DataLossError("chunk at offset " + std::to_string(chunk.offset()) + ", expected " +
                         std::to_string(payload.size()) + " (chunks lost or reordered)");
  }
  if (data.size() > kMaxChunkBytes) {
    return InvalidArgumentError("chunk of " + std::to_string(data.size()) + " bytes exceeds 1 MiB");
  }
  if (static_cast<int64_t>(payload.size() + data.size()) > total) {
    return InvalidArgumentError("chunks exceed the announced payload of " + std::to_string(total) + " bytes");
  }
  if (Checksum64(data.data(), data.size()) != chunk.checksum()) {
    return DataLossError("chunk checksum mismatch at offset " + std::to_string(chunk.offset()));
  }
  const auto* b = reinterpret_cast<const std::byte*>(data.data());
  payload.insert(payload.end(), b, b + data.size());
  return Status::Ok();
}

int64_t WritePull(const syncer::PullPayload& p, uint64_t payload_checksum, const PullWrite& w,
                  grpc::ServerWriter<atl::v1::PullChunk>* writer) {
  atl::v1::PullChunk msg;
  auto* h = msg.mutable_header();
  h->set_fragment(p.fragment);
  h->set_version(p.version);
  h->set_is_delta(p.is_delta);
  h->set_base_version(p.base_version);
  h->set_encoding(kLatticeEncoding);
  h->set_block_size(p.block_size);
  h->set_compression(diloco::CompressionName(p.compression));
  h->set_raw_bytes(static_cast<int64_t>(p.raw_bytes));
  h->set_num_values(0);
  h->set_payload_bytes(static_cast<int64_t>(p.bytes.size()));
  h->set_payload_checksum(payload_checksum);
  h->set_value_checksum(p.value_checksum);
  h->set_not_modified(p.not_modified);
  h->set_incarnation(p.incarnation);
  h->set_resume_offset(w.from);
  h->set_leader_epoch(w.epoch);
  if (!writer->Write(msg)) return 0;
  int64_t sent = 0;
  int chunks = 0;
  for (size_t off = static_cast<size_t>(w.from); off < p.bytes.size(); off += w.chunk_bytes) {
    if (w.max_chunks >= 0 && chunks++ >= w.max_chunks) break;
    const size_t n = std::min(w.chunk_bytes, p.bytes.size() - off);
    atl::v1::PullChunk c;
    auto* d = c.mutable_data();
    d->set_offset(static_cast<int64_t>(off));
    d->set_data(reinterpret_cast<const char*>(p.bytes.data() + off), n);
    d->set_checksum(Checksum64(p.bytes.data() + off, n));
    if (!writer->Write(c)) break;
    sent += static_cast<int64_t>(n);
  }
  return sent;
}

StatusOr<int64_t> ResumeOffset(const atl::v1::PullRequest& r, const syncer::PullPayload& p, uint64_t payload_checksum) {
  if (r.resume_offset() < 0) {
    return InvalidArgumentError("pull: resume_offset " + std::to_string(r.resume_offset()) + " is negative");
  }
  const bool same =
      !p.not_modified && r.resume_version() == p.version && r.resume_payload_checksum() == payload_checksum;
  return same && r.resume_offset() < static_cast<int64_t>(p.bytes.size()) ? r.resume_offset() : 0;
}

Status ParsePullHeader(const atl::v1::PullHeader& h, int64_t max_payload_bytes, syncer::PullPayload& out,
                       int64_t& payload_bytes, uint64_t& payload_checksum) {
  out.fragment = h.fragment();
  out.version = h.version();
  out.is_delta = h.is_delta();
  out.base_version = h.base_version();
  out.not_modified = h.not_modified();
  out.incarnation = h.incarnation();
  out.epoch = h.leader_epoch();
  out.value_checksum = h.value_checksum();
  out.block_size = h.block_size();
  if (!out.not_modified && h.encoding() != kLatticeEncoding) {
    return InvalidArgumentError("pull: unknown encoding '" + h.encoding().substr(0, 32) +
                                "' (this learner reads lattice)");
  }
  ATOLL_ASSIGN_OR_RETURN(out.compression, ParseWireCompression(h.compression()));
  payload_bytes = h.payload_bytes();
  payload_checksum = h.payload_checksum();
  if (payload_bytes < 0 || payload_bytes > max_payload_bytes || h.raw_bytes() < 0) {
    return DataLossError("pull: payload size " + std::to_string(payload_bytes) + " out of range (at most " +
                         std::to_string(max_payload_bytes) + " for this run's largest fragment)");
  }
  out.raw_bytes = static_cast<uint64_t>(h.raw_bytes());
  return Status::Ok();
}

Status PullAssembler::Add(const atl::v1::PullChunk& msg) {
  if (msg.kind_case() == atl::v1::PullChunk::kHeader) return AddHeader(msg.header());
  if (!have_header_) return DataLossError("data before the header");
  return AppendChunk(msg.data(), total_, out_.bytes);
}

Status PullAssembler::AddHeader(const atl::v1::PullHeader& h) {
  if (have_header_ && !resuming_) return DataLossError("two headers in one reply");
  const int64_t from = h.resume_offset();
  if (have_header_ && from != 0) {  // a resumed stream that continues the payload held
    resuming_ = false;
    if (from != held_bytes() || h.version() != out_.version || h.payload_bytes() != total_ ||
        h.payload_checksum() != checksum_) {
      return DataLossError("a resumed pull continued at byte " + std::to_string(from) + " of version " +
                           std::to_string(h.version()) + "; this learner holds " + std::to_string(held_bytes()) +
                           " bytes of version " + std::to_string(out_.version));
    }
    return Status::Ok();
  }
  if (from != 0) return DataLossError("a reply that starts at byte " + std::to_string(from) + " of its payload");
  resuming_ = false;
  have_header_ = true;
  out_ = {};
  ATOLL_RETURN_IF_ERROR(ParsePullHeader(h, max_payload_bytes_, out_, total_, checksum_));
  out_.bytes.reserve(static_cast<size_t>(total_));
  return Status::Ok();
}

bool PullAssembler::Resumable() const {
  return have_header_ && !out_.not_modified && held_bytes() > 0 && held_bytes() < total_;
}

void PullAssembler::Resume(atl::v1::PullRequest& request) {
  resuming_ = true;
  request.set_resume_offset(held_bytes());
  request.set_resume_version(out_.version);
  request.set_resume_payload_checksum(checksum_);
}

StatusOr<syncer::PullPayload> PullAssembler::Finish() && {
  if (!have_header_) return DataLossError("an empty reply");
  if (static_cast<int64_t>(out_.bytes.size()) != total_ || Checksum64(out_.bytes) != checksum_) {
    return DataLossError("truncated or corrupted payload");
  }
  return std::move(out_);
}

void FillJoinRequest(const syncer::JoinRequestData& r, atl::v1::JoinRequest* out) {
  out->set_protocol_version(r.protocol_version);
  out->set_run_id(r.run_id);
  out->set_model_signature(r.model_signature);
  out->set_learner_id(r.learner_id);
  out->set_host(r.host);
  out->set_rejoin(r.rejoin);
  for (uint64_t c : r.fragment_checksums) out->add_fragment_checksums(c);
  for (int64_t v : r.fragment_versions) out->add_fragment_versions(v);
  if (r.shard.count > 1) {  // unsharded: left unset, as before shards existed
    out->set_shard_index(r.shard.index);
    out->set_shard_count(r.shard.count);
  }
}

syncer::JoinRequestData ParseJoinRequest(const atl::v1::JoinRequest& r) {
  syncer::JoinRequestData d;
  d.protocol_version = r.protocol_version();
  d.run_id = r.run_id();
  d.model_signature = r.model_signature();
  d.learner_id = r.learner_id();
  d.host = TruncateUtf8(r.host(), 256);  // never cut inside a UTF-8 character
  d.rejoin = r.rejoin();
  d.fragment_checksums.assign(r.fragment_checksums().begin(), r.fragment_checksums().end());
  d.fragment_versions.assign(r.fragment_versions().begin(), r.fragment_versions().end());
  // 0: a learner that does not say (unsharded); any other value is checked by the core.
  if (r.shard_count() != 0) d.shard = {r.shard_index(), r.shard_count()};
  return d;
}

void FillHeartbeat(int learner_id, const syncer::LearnerProgress& p, atl::v1::HeartbeatRequest* out) {
  out->set_learner_id(learner_id);
  out->set_step(p.step);
  out->set_tokens(p.tokens);
  out->set_loss(p.loss);
  out->set_step_seconds(p.step_seconds);
  out->set_tokens_per_second(p.tokens_per_second);
  out->set_state(syncer::LearnerStateName(p.state));
  out->set_version_held(p.version_held);
}

StatusOr<syncer::LearnerProgress> ParseHeartbeat(const atl::v1::HeartbeatRequest& r) {
  syncer::LearnerProgress p;
  p.step = r.step();
  p.tokens = r.tokens();
  p.loss = r.loss();
  p.step_seconds = r.step_seconds();
  p.tokens_per_second = r.tokens_per_second();
  auto state = syncer::ParseLearnerState(r.state());
  if (!state.ok()) return state.status().WithContext("heartbeat");
  p.state = *state;
  p.version_held = r.version_held();
  if (!std::isfinite(p.step_seconds) || p.step_seconds < 0 || p.step < 0 || p.tokens < 0 || !std::isfinite(p.loss) ||
      !std::isfinite(p.tokens_per_second)) {
    return InvalidArgumentError("heartbeat: negative or non-finite progress values");
  }
  return p;
}

void FillHeartbeatReply(const syncer::HeartbeatReplyData& d, atl::v1::HeartbeatReply* out) {
  for (int64_t v : d.versions) out->add_fragment_versions(v);
  out->set_finish(d.finish);
  out->set_incarnation(d.incarnation);
  out->set_leader_epoch(d.epoch);
}

syncer::HeartbeatReplyData ParseHeartbeatReply(const atl::v1::HeartbeatReply& r) {
  syncer::HeartbeatReplyData d;
  d.versions.assign(r.fragment_versions().begin(), r.fragment_versions().end());
  d.finish = r.finish();
  d.incarnation = r.incarnation();
  d.epoch = r.leader_epoch();
  return d;
}

void FillPushReply(const syncer::PushResult& r, atl::v1::PushReply* out) {
  out->set_round(r.round);
  out->set_merged_version(r.merged_version);
  out->set_note(r.note);
  out->set_incarnation(r.incarnation);
  out->set_leader_epoch(r.epoch);
}

syncer::PushResult ParsePushReply(const atl::v1::PushReply& r) {
  return {r.round(), r.merged_version(), r.note(), r.incarnation(), r.leader_epoch()};
}

void FillJoinReply(const syncer::JoinReplyData& r, atl::v1::JoinReply* out) {
  out->set_learner_id(r.learner_id);
  out->set_num_fragments(static_cast<int32_t>(r.versions.size()));
  out->set_inner_steps_per_sync(r.H);
  out->set_overlap_steps(r.tau);
  for (int64_t v : r.versions) out->add_fragment_versions(v);
  for (int64_t n : r.fragment_numel) out->add_fragment_numel(n);
  out->set_uplink_encoding(diloco::EncodingName(r.uplink.encoding));
  out->set_downlink_encoding(diloco::EncodingName(r.downlink.encoding));
  out->set_block_size(r.uplink.block_size);
  out->set_compression(diloco::CompressionName(r.uplink.compression));
  out->set_mode(diloco::ModeName(r.mode));
  out->set_incarnation(r.incarnation);
  for (int64_t v : r.fragment_held) out->add_fragment_held(v);
  for (int p : r.rebuild_wanted) out->add_rebuild_wanted(p);
  for (bool m : r.fragment_initial) out->add_fragment_initial(m);
  for (int64_t v : r.merged_versions) out->add_merged_versions(v);
  out->set_push_session(r.push_session);
  out->set_leader_epoch(r.epoch);
  if (r.shard.count > 1) {  // unsharded: left unset, as before shards existed
    out->set_shard_index(r.shard.index);
    out->set_shard_count(r.shard.count);
  }
}

StatusOr<syncer::JoinReplyData> ParseJoinReply(const atl::v1::JoinReply& r) {
  syncer::JoinReplyData d;
  d.learner_id = r.learner_id();
  d.versions.assign(r.fragment_versions().begin(), r.fragment_versions().end());
  d.fragment_numel.assign(r.fragment_numel().begin(), r.fragment_numel().end());
  d.H = r.inner_steps_per_sync();
  d.tau = r.overlap_steps();
  auto mode = diloco::ParseMode(r.mode().substr(0, 32));
  if (!mode.ok()) return mode.status().WithContext("join reply");
  d.mode = *mode;
  d.incarnation = r.incarnation();
  d.fragment_held.assign(r.fragment_held().begin(), r.fragment_held().end());
  d.rebuild_wanted.assign(r.rebuild_wanted().begin(), r.rebuild_wanted().end());
  d.fragment_initial.assign(r.fragment_initial().begin(), r.fragment_initial().end());
  d.merged_versions.assign(r.merged_versions().begin(), r.merged_versions().end());
  d.push_session = r.push_session();
  d.epoch = r.leader_epoch();
  // 0: an older syncer that does not say: unsharded.
  d.shard = r.shard_count() == 0 ? syncer::ShardSpec{} : syncer::ShardSpec{r.shard_index(), r.shard_count()};
  auto up = diloco::ParseEncoding(r.uplink_encoding());
  auto down = diloco::ParseEncoding(r.downlink_encoding());
  if (!up.ok() || !down.ok()) return InvalidArgumentError("join reply: unknown encoding");
  auto comp = ParseWireCompression(r.compression());
  if (!comp.ok()) return comp.status().WithContext("join reply");
  d.uplink = {*up, r.block_size(), *comp};
  d.downlink = {*down, r.block_size(), *comp};
  return d;
}

StatusOr<std::string> ReadPem(const std::string& path, const std::string& what) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status().WithContext("reading " + what);
  if (text->find("-----BEGIN") == std::string::npos) {
    return InvalidArgumentError(what + " " + path + " is not a PEM file");
  }
  return text;
}

}  // namespace atl::transport
