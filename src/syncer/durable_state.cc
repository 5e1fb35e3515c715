#include "atoll/syncer/durable_state.h"

#include <chrono>
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

constexpr char kMagic[8] = {'A', 'T', 'O', 'L', 'F', 'R', 'G', '1'};
struct FragmentHeader {
  char magic[8];
  int64_t version;
  int64_t round;
  int64_t numel;
  uint64_t body_checksum;
};
static_assert(sizeof(FragmentHeader) == 40, "the fragment file header is pinned at 40 bytes");

constexpr char kCopyMagic[8] = {'A', 'T', 'O', 'L', 'C', 'P', 'Y', '1'};
struct CopyHeader {
  char magic[8];
  int32_t learner;
  int32_t fragment;
  int64_t version;
  int64_t numel;
  uint64_t values_checksum;  // exchange::ValuesChecksum of the values (what a learner reports at join)
};
static_assert(sizeof(CopyHeader) == 40, "the copy file header is pinned at 40 bytes");

// Reads one copy file; nullopt when it is not a whole, intact copy file.
struct CopyFile {
  CopyHeader header;
  std::vector<float> values;
};
std::optional<CopyFile> ReadCopyFile(const std::string& path) {
  auto bytes = ReadFile(path);
  if (!bytes.ok() || bytes->size() < sizeof(CopyHeader)) return std::nullopt;
  CopyFile c{};
  std::memcpy(&c.header, bytes->data(), sizeof(CopyHeader));
  if (std::memcmp(c.header.magic, kCopyMagic, 8) != 0 || c.header.numel < 0 ||
      bytes->size() != sizeof(CopyHeader) + static_cast<size_t>(c.header.numel) * sizeof(float)) {
    return std::nullopt;
  }
  c.values.resize(static_cast<size_t>(c.header.numel));
  std::memcpy(c.values.data(), bytes->data() + sizeof(CopyHeader), c.values.size() * sizeof(float));
  if (exchange::ValuesChecksum(c.values) != c.header.values_checksum) return std::nullopt;
  return c;
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

std::string DurableState::CopyPath(int learner, int fragment) const {
  char name[64];
  std::snprintf(name, sizeof(name), "/copies/learner-%d-fragment-%03d.bin", learner, fragment);
  return dir_ + name;
}

Status DurableState::SaveCopies(const SyncerCore& core) {
  const auto dirty = core.TakeDirtyCopies();
  if (dirty.empty()) return Status::Ok();
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir_ + "/copies"));
  for (const auto& [learner, fragment] : dirty) {
    const std::span<const float> values = core.learner_copy(learner, fragment);
    CopyHeader h{};
    std::memcpy(h.magic, kCopyMagic, 8);
    h.learner = learner;
    h.fragment = fragment;
    h.version = core.learner_copy_version(learner, fragment);
    h.numel = static_cast<int64_t>(values.size());
    h.values_checksum = exchange::ValuesChecksum(values);
    std::vector<std::byte> buf(sizeof(h) + values.size() * sizeof(float));
    std::memcpy(buf.data(), &h, sizeof(h));
    std::memcpy(buf.data() + sizeof(h), values.data(), values.size() * sizeof(float));
    // No fsync: a copy is a cache verified by its checksum and the learner's at rejoin, and this
    // runs on the syncer's loop thread at every commit.
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(CopyPath(learner, fragment), buf, Durability::kNoSync));
  }
  return Status::Ok();
}

int DurableState::RestoreCopies(SyncerCore& core) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  int restored = 0;
  for (const auto& entry : fs::directory_iterator(dir_ + "/copies", ec)) {
    auto c = ReadCopyFile(entry.path().string());
    // A copy is an optimisation: a damaged or stale one is skipped (that learner fetches in full).
    if (!c || !core.RestoreCopy(c->header.learner, c->header.fragment, c->header.version, std::move(c->values)).ok()) {
      continue;
    }
    ++restored;
  }
  return restored;
}

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
  std::vector<std::byte> buf(sizeof(FragmentHeader) + 2 * n * sizeof(float));
  FragmentHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = snap.version;
  h.round = snap.round;
  h.numel = static_cast<int64_t>(n);
  std::byte* body = buf.data() + sizeof(FragmentHeader);
  std::memcpy(body, snap.theta.data(), n * sizeof(float));
  std::memcpy(body + n * sizeof(float), snap.momentum.data(), n * sizeof(float));
  h.body_checksum = Checksum64(body, 2 * n * sizeof(float));
  std::memcpy(buf.data(), &h, sizeof(h));
  return WriteFileAtomic(FragmentPath(p), buf);
}

Status DurableState::SaveAll(const SyncerCore& core) {
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir_));
  for (int p = 0; p < core.plan().num_fragments(); ++p) ATOLL_RETURN_IF_ERROR(SaveFragment(core, p));
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
    const std::string path = FragmentPath(p);
    ATOLL_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    FragmentHeader h{};
    const size_t n = static_cast<size_t>(core.plan().fragments[static_cast<size_t>(p)].numel);
    if (bytes.size() < sizeof(h)) return DataLossError(path + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
    std::memcpy(&h, bytes.data(), sizeof(h));
    if (std::memcmp(h.magic, kMagic, 8) != 0) return DataLossError(path + " is not a syncer fragment file (bad magic)");
    if (h.numel != static_cast<int64_t>(n)) {
      return DataLossError(path + " holds " + std::to_string(h.numel) + " values, the plan " + std::to_string(n));
    }
    if (bytes.size() != sizeof(h) + 2 * n * sizeof(float)) {
      return DataLossError(path + " is truncated: " + std::to_string(bytes.size()) + " bytes, expected " +
                           std::to_string(sizeof(h) + 2 * n * sizeof(float)));
    }
    const char* body = bytes.data() + sizeof(h);
    if (Checksum64(body, 2 * n * sizeof(float)) != h.body_checksum) {
      return DataLossError(path + " is corrupted: checksum mismatch");
    }
    SyncerCore::FragmentSnapshot s;
    s.version = h.version;
    s.round = h.round;
    s.theta.resize(n);
    s.momentum.resize(n);
    std::memcpy(s.theta.data(), body, n * sizeof(float));
    std::memcpy(s.momentum.data(), body + n * sizeof(float), n * sizeof(float));
    snaps.push_back(std::move(s));
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
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    ATOLL_RETURN_IF_ERROR(core.RestoreFragment(p, std::move(snaps[static_cast<size_t>(p)])));
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
