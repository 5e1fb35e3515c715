// The syncer's service interface: the messages of the atl.v1 protocol as C++ values and the
// abstract SyncerApi that SyncerLoop implements in process and the gRPC client over the network.
// It sits below both the syncer and the learner, so a learner links no syncer implementation
// (docs/architecture.md). docs/wire-protocol.md describes each message on the wire.
// Thread-safety: values; implementations of SyncerApi say their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/mode.h"
#include "atoll/exchange/lattice.h"

namespace atl::syncer {

// 2: the downlink carries lattice deltas of one shared public copy (docs/decisions/014).
// 3: value checksums hash 64 KiB pieces (exchange::ValuesChecksum, docs/decisions/018).
// 4: a push carries the push session its learner's join was given and a sequence number
// (replays are refused: docs/decisions/019).
// 5: a join says the version of each copy it holds, and a rebuilding syncer asks for the copies it
// wants (docs/decisions/021). A syncer still takes joins of version 4 (they offer no copies).
// 6: every reply carries the leadership epoch of the syncer that sent it (docs/decisions/022).
inline constexpr uint32_t kProtocolVersion = 6;
inline constexpr uint32_t kOldestProtocolVersion = 4;

// A sharded syncer (docs/decisions/011): shard `index` of `count` owns the fragments p with
// p mod count = index, and a learner joins every shard. count = 1 (index 0) is the one
// unsharded syncer.
struct ShardSpec {
  int index = 0, count = 1;
  bool owns(int fragment) const { return fragment % count == index; }
  std::string ToString() const { return std::to_string(index) + "/" + std::to_string(count); }
};
// Parses "i/S" (0 ≤ i < S, 1 ≤ S ≤ kMaxShards); InvalidArgument saying what is wrong otherwise.
inline constexpr int kMaxShards = 1024;
StatusOr<ShardSpec> ParseShardSpec(std::string_view text);
// The shard that owns `fragment` when there are `count` shards.
inline int OwnerShard(int fragment, int count) { return fragment % count; }

// Where a learner is in its life, as the syncer's table and the heartbeats say it.
enum class LearnerState { kJoining, kTraining, kDone };
inline constexpr EnumNames<LearnerState, 3> kLearnerStateNames{
    "learner state",
    {{{LearnerState::kJoining, "joining"}, {LearnerState::kTraining, "training"}, {LearnerState::kDone, "done"}}}};
constexpr const auto& NamesOf(LearnerState) { return kLearnerStateNames; }
inline const char* LearnerStateName(LearnerState s) { return kLearnerStateNames.Name(s); }
inline StatusOr<LearnerState> ParseLearnerState(std::string_view s) { return kLearnerStateNames.Parse(s); }

// What a learner reports in a heartbeat.
struct LearnerProgress {
  int64_t step = 0, tokens = 0;
  double loss = 0, step_seconds = 0, tokens_per_second = 0;
  int64_t version_held = -1;  // newest fragment version the learner holds
  LearnerState state = LearnerState::kTraining;
};

struct JoinRequestData {
  uint32_t protocol_version = 0;
  std::string run_id;
  uint64_t model_signature = 0;
  int learner_id = -1;
  std::string host;
  bool rejoin = false;
  std::vector<uint64_t> fragment_checksums;  // of the values the learner holds; empty: unknown
  // The shard this learner believes it is joining (index/count; {0, 1}: an unsharded syncer). A
  // syncer refuses a learner whose count or index differs from its own (FailedPrecondition).
  ShardSpec shard;
  // Per fragment, the version of the public copy whose checksum fragment_checksums holds (-1: no
  // copy, or the run's initial values); empty: not said (protocol 4). A rebuilding syncer asks for
  // the copies newer than its own (JoinReplyData::rebuild_wanted).
  std::vector<int64_t> fragment_versions;
};

struct JoinReplyData {
  int learner_id = -1;
  std::vector<int64_t> versions;
  std::vector<int64_t> fragment_numel;
  int H = 0, tau = 0;
  diloco::Mode mode = diloco::Mode::kDecoupled;
  diloco::CodecOptions uplink, downlink;
  uint64_t incarnation = 0;
  // Per fragment, the version of the public copy the learner's join checksum matched (-1: none):
  // it holds that version without a pull, and its catch-up is one delta from it.
  std::vector<int64_t> fragment_held;
  // The learner's checksum matched the run's initial values Θ⁰_p: it holds version 0 once it has
  // snapped them to their lattice (exchange::SnapToLattice). fragment_held says 0 then.
  std::vector<bool> fragment_initial;
  // Per fragment, the newest version that merged a push of this learner (-1: none); empty from a
  // syncer that does not say.
  std::vector<int64_t> merged_versions;
  ShardSpec shard;  // the syncer's shard (index/count); {0, 1} for an unsharded syncer
  // The push session of this join (never 0): every push until the learner's next join carries it,
  // with sequence numbers that increase (docs/decisions/019).
  uint64_t push_session = 0;
  // A rebuilding syncer (docs/decisions/021): the fragments whose public copy it wants from this
  // learner (held at a version newer than the syncer's). The learner offers each (a push with
  // public_copy set), then joins again.
  std::vector<int> rebuild_wanted;
  // The leadership epoch of the syncer that answered (0: no leadership, docs/decisions/022); the
  // same field in every reply below. Set by the transport, not the core.
  uint64_t epoch = 0;
};

struct HeartbeatReplyData {
  std::vector<int64_t> versions;
  bool finish = false;
  uint64_t incarnation = 0;
  uint64_t epoch = 0;
};

struct PushHeaderData {
  int learner_id = -1;
  int fragment = -1;
  int64_t base_version = -1;
  int64_t c_tokens = 0, c_steps = 0;
  diloco::Encoding encoding = diloco::Encoding::kInt4;
  int block_size = 0;
  int64_t num_values = 0;
  int64_t local_step = 0;
  diloco::Compression compression = diloco::Compression::kNone;  // the payload's lossless stage
  // The learner's end-of-training sync: everything it trained on this fragment since its last
  // receipt, c_steps < H steps of it. Its round counts it as a whole span of work (TokenShare).
  bool final_sync = false;
  // Bytes the transport received for this push (header and payload), counted in the learner's
  // bytes_up by the same call that admits it; 0 in process.
  int64_t wire_bytes = 0;
  // The push session of the learner's latest join, and this push's sequence number in it: above
  // every number the syncer has judged in that session. A push of another session is refused
  // (NotFound: join again), one whose number was used (a replay) too (AlreadyExists).
  uint64_t push_session = 0;
  uint64_t push_seq = 0;
  // Not an outer gradient: the learner's public copy Φ_p at version base_version, offered to a
  // rebuilding syncer (docs/decisions/021). The payload is the raw fp32 values (little-endian,
  // num_values of them), encoding fp32, compression none; c_tokens and c_steps are 0.
  bool public_copy = false;
};

struct PushResult {
  int64_t round = 0;
  int64_t merged_version = 0;  // the version of the fragment that will include this push
  std::string note;
  uint64_t incarnation = 0;  // of the syncer that accepted it (0: not said)
  uint64_t epoch = 0;
};

struct PullPayload {
  int fragment = 0;
  int64_t version = 0;
  bool not_modified = false;
  bool is_delta = false;  // a lattice delta from base_version; else the full copy
  int64_t base_version = -1;
  int block_size = 0;  // the lattice's block
  diloco::Compression compression = diloco::Compression::kNone;
  uint64_t raw_bytes = 0;        // the payload's size before compression
  std::vector<std::byte> bytes;  // (compressed) lattice delta, or exponents + codes of Φ
  uint64_t value_checksum = 0;   // of Φ at `version`
  uint64_t incarnation = 0;      // of the syncer that answered
  uint64_t epoch = 0;
};

// One pull reply shared by the syncer's cache and every learner it is being sent to.
using SharedPull = std::shared_ptr<const PullPayload>;

// Learner side of a pull: brings `copy` (Φ, held at `have_version` on `lattice`) to the payload's
// version — a lattice delta from `have_version`, or the full copy, which also sets `lattice` —
// and checks the value checksum, so both sides hold the same bits. DataLoss (copy and lattice
// unchanged) for a delta against another version or another lattice, a payload larger than its
// kind can be, a malformed payload, or values that differ from the syncer's (the caller then
// fetches in full). Not for not_modified payloads. `previous`, when given, receives the copy as it
// was before (no extra copy is made: the old buffer is moved there).
Status ApplyPulled(const PullPayload& payload, int64_t have_version, size_t numel, std::vector<float>& copy,
                   exchange::Lattice& lattice, std::vector<float>* previous = nullptr);

// The operations a learner needs from a syncer; implemented by SyncerLoop (in process), the gRPC
// client, and the WAN shaper that decorates either.
class SyncerApi {
 public:
  virtual ~SyncerApi() = default;
  virtual StatusOr<JoinReplyData> Join(const JoinRequestData& request) = 0;
  virtual StatusOr<HeartbeatReplyData> Heartbeat(int learner_id, const LearnerProgress& progress) = 0;
  virtual StatusOr<PushResult> Push(const PushHeaderData& header, std::span<const std::byte> payload) = 0;
  // Fragment `fragment` for a learner holding it at `have_version` (-1: none). `want_version`:
  // the oldest version worth sending (a learner waiting for the merge of its own push names that
  // version, so rounds in between cost no download); ≤ have_version + 1 means any newer one.
  // A bounded long poll of up to `wait_seconds`; not_modified when nothing wanted arrived.
  virtual StatusOr<PullPayload> Pull(int learner_id, int fragment, int64_t have_version, double wait_seconds,
                                     int64_t want_version) = 0;
  // The learner is done (or shutting down) and leaves the run: it stops counting as live at once,
  // instead of after the learner timeout. NotFound for a learner that never joined.
  virtual Status Leave(int learner_id) = 0;
};

}  // namespace atl::syncer
