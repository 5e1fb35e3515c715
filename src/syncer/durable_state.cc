#include "atoll/syncer/durable_state.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <regex>
#include <thread>
#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"
#include "atoll/core/json_file.h"
#include "atoll/core/text.h"
#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {
namespace {

// The fragment file header. Format 2 checksums the 40 bytes before `header_checksum`, so a flipped
// bit in a version or round is refused instead of served; format 1 (40 bytes, no header
// checksum) is still read.
constexpr char kMagic[8] = {'A', 'T', 'O', 'L', 'F', 'R', 'G', '2'};
constexpr char kMagicV1[8] = {'A', 'T', 'O', 'L', 'F', 'R', 'G', '1'};
struct FragmentHeader {
  char magic[8];
  int64_t version;
  int64_t round;
  int64_t numel;
  uint64_t body_checksum;
  uint64_t header_checksum;  // XXH3 of the bytes above
};
static_assert(sizeof(FragmentHeader) == 48, "the fragment file header is pinned at 48 bytes");
constexpr size_t kHeaderV1Bytes = offsetof(FragmentHeader, header_checksum);
static_assert(kHeaderV1Bytes == 40, "format 1's header is the first 40 bytes of format 2's");

// Every name a syncer writes into its state folder (besides temp files): Inspect tells a damaged
// state from a folder that is not a state at all by these.
bool IsStateFileName(const std::string& name) {
  static const std::regex kFragment(R"(fragment-\d{3,}\.bin)");
  return name == "meta.json" || name == "learners.json" || name == "eval-start.json" || name == "copies" ||
         std::regex_match(name, kFragment);
}

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

StatusOr<DurableState::Contents> DurableState::Inspect() const {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir_, ec)) return Contents::kEmpty;
  if (!fs::is_directory(dir_, ec)) return FailedPreconditionError("state folder " + dir_ + " is not a folder");
  std::vector<std::string> state, other;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    (IsStateFileName(name) ? state : other).push_back(name);
  }
  if (ec) return InvalidArgumentError("cannot read state folder " + dir_ + ": " + ec.message());
  if (std::find(state.begin(), state.end(), "meta.json") != state.end()) return Contents::kSaved;
  if (state.empty() && other.empty()) return Contents::kEmpty;
  const auto list = [](std::vector<std::string> names) {
    std::sort(names.begin(), names.end());
    std::string out;
    for (size_t i = 0; i < names.size() && i < 5; ++i) out += (i ? ", " : "") + names[i];
    return names.size() > 5 ? out + " and " + std::to_string(names.size() - 5) + " more" : out;
  };
  if (!state.empty()) {
    return FailedPreconditionError("state folder " + dir_ + " holds " + list(state) +
                                   " but no meta.json: it is damaged or incomplete, and starting over would overwrite "
                                   "its committed rounds. Put meta.json back (from a backup), or move the folder away "
                                   "to start a new run");
  }
  return FailedPreconditionError("state folder " + dir_ + " holds " + list(other) +
                                 ", which is not a syncer state: point --state at a new or empty folder");
}

std::vector<std::string> DurableState::RemoveStaleTempFiles() const {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  for (const std::string& d : {dir_, dir_ + "/copies"}) {
    auto names = atl::RemoveStaleTempFiles(d);
    if (!names.ok()) continue;
    for (const auto& n : *names) removed.push_back(d + "/" + n);
  }
  // An interrupted SaveAll's temp folder: ".<name>.init-XXXXXX" beside the state folder.
  const fs::path target = fs::path(dir_).lexically_normal();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = "." + target.filename().string() + ".init-";
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code rm;
    if (name.rfind(prefix, 0) == 0 && name.size() == prefix.size() + 6 && it->is_directory(rm) &&
        fs::remove_all(it->path(), rm) > 0) {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

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

int DurableState::RestoreCopies(SyncerCore& core) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int restored = 0;
  for (const auto& entry : fs::directory_iterator(dir_ + "/copies", ec)) {
    auto c = ReadCopyFile(entry.path().string());
    // A copy is an optimisation: a damaged or stale one is skipped (that learner fetches in full).
    const Status st = c ? core.RestoreCopy(c->header.learner, c->header.fragment, c->header.version, std::move(c->values))
                        : DataLossError("damaged");
    if (!st.ok()) {
      warnings_.push_back(entry.path().string() + " ignored (" + st.message() +
                          "): that learner fetches its fragment in full once");
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
  h.header_checksum = Checksum64(&h, kHeaderV1Bytes);
  std::memcpy(buf.data(), &h, sizeof(h));
  return WriteFileAtomic(FragmentPath(p), buf);
}

Status DurableState::WriteAllFiles(const SyncerCore& core) {
  for (int p = 0; p < core.plan().num_fragments(); ++p) ATOLL_RETURN_IF_ERROR(SaveFragment(core, p));
  ATOLL_RETURN_IF_ERROR(SaveLearners(core));
  return WriteJsonWithChecksum(dir_ + "/meta.json", Meta(core));  // last: marks the state complete
}

Status DurableState::SaveAll(const SyncerCore& core) {
  namespace fs = std::filesystem;
  ATOLL_ASSIGN_OR_RETURN(Contents contents, Inspect());
  if (contents != Contents::kEmpty) return FailedPreconditionError("state folder " + dir_ + " already holds a state");
  const fs::path target = fs::path(dir_).lexically_normal();
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  ATOLL_RETURN_IF_ERROR(MakeDirs(parent.string()));
  std::string tmp = (parent / ("." + target.filename().string() + ".init-XXXXXX")).string();
  if (::mkdtemp(tmp.data()) == nullptr) return InternalError("mkdtemp " + tmp + ": " + std::strerror(errno));
  DurableState staged(tmp);
  Status st = staged.WriteAllFiles(core);
  std::error_code ec;
  if (st.ok()) {
    fs::remove(target, ec);  // an empty folder (rename(2) would replace it too); a mount point stays
    if (::rename(tmp.c_str(), target.c_str()) == 0) {
      SyncFolder(parent.string());
      return Status::Ok();
    }
  }
  fs::remove_all(tmp, ec);
  if (!st.ok()) return st;
  // A folder that cannot be replaced (a mount point): in place, meta.json last.
  ATOLL_RETURN_IF_ERROR(MakeDirs(dir_));
  return WriteAllFiles(core);
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

StatusOr<SyncerCore::FragmentSnapshot> DurableState::ReadFragment(int p, size_t n) const {
  const std::string path = FragmentPath(p);
  auto read = ReadFile(path);
  if (!read.ok() && read.status().code() == StatusCode::kNotFound) {
    return DataLossError(path + " is missing (meta.json says this state holds it)");
  }
  ATOLL_ASSIGN_OR_RETURN(std::string bytes, std::move(read));
  FragmentHeader h{};
  const bool v1 = bytes.size() >= 8 && std::memcmp(bytes.data(), kMagicV1, 8) == 0;
  const size_t header_bytes = v1 ? kHeaderV1Bytes : sizeof(FragmentHeader);
  if (bytes.size() < header_bytes) return DataLossError(path + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
  std::memcpy(&h, bytes.data(), header_bytes);
  if (!v1 && std::memcmp(h.magic, kMagic, 8) != 0) return DataLossError(path + " is not a syncer fragment file (bad magic)");
  if (!v1 && Checksum64(&h, kHeaderV1Bytes) != h.header_checksum) {
    return DataLossError(path + " is corrupted: header checksum mismatch (its version, round or size is damaged)");
  }
  if (h.numel != static_cast<int64_t>(n)) {
    return DataLossError(path + " holds " + std::to_string(h.numel) + " values, the plan " + std::to_string(n));
  }
  if (bytes.size() != header_bytes + 2 * n * sizeof(float)) {
    return DataLossError(path + " is truncated: " + std::to_string(bytes.size()) + " bytes, expected " +
                         std::to_string(header_bytes + 2 * n * sizeof(float)));
  }
  const char* body = bytes.data() + header_bytes;
  if (Checksum64(body, 2 * n * sizeof(float)) != h.body_checksum) {
    return DataLossError(path + " is corrupted: checksum mismatch");
  }
  if (h.version < 0 || h.round < 0) {
    return DataLossError(path + " is corrupted: version " + std::to_string(h.version) + ", round " + std::to_string(h.round));
  }
  SyncerCore::FragmentSnapshot s;
  s.version = h.version;
  s.round = h.round;
  s.theta.resize(n);
  s.momentum.resize(n);
  std::memcpy(s.theta.data(), body, n * sizeof(float));
  std::memcpy(s.momentum.data(), body + n * sizeof(float), n * sizeof(float));
  return s;
}

// A fragment file beyond the plan means the folder is not what its meta.json describes.
Status DurableState::CheckNoStrayFragments(int num_fragments) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir_, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!IsStateFileName(name) || name.rfind("fragment-", 0) != 0) continue;
    const long p = std::strtol(name.c_str() + 9, nullptr, 10);
    if (p >= num_fragments || fs::path(FragmentPath(static_cast<int>(p))).filename() != name) {
      return DataLossError(dir_ + " holds " + name + ", which is not one of the " + std::to_string(num_fragments) +
                           " fragments its meta.json describes: the folder is inconsistent");
    }
  }
  if (ec) return InvalidArgumentError("cannot read state folder " + dir_ + ": " + ec.message());
  return Status::Ok();
}

Status DurableState::Restore(SyncerCore& core, TimePoint now) {
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
  ATOLL_RETURN_IF_ERROR(CheckNoStrayFragments(core.plan().num_fragments()));
  // Read and verify everything before changing anything.
  std::vector<SyncerCore::FragmentSnapshot> snaps;
  int64_t fragment_rounds = 0;
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    ATOLL_ASSIGN_OR_RETURN(auto snap, ReadFragment(p, static_cast<size_t>(core.plan().fragments[static_cast<size_t>(p)].numel)));
    fragment_rounds += snap.round;
    snaps.push_back(std::move(snap));
  }
  LearnerTable table = ReadLearnerTable(fragment_rounds);
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    ATOLL_RETURN_IF_ERROR(core.RestoreFragment(p, std::move(snaps[static_cast<size_t>(p)])));
  }
  core.RestoreLearners(table.rows, now);
  core.set_rounds_closed(table.rounds_closed);
  return Status::Ok();
}

DurableState::LearnerTable DurableState::ReadLearnerTable(int64_t fragment_rounds) {
  const std::string path = dir_ + "/learners.json";
  auto lj = ReadJsonWithChecksum(path);
  Status st = lj.status();
  if (lj.ok()) {
    try {  // a well-checksummed file with fields of the wrong type is damaged, not a crash
      return ReadLearnerRows(*lj);
    } catch (const nlohmann::json::exception& e) {
      st = DataLossError(path + " holds fields of the wrong type: " + e.what());
    }
  }
  if (st.code() != StatusCode::kNotFound) {
    warnings_.push_back(st.message() + ": ignored; the learner table is rebuilt as learners rejoin. Lost: each learner's "
                        "accounting (tokens merged, rounds joined, bytes) and which of its pushes were merged, so "
                        "learners push that work again (counted twice at most); rounds_closed recounted from the "
                        "fragments (" + std::to_string(fragment_rounds) + ")");
  }
  return {{}, fragment_rounds};
}

DurableState::LearnerTable DurableState::ReadLearnerRows(const nlohmann::json& lj) {
  LearnerTable t;
  t.rounds_closed = lj.value("rounds_closed", int64_t{0});
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
    if (l.id >= 0) t.rows[l.id] = l;
  }
  return t;
}

std::optional<double> DurableState::SavedStartEval() {
  const std::string path = dir_ + "/eval-start.json";
  auto j = ReadJsonWithChecksum(path);
  if (!j.ok() && j.status().code() == StatusCode::kNotFound) return std::nullopt;
  if (!j.ok() && FileExists(path)) {  // written before it carried a checksum: {"loss": x} alone
    auto text = ReadFile(path);
    auto plain = nlohmann::json::parse(text.ok() ? *text : std::string(), nullptr, false);
    if (plain.is_object() && plain.size() == 1 && plain.contains("loss")) j = plain;
  }
  if (j.ok() && j->contains("loss") && (*j)["loss"].is_number() && std::isfinite((*j)["loss"].get<double>())) {
    return (*j)["loss"].get<double>();
  }
  warnings_.push_back((j.ok() ? path + " holds no finite loss" : j.status().message()) +
                      ": ignored; the initial model is evaluated again");
  return std::nullopt;
}

Status DurableState::SaveStartEval(double loss) {
  return WriteJsonWithChecksum(dir_ + "/eval-start.json", {{"loss", loss}});
}

}  // namespace atl::syncer
