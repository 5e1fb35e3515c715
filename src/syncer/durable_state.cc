#include "atoll/syncer/durable_state.h"

#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/json_file.h"
#include "atoll/core/text.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {
namespace {

// Fragment files. "ATOLFRG2" (written): the header below, self-checksummed, then Θ_p, the
// Nesterov buffer (when the outer step keeps one), the public copy Φ_p and its lattice exponents
// (docs/decisions/014). "ATOLFRG1" (read, from older versions): a 40-byte header, Θ_p, the buffer.
constexpr char kMagic1[8] = {'A', 'T', 'O', 'L', 'F', 'R', 'G', '1'};
constexpr char kMagic2[8] = {'A', 'T', 'O', 'L', 'F', 'R', 'G', '2'};
struct FragmentHeader1 {
  char magic[8];
  int64_t version;
  int64_t round;
  int64_t numel;
  uint64_t body_checksum;
};
static_assert(sizeof(FragmentHeader1) == 40, "the version-1 fragment header is pinned at 40 bytes");
constexpr uint32_t kHasMomentum = 1, kHasPublicCopy = 2;
struct FragmentHeader2 {
  char magic[8];
  int64_t version;
  int64_t round;
  int64_t numel;
  uint32_t flags;           // kHasMomentum | kHasPublicCopy
  uint32_t lattice_blocks;  // exponents after the values (with kHasPublicCopy)
  double sweep_share;
  uint64_t body_checksum;
  uint64_t header_checksum;  // XXH3 of the 56 bytes before it
};
static_assert(sizeof(FragmentHeader2) == 64, "the fragment header is pinned at 64 bytes");

size_t BodyBytes(const FragmentHeader2& h) {
  const size_t n = static_cast<size_t>(h.numel);
  size_t vectors = 1 + ((h.flags & kHasMomentum) ? 1 : 0) + ((h.flags & kHasPublicCopy) ? 1 : 0);
  return vectors * n * sizeof(float) + ((h.flags & kHasPublicCopy) ? h.lattice_blocks : 0);
}

// Reads one fragment file of `n` values; DataLoss naming `path` for anything but a whole, intact file.
StatusOr<SyncerCore::FragmentSnapshot> ReadFragmentFile(const std::string& path, size_t n) {
  auto read = ReadFile(path);
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  SyncerCore::FragmentSnapshot s;
  const auto floats = [&](const char* at, std::vector<float>& out) {
    out.resize(n);
    if (n > 0) std::memcpy(out.data(), at, n * sizeof(float));
  };
  if (bytes.size() >= sizeof(FragmentHeader1) && std::memcmp(bytes.data(), kMagic1, 8) == 0) {
    FragmentHeader1 h{};
    std::memcpy(&h, bytes.data(), sizeof(h));
    if (h.numel != static_cast<int64_t>(n) || bytes.size() != sizeof(h) + 2 * n * sizeof(float)) {
      return DataLossError(path + " holds " + std::to_string(bytes.size()) + " bytes, not " + std::to_string(n) + " values");
    }
    const char* body = bytes.data() + sizeof(h);
    if (Checksum64(body, 2 * n * sizeof(float)) != h.body_checksum) return DataLossError(path + " is corrupted: checksum mismatch");
    s.version = h.version;
    s.round = h.round;
    floats(body, s.theta);
    floats(body + n * sizeof(float), s.momentum);
    return s;
  }
  FragmentHeader2 h{};
  if (bytes.size() < sizeof(h)) return DataLossError(path + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic2, 8) != 0) return DataLossError(path + " is not a syncer fragment file (bad magic)");
  if (Checksum64(bytes.data(), offsetof(FragmentHeader2, header_checksum)) != h.header_checksum) {
    return DataLossError(path + " is corrupted: its header checksum does not match");
  }
  if (h.numel != static_cast<int64_t>(n)) {
    return DataLossError(path + " holds " + std::to_string(h.numel) + " values, the plan " + std::to_string(n));
  }
  if (bytes.size() != sizeof(h) + BodyBytes(h)) {
    return DataLossError(path + " is truncated: " + std::to_string(bytes.size()) + " bytes, expected " +
                         std::to_string(sizeof(h) + BodyBytes(h)));
  }
  const char* body = bytes.data() + sizeof(h);
  if (Checksum64(body, BodyBytes(h)) != h.body_checksum) return DataLossError(path + " is corrupted: checksum mismatch");
  s.version = h.version;
  s.round = h.round;
  s.sweep_share = h.sweep_share;
  floats(body, s.theta);
  body += n * sizeof(float);
  if (h.flags & kHasMomentum) {
    floats(body, s.momentum);
    body += n * sizeof(float);
  }
  if (h.flags & kHasPublicCopy) {
    floats(body, s.public_values);
    body += n * sizeof(float);
    s.lattice_exp.resize(h.lattice_blocks);
    if (h.lattice_blocks > 0) std::memcpy(s.lattice_exp.data(), body, h.lattice_blocks);
  }
  return s;
}

nlohmann::json Meta(const SyncerCore& core) {
  nlohmann::json meta = {{"format", "atoll-syncer-state/1"},
                         {"run_id", core.options().run_id},
                         {"model_signature", ChecksumHex(diloco::ModelSignature(core.plan().tensors))},
                         {"plan", ChecksumHex(PlanFingerprint(core.plan()))},
                         {"fragments", core.plan().num_fragments()}};
  // A shard's state holds the committed values of its own fragments only (the others stay at
  // Θ⁰ there): it must never be resumed as another shard or as an unsharded syncer.
  if (core.options().shard.count > 1) meta["shard"] = core.options().shard.ToString();
  return meta;
}

}  // namespace

uint64_t PlanFingerprint(const diloco::FragmentPlan& plan) {
  Hasher h;
  for (const auto& f : plan.fragments) {
    int64_t hdr[2] = {f.index, f.numel};
    h.Update(hdr, sizeof(hdr));
    for (const auto& s : f.slices) {
      int64_t v[3] = {s.tensor, s.offset, s.count};
      h.Update(v, sizeof(v));
    }
  }
  return h.Digest();
}

std::string DurableState::FragmentPath(int p) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/fragment-%03d.bin", p);
  return dir_ + name;
}

bool DurableState::Exists() const { return FileExists(dir_ + "/meta.json"); }

Status DurableState::SaveFragment(const SyncerCore& core, int p) {
  Status st;
  for (int attempt = 0; attempt < kCommitAttempts; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10 << (attempt - 1)));
    st = WriteFragment(core, p);
    if (st.code() != StatusCode::kUnavailable) return st;
  }
  return st.WithContext("after " + std::to_string(kCommitAttempts) + " attempts");
}

Status DurableState::WriteFragment(const SyncerCore& core, int p) {
  auto snap = core.SnapshotFragment(p);
  const size_t n = snap.theta.size();
  FragmentHeader2 h{};
  std::memcpy(h.magic, kMagic2, 8);
  h.version = snap.version;
  h.round = snap.round;
  h.numel = static_cast<int64_t>(n);
  h.flags = (snap.momentum.empty() ? 0 : kHasMomentum) | (snap.public_values.empty() ? 0 : kHasPublicCopy);
  h.lattice_blocks = static_cast<uint32_t>(snap.lattice_exp.size());
  h.sweep_share = snap.sweep_share;
  std::vector<std::byte> buf(sizeof(h) + BodyBytes(h));
  std::byte* body = buf.data() + sizeof(h);
  for (const std::vector<float>* v : {&snap.theta, &snap.momentum, &snap.public_values}) {
    if (!v->empty()) std::memcpy(body, v->data(), v->size() * sizeof(float));  // momentum may be absent
    body += v->size() * sizeof(float);
  }
  if (!snap.lattice_exp.empty()) std::memcpy(body, snap.lattice_exp.data(), snap.lattice_exp.size());
  h.body_checksum = Checksum64(buf.data() + sizeof(h), BodyBytes(h));
  h.header_checksum = Checksum64(&h, offsetof(FragmentHeader2, header_checksum));
  std::memcpy(buf.data(), &h, sizeof(h));
  return WriteFileAtomic(FragmentPath(p), buf);
}

Status DurableState::SaveAll(const SyncerCore& core) {
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir_));
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    if (core.owns(p)) ATOLL_RETURN_IF_ERROR(SaveFragment(core, p));
  }
  ATOLL_RETURN_IF_ERROR(SaveLearners(core));
  return WriteJsonWithChecksum(dir_ + "/meta.json", Meta(core));  // last: marks the state complete
}

Status DurableState::SaveLearners(const SyncerCore& core) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [id, l] : core.learners()) {
    rows.push_back({{"id", id}, {"host", l.host}, {"state", LearnerStateName(l.state)}, {"joins", l.joins},
                    {"step", l.step}, {"tokens", l.tokens}, {"bytes_up", l.bytes_up},
                    {"bytes_down", l.bytes_down}, {"pushes", l.pushes},
                    {"pushes_rejected", l.pushes_rejected}, {"rounds_joined", l.rounds_joined},
                    {"late_folded", l.late_folded}, {"tokens_merged", l.tokens_merged},
                    {"merged_versions", l.merged_versions}});
  }
  return WriteJsonWithChecksum(dir_ + "/learners.json",
                              {{"learners", rows}, {"rounds_closed", core.rounds_closed()}});
}

Status DurableState::Restore(SyncerCore& core, TimePoint now) const {
  ATOLL_ASSIGN_OR_RETURN(auto meta, ReadJsonWithChecksum(dir_ + "/meta.json"));
  const auto want = Meta(core);
  for (const char* key : {"run_id", "model_signature", "plan", "fragments", "shard"}) {
    const nlohmann::json wanted = want.value(key, nlohmann::json());
    if (meta.value(key, nlohmann::json()) != wanted) {
      return FailedPreconditionError("saved state in " + dir_ + " belongs to another " +
                                     std::string(key) + " (" + DumpJson(meta.value(key, nlohmann::json())) +
                                     " vs this syncer's " + DumpJson(wanted) + ")");
    }
  }
  // Read and verify everything before changing anything.
  std::vector<SyncerCore::FragmentSnapshot> snaps;
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    if (!core.owns(p)) continue;  // another shard's
    const std::string path = FragmentPath(p);
    const size_t n = static_cast<size_t>(core.plan().fragments[static_cast<size_t>(p)].numel);
    ATOLL_ASSIGN_OR_RETURN(auto snap, ReadFragmentFile(path, n));
    snaps.push_back(std::move(snap));
  }
  std::map<int, LearnerRecord> table;
  int64_t rounds_closed = 0;
  if (auto lj = ReadJsonWithChecksum(dir_ + "/learners.json"); lj.ok()) {
    try {  // a well-checksummed file with fields of the wrong type is corrupt, not a crash
      ReadLearnerRows(*lj, table, rounds_closed);
    } catch (const nlohmann::json::exception& e) {
      return DataLossError(dir_ + "/learners.json is corrupted: " + e.what());
    }
  } else if (lj.status().code() != StatusCode::kNotFound) {
    return lj.status();
  }
  // RestoreFragment validates everything before it changes a fragment; a failure part-way (a
  // damaged later file's values) leaves earlier fragments restored, so check them all first.
  for (size_t i = 0, p = 0; p < static_cast<size_t>(core.plan().num_fragments()); ++p) {
    if (!core.owns(static_cast<int>(p))) continue;
    ATOLL_RETURN_IF_ERROR(core.RestoreFragment(static_cast<int>(p), std::move(snaps[i++])));
  }
  core.RestoreLearners(table, now);
  core.set_rounds_closed(rounds_closed);
  return Status::Ok();
}

void DurableState::ReadLearnerRows(const nlohmann::json& lj, std::map<int, LearnerRecord>& table,
                                   int64_t& rounds_closed) {
  rounds_closed = lj.value("rounds_closed", int64_t{0});
    for (const auto& r : lj.value("learners", nlohmann::json::array())) {
      LearnerRecord l;
      l.id = r.value("id", -1);
      l.host = r.value("host", "");
      l.state = ParseLearnerState(r.value("state", "joining")).value_or(LearnerState::kJoining);
      l.joins = r.value("joins", 0);
      l.step = r.value("step", int64_t{0});
      l.tokens = r.value("tokens", int64_t{0});
      l.bytes_up = r.value("bytes_up", int64_t{0});
      l.bytes_down = r.value("bytes_down", int64_t{0});
      l.pushes = r.value("pushes", int64_t{0});
      l.pushes_rejected = r.value("pushes_rejected", int64_t{0});
      l.rounds_joined = r.value("rounds_joined", int64_t{0});
      l.late_folded = r.value("late_folded", int64_t{0});
      l.tokens_merged = r.value("tokens_merged", 0.0);
      l.merged_versions = r.value("merged_versions", std::vector<int64_t>{});
      if (l.id >= 0) table[l.id] = l;
    }
}

}  // namespace atl::syncer
