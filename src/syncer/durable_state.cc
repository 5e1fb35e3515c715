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

// `n` floats at `at` into `out`.
void ReadFloats(const char* at, size_t n, std::vector<float>& out) {
  out.resize(n);
  if (n > 0) std::memcpy(out.data(), at, n * sizeof(float));
}

// A version-1 file (ATOLFRG1: Θ and momentum, header without a checksum), as written before the
// public copy was saved.
StatusOr<SyncerCore::FragmentSnapshot> ReadFragmentFile1(const std::string& path, const std::string& bytes, size_t n) {
  FragmentHeader1 h{};
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.numel != static_cast<int64_t>(n) || bytes.size() != sizeof(h) + 2 * n * sizeof(float)) {
    return DataLossError(path + " holds " + std::to_string(bytes.size()) + " bytes, not " + std::to_string(n) +
                         " values");
  }
  const char* body = bytes.data() + sizeof(h);
  if (Checksum64(body, 2 * n * sizeof(float)) != h.body_checksum)
    return DataLossError(path + " is corrupted: checksum mismatch");
  SyncerCore::FragmentSnapshot s;
  s.version = h.version;  // h.round: always the version
  ReadFloats(body, n, s.theta);
  ReadFloats(body + n * sizeof(float), n, s.momentum);
  return s;
}

// The checked header of a version-2 file.
StatusOr<FragmentHeader2> ReadHeader2(const std::string& path, const std::string& bytes, size_t n) {
  FragmentHeader2 h{};
  if (bytes.size() < sizeof(h))
    return DataLossError(path + " is truncated (" + std::to_string(bytes.size()) + " bytes)");
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
  if (Checksum64(bytes.data() + sizeof(h), BodyBytes(h)) != h.body_checksum) {
    return DataLossError(path + " is corrupted: checksum mismatch");
  }
  if (h.version < 0 || h.round < 0) {
    return DataLossError(path + " is corrupted: version " + std::to_string(h.version) + ", round " +
                         std::to_string(h.round));
  }
  return h;
}

// Reads one fragment file of `n` values; DataLoss naming `path` for anything but a whole, intact file.
StatusOr<SyncerCore::FragmentSnapshot> ReadFragmentFile(const std::string& path, size_t n) {
  auto read = ReadFile(path);
  if (!read.ok() && read.status().code() == StatusCode::kNotFound) {
    return DataLossError(path + " is missing (meta.json says this state holds it)");
  }
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  if (bytes.size() >= sizeof(FragmentHeader1) && std::memcmp(bytes.data(), kMagic1, 8) == 0) {
    return ReadFragmentFile1(path, bytes, n);
  }
  ATOLL_ASSIGN_OR_RETURN(const FragmentHeader2 h, ReadHeader2(path, bytes, n));
  SyncerCore::FragmentSnapshot s;
  s.version = h.version;  // h.round: always the version
  s.sweep_share = h.sweep_share;
  const char* body = bytes.data() + sizeof(h);
  ReadFloats(body, n, s.theta);
  body += n * sizeof(float);
  if (h.flags & kHasMomentum) {
    ReadFloats(body, n, s.momentum);
    body += n * sizeof(float);
  }
  if (h.flags & kHasPublicCopy) {
    ReadFloats(body, n, s.public_values);
    body += n * sizeof(float);
    s.lattice_exp.resize(h.lattice_blocks);
    if (h.lattice_blocks > 0) std::memcpy(s.lattice_exp.data(), body, h.lattice_blocks);
  }
  return s;
}

// Every name a syncer writes into its state folder (besides temp files): Inspect tells a damaged
// state from a folder that is not a state at all by these.
bool IsStateFileName(const std::string& name) {
  static const std::regex kFragment(R"(fragment-\d{3,}\.bin)");
  // (copies/: the per-learner copies earlier versions kept)
  return name == "meta.json" || name == "learners.json" || name == "eval-start.json" || name == "copies" ||
         std::regex_match(name, kFragment);
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

std::string DurableState::FragmentFileName(int p) {
  char name[32];
  std::snprintf(name, sizeof(name), "fragment-%03d.bin", p);
  return name;
}

std::string DurableState::FragmentPath(int p) const { return dir_ + "/" + FragmentFileName(p); }

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
  for (const std::string& d : {dir_, dir_ + "/copies"}) {  // (copies/: earlier versions)
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
  h.round = snap.version;  // the rounds it closed: kept in the file's layout
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

Status DurableState::WriteAllFiles(const SyncerCore& core) {
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    if (core.owns(p)) ATOLL_RETURN_IF_ERROR(SaveFragment(core, p));
  }
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

namespace {

// A learner's latest push per fragment, as [version, size, steps, tokens per step, weight,
// influence] rows (its sketch is not kept: a restarted syncer judges directions from the next pushes).
nlohmann::json SamplesJson(const std::vector<PushSample>& samples) {
  nlohmann::json rows = nlohmann::json::array();
  for (const PushSample& s : samples) {
    rows.push_back({s.version, s.size, s.steps, s.tokens_per_step, s.weight, s.influence});
  }
  return rows;
}

// The rows back; a malformed row (damaged) is no push: the references then rebuild from the next
// pushes. A row of five (a table from before influences) has influence 1.
std::vector<PushSample> ParseSamples(const nlohmann::json& rows) {
  std::vector<PushSample> out;
  if (!rows.is_array()) return out;
  for (const auto& r : rows) {
    PushSample s;
    const bool ok = r.is_array() && (r.size() == 5 || r.size() == 6) &&
                    std::all_of(r.begin() + 1, r.end(), [](const nlohmann::json& x) { return x.is_number(); }) &&
                    r[0].is_number_integer();
    if (ok) {
      s.version = r[0].get<int64_t>();
      s.size = r[1].get<double>();
      s.steps = r[2].get<double>();
      s.tokens_per_step = r[3].get<double>();
      s.weight = r[4].get<double>();
      s.influence = r.size() == 6 ? r[5].get<double>() : 1.0;
    }
    const auto fine = [](double x) { return std::isfinite(x) && x >= 0; };
    if (!(fine(s.size) && fine(s.steps) && fine(s.tokens_per_step) && fine(s.weight) && fine(s.influence) &&
          s.influence <= 1)) {
      s = PushSample{};
    }
    out.push_back(s);
  }
  return out;
}

// A rate as read back: a damaged (negative or non-finite) one is none.
double NonNegative(double x) { return std::isfinite(x) && x >= 0 ? x : 0.0; }

// A learner's credited steps per second, per fragment (the rest of its allowances is not kept).
std::vector<double> StepRates(const std::vector<StepAllowance>& allowances) {
  std::vector<double> rates;
  for (const StepAllowance& a : allowances) rates.push_back(a.rate);
  return rates;
}

// Per fragment, [steps, tokens] of the learner's held credit (LearnerRecord::held).
nlohmann::json HeldJson(const std::vector<LearnerRecord::Held>& held) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& h : held) out.push_back({h.steps, h.tokens});
  return out;
}

// A table row's held credit; a malformed or negative entry counts as nothing held.
std::vector<LearnerRecord::Held> ParseHeld(const nlohmann::json& rows) {
  std::vector<LearnerRecord::Held> held;
  if (!rows.is_array()) return held;
  for (const auto& r : rows) {
    LearnerRecord::Held h;
    if (r.is_array() && r.size() == 2 && r[0].is_number() && r[1].is_number()) {
      h.steps = NonNegative(r[0].get<double>());
      h.tokens = NonNegative(r[1].get<double>());
    }
    held.push_back(h);
  }
  return held;
}

}  // namespace

Status DurableState::SaveLearners(const SyncerCore& core) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [id, l] : core.learners()) {
    rows.push_back({{"id", id},
                    {"host", l.host},
                    {"state", LearnerStateName(l.state)},
                    {"joins", l.joins},
                    {"step", l.step},
                    {"tokens", l.tokens},
                    {"bytes_up", l.bytes_up},
                    {"bytes_down", l.bytes_down},
                    {"pushes", l.pushes},
                    {"pushes_rejected", l.pushes_rejected},
                    {"rounds_joined", l.rounds_joined},
                    {"late_folded", l.late_folded},
                    {"tokens_merged", l.tokens_merged},
                    {"merged_versions", l.merged_versions},
                    {"samples", SamplesJson(l.samples)},
                    {"tokens_per_step", l.tokens_per_step},
                    {"step_rates", StepRates(l.allowances)},
                    {"held", HeldJson(l.held)},
                    {"replays_refused", l.replays_refused}});
  }
  return WriteJsonWithChecksum(dir_ + "/learners.json", {{"learners", rows}, {"rounds_closed", core.rounds_closed()}});
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
      return FailedPreconditionError("saved state in " + dir_ + " belongs to another " + std::string(key) + " (" +
                                     DumpJson(meta.value(key, nlohmann::json())) + " vs this syncer's " +
                                     DumpJson(wanted) + ")");
    }
  }
  ATOLL_RETURN_IF_ERROR(CheckNoStrayFragments(core.plan().num_fragments()));
  // Read and verify everything before changing anything.
  std::vector<SyncerCore::FragmentSnapshot> snaps;
  int64_t fragment_rounds = 0;
  for (int p = 0; p < core.plan().num_fragments(); ++p) {
    if (!core.owns(p)) continue;  // another shard's
    const size_t n = static_cast<size_t>(core.plan().fragments[static_cast<size_t>(p)].numel);
    ATOLL_ASSIGN_OR_RETURN(auto snap, ReadFragmentFile(FragmentPath(p), n));
    fragment_rounds += snap.version;
    snaps.push_back(std::move(snap));
  }
  LearnerTable table = ReadLearnerTable(fragment_rounds);
  // RestoreFragment validates everything before it changes a fragment; a failure part-way (a
  // damaged later file's values) leaves earlier fragments restored, so check them all first.
  for (size_t i = 0, p = 0; p < static_cast<size_t>(core.plan().num_fragments()); ++p) {
    if (!core.owns(static_cast<int>(p))) continue;
    ATOLL_RETURN_IF_ERROR(core.RestoreFragment(static_cast<int>(p), std::move(snaps[i++])));
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
    warnings_.push_back(st.message() +
                        ": ignored; the learner table is rebuilt as learners rejoin. Lost: each learner's "
                        "accounting (tokens merged, rounds joined, bytes) and which of its pushes were merged, so "
                        "learners push that work again (counted twice at most); rounds_closed recounted from the "
                        "fragments (" +
                        std::to_string(fragment_rounds) + ")");
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
    auto state = ParseLearnerState(r.value("state", "joining"));
    l.state = state.ok() ? *state : LearnerState::kJoining;
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
    l.samples = ParseSamples(r.value("samples", nlohmann::json::array()));
    // The rates the others are judged by (absent from a table of an older syncer: 0, none yet).
    l.tokens_per_step = NonNegative(r.value("tokens_per_step", 0.0));
    for (double rate : r.value("step_rates", std::vector<double>{}))
      l.allowances.push_back({{}, 0.0, NonNegative(rate), 0.0});
    l.held = ParseHeld(r.value("held", nlohmann::json::array()));
    l.replays_refused = r.value("replays_refused", int64_t{0});
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
