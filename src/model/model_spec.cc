#include "atoll/model/model_spec.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "atoll/core/checksum.h"
#include "atoll/core/format.h"

namespace atl::model {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit
constexpr char kChecksumKey[] = "atoll.checksum";
constexpr char kEmbeddingsKey[] = "atoll.embeddings";
constexpr char kPresetKey[] = "atoll.preset";

size_t DtypeBytes(SpecDtype d) { return d == SpecDtype::kF32 ? 4 : 2; }

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(exp - 15 + 127) << 23) | (mant << 13));
}

// An open file for pread; closes itself.
class File {
 public:
  explicit File(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  bool ok() const { return fd_ >= 0; }
  // Reads exactly n bytes at `offset`; an error names the file.
  Status ReadAt(const std::string& path, uint64_t offset, void* out, size_t n) const {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return got == 0 ? DataLossError(path + ": ends early (truncated model spec)")
                        : UnavailableError(path + ": read failed: " + std::strerror(errno));
      }
      p += got;
      n -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return Status::Ok();
  }

 private:
  int fd_;
};

// Converts `n` stored values at `in` to fp32.
void ToFloat(SpecDtype d, const std::byte* in, size_t n, float* out) {
  if (d == SpecDtype::kF32) {
    std::memcpy(out, in, n * 4);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);
    out[i] = d == SpecDtype::kBf16 ? std::bit_cast<float>(static_cast<uint32_t>(v) << 16) : HalfToFloat(v);
  }
}

StatusOr<SpecDtype> ParseDtype(const std::string& name, const std::string& tensor) {
  auto d = kSpecDtypeNames.Parse(name);
  if (!d.ok()) return d.status().WithContext("model spec: tensor '" + tensor + "'");
  return d;
}

struct Entry {
  diloco::TensorSpec spec;
  SpecDtype dtype = SpecDtype::kF32;
  uint64_t begin = 0, end = 0;
};

StatusOr<Entry> ParseEntry(const std::string& name, const nlohmann::json& v, uint64_t data_bytes) {
  const auto bad = [&](const char* what) { return DataLossError("model spec: tensor '" + name + "': " + what); };
  if (name.empty()) return DataLossError("model spec: a tensor has an empty name");
  if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
      !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
      !v["data_offsets"][1].is_number_unsigned()) {
    return bad("malformed header entry");
  }
  Entry e;
  ATOLL_ASSIGN_OR_RETURN(e.dtype, ParseDtype(v["dtype"].get<std::string>(), name));
  e.spec.name = name;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) return bad("bad shape");
    e.spec.shape.push_back(d.get<int64_t>());
  }
  e.spec.numel = diloco::NumelOf(e.spec.shape);
  e.begin = v["data_offsets"][0].get<uint64_t>();
  e.end = v["data_offsets"][1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_bytes ||
      e.end - e.begin != static_cast<uint64_t>(e.spec.numel) * DtypeBytes(e.dtype)) {
    return bad("data_offsets do not match its shape and dtype or the file size");
  }
  return e;
}

std::set<std::string> EmbeddingsFromMetadata(const nlohmann::json& metadata, bool* said) {
  std::set<std::string> names;
  *said = false;
  if (!metadata.contains(kEmbeddingsKey) || !metadata[kEmbeddingsKey].is_string()) return names;
  auto list = nlohmann::json::parse(metadata[kEmbeddingsKey].get<std::string>(), nullptr, false);
  if (!list.is_array()) return names;
  *said = true;
  for (const auto& s : list) {
    if (s.is_string()) names.insert(s.get<std::string>());
  }
  return names;
}

bool MatchesAny(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string Shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Describe(const diloco::TensorSpec& t) {
  return "'" + t.name + "' " + Shape(t.shape) + (t.is_embedding ? " (embedding)" : "");
}

}  // namespace

std::string ModelSpec::preset() const {
  return metadata.contains(kPresetKey) && metadata[kPresetKey].is_string() ? metadata[kPresetKey].get<std::string>()
                                                                           : "";
}

int64_t ModelSpec::num_params() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel;
  return n;
}

StatusOr<ModelSpec> OpenModelSpec(const std::string& path, const std::vector<std::string>& embedding_patterns) {
  File f(path);
  if (!f.ok()) {
    return errno == ENOENT ? NotFoundError("model spec " + path + " does not exist")
                           : UnavailableError("model spec " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return UnavailableError("model spec " + path + ": " + std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t n = 0;
  if (size < 8)
    return DataLossError("model spec " + path + " is not a safetensors file (" + std::to_string(size) + " bytes)");
  ATOLL_RETURN_IF_ERROR(f.ReadAt(path, 0, &n, 8));
  if (n > kMaxHeaderBytes || n > size - 8) {
    return DataLossError("model spec " + path + ": header length " + std::to_string(n) + " exceeds the file");
  }
  std::string head(static_cast<size_t>(n), '\0');
  ATOLL_RETURN_IF_ERROR(f.ReadAt(path, 8, head.data(), head.size()));
  nlohmann::json header = nlohmann::json::parse(head, nullptr, false);
  if (header.is_discarded() || !header.is_object())
    return DataLossError("model spec " + path + ": the header is not a JSON object");
  ModelSpec spec;
  spec.path = path;
  spec.data_begin = 8 + n;
  spec.data_bytes = size - spec.data_begin;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return DataLossError("model spec " + path + ": __metadata__ is not an object");
      spec.metadata = it.value();
      continue;
    }
    auto e = ParseEntry(it.key(), it.value(), spec.data_bytes);
    if (!e.ok()) return e.status().WithContext(path);
    entries.push_back(std::move(*e));
  }
  if (entries.empty()) return InvalidArgumentError("model spec " + path + " holds no tensors");
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const auto& e : entries) {
    if (e.begin != expect)
      return DataLossError("model spec " + path + ": tensor data overlaps or has gaps at '" + e.spec.name + "'");
    expect = e.end;
  }
  if (expect != spec.data_bytes) return DataLossError("model spec " + path + ": bytes after the last tensor");
  bool said = false;
  const std::set<std::string> named = EmbeddingsFromMetadata(spec.metadata, &said);
  for (auto& e : entries) {
    e.spec.is_embedding = said ? named.count(e.spec.name) > 0 : MatchesAny(e.spec.name, embedding_patterns);
    spec.tensors.push_back(std::move(e.spec));
    spec.dtypes.push_back(e.dtype);
    spec.offsets.push_back(spec.data_begin + e.begin);
  }
  return spec;
}

Status ReadSpecTensor(const ModelSpec& spec, size_t tensor, std::span<float> out) {
  ATOLL_CHECK(tensor < spec.tensors.size() && static_cast<int64_t>(out.size()) == spec.tensors[tensor].numel);
  File f(spec.path);
  if (!f.ok()) return UnavailableError("model spec " + spec.path + ": " + std::strerror(errno));
  const size_t elem = DtypeBytes(spec.dtypes[tensor]);
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<std::byte> buf;
  for (size_t done = 0; done < out.size(); done += kChunk) {
    const size_t n = std::min(kChunk, out.size() - done);
    buf.resize(n * elem);
    ATOLL_RETURN_IF_ERROR(f.ReadAt(spec.path, spec.offsets[tensor] + done * elem, buf.data(), buf.size()));
    ToFloat(spec.dtypes[tensor], buf.data(), n, out.data() + done);
  }
  return Status::Ok();
}

Status ReadSpecFragment(const ModelSpec& spec, const diloco::Fragment& fragment, std::span<float> out) {
  ATOLL_CHECK(static_cast<int64_t>(out.size()) == fragment.numel);
  File f(spec.path);
  if (!f.ok()) return UnavailableError("model spec " + spec.path + ": " + std::strerror(errno));
  std::vector<std::byte> buf;
  size_t pos = 0;
  for (const auto& s : fragment.slices) {
    ATOLL_CHECK(s.tensor >= 0 && static_cast<size_t>(s.tensor) < spec.tensors.size());
    const size_t elem = DtypeBytes(spec.dtypes[static_cast<size_t>(s.tensor)]);
    buf.resize(static_cast<size_t>(s.count) * elem);
    ATOLL_RETURN_IF_ERROR(f.ReadAt(spec.path,
                                   spec.offsets[static_cast<size_t>(s.tensor)] + static_cast<uint64_t>(s.offset) * elem,
                                   buf.data(), buf.size()));
    ToFloat(spec.dtypes[static_cast<size_t>(s.tensor)], buf.data(), static_cast<size_t>(s.count), out.data() + pos);
    pos += static_cast<size_t>(s.count);
  }
  return Status::Ok();
}

Status VerifyModelSpec(const ModelSpec& spec) {
  File f(spec.path);
  if (!f.ok()) return UnavailableError("model spec " + spec.path + ": " + std::strerror(errno));
  Hasher hasher;
  std::vector<std::byte> buf;
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const size_t elem = DtypeBytes(spec.dtypes[t]);
    constexpr size_t kChunk = size_t{1} << 20;
    std::vector<float> values;
    for (int64_t done = 0; done < spec.tensors[t].numel; done += static_cast<int64_t>(kChunk)) {
      const size_t n = std::min<size_t>(kChunk, static_cast<size_t>(spec.tensors[t].numel - done));
      buf.resize(n * elem);
      ATOLL_RETURN_IF_ERROR(
          f.ReadAt(spec.path, spec.offsets[t] + static_cast<uint64_t>(done) * elem, buf.data(), buf.size()));
      hasher.Update(buf.data(), buf.size());
      values.resize(n);
      ToFloat(spec.dtypes[t], buf.data(), n, values.data());
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(values[i])) {
          return InvalidArgumentError("model spec " + spec.path + ": tensor '" + spec.tensors[t].name + "' value " +
                                      std::to_string(done + static_cast<int64_t>(i)) + " is not finite");
        }
      }
    }
  }
  if (spec.metadata.contains(kChecksumKey)) {
    const std::string got = ChecksumHex(hasher.Digest());
    if (!spec.metadata[kChecksumKey].is_string() || spec.metadata[kChecksumKey].get<std::string>() != got) {
      return DataLossError("model spec " + spec.path + " is corrupted: its data hashes to " + got +
                           ", the header says " + spec.metadata[kChecksumKey].dump());
    }
  }
  return Status::Ok();
}

namespace {

// The safetensors header of a spec of `tensors` (F32, in order), its checksum field zeroed.
StatusOr<nlohmann::ordered_json> SpecHeader(const std::vector<diloco::TensorSpec>& tensors,
                                            const nlohmann::json& metadata) {
  if (tensors.empty()) return InvalidArgumentError("model spec: no tensors");
  if (!metadata.is_object() && !metadata.is_null())
    return InvalidArgumentError("model spec: metadata must be an object");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::json meta = nlohmann::json::object();
  for (auto it = metadata.begin(); metadata.is_object() && it != metadata.end(); ++it) {
    meta[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
  }
  nlohmann::json embeddings = nlohmann::json::array();
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || !names.insert(t.name).second) {
      return InvalidArgumentError("model spec: tensor names must be unique and not empty ('" + t.name + "')");
    }
    if (t.is_embedding) embeddings.push_back(t.name);
  }
  meta[kEmbeddingsKey] = embeddings.dump();
  meta[kChecksumKey] = std::string(16, '0');  // replaced once the data is hashed (same length)
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(t.numel) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  return header;
}

// The header as written: JSON padded with spaces to a multiple of 8 bytes.
std::string EncodeHeader(const nlohmann::ordered_json& header) {
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');
  return head;
}

// A file written at offsets under a temporary name, then fsynced and renamed into place; removed
// if it is not committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status opened() const {
    return fd_ >= 0 ? Status::Ok() : UnavailableError("model spec " + tmp_ + ": " + std::strerror(errno));
  }
  Status WriteAt(const void* data, size_t n, uint64_t at) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return UnavailableError("model spec " + tmp_ + ": write failed: " + std::strerror(errno));
      p += w;
      n -= static_cast<size_t>(w);
      at += static_cast<uint64_t>(w);
    }
    return Status::Ok();
  }
  Status Commit() {
    if (::fsync(fd_) != 0) return UnavailableError("model spec " + tmp_ + ": fsync failed: " + std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) return UnavailableError("model spec " + path_ + ": " + ec.message());
    committed_ = true;
    return Status::Ok();
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

Status WriteModelSpec(const std::string& path, const std::vector<diloco::TensorSpec>& tensors,
                      const nlohmann::json& metadata, const TensorFill& fill) {
  ATOLL_ASSIGN_OR_RETURN(nlohmann::ordered_json header, SpecHeader(tensors, metadata));
  std::string head = EncodeHeader(header);
  AtomicFile file(path);
  ATOLL_RETURN_IF_ERROR(file.opened());
  const uint64_t data_begin = 8 + head.size();
  Hasher hasher;
  std::vector<float> chunk;
  uint64_t at = data_begin;
  for (size_t t = 0; t < tensors.size(); ++t) {
    constexpr int64_t kChunk = int64_t{1} << 20;
    for (int64_t begin = 0; begin < tensors[t].numel; begin += kChunk) {
      chunk.assign(static_cast<size_t>(std::min(kChunk, tensors[t].numel - begin)), 0.0f);
      fill(t, begin, chunk);
      hasher.Update(chunk.data(), chunk.size() * 4);
      ATOLL_RETURN_IF_ERROR(file.WriteAt(chunk.data(), chunk.size() * 4, at));
      at += chunk.size() * 4;
    }
  }
  header["__metadata__"][kChecksumKey] = ChecksumHex(hasher.Digest());
  head = EncodeHeader(header);
  ATOLL_CHECK_MSG(8 + head.size() == data_begin, "the checksum changed the header's length");
  const uint64_t n = head.size();
  ATOLL_RETURN_IF_ERROR(file.WriteAt(&n, 8, 0));
  ATOLL_RETURN_IF_ERROR(file.WriteAt(head.data(), head.size(), 8));
  return file.Commit();
}

std::string FirstTensorDifference(const std::vector<diloco::TensorSpec>& learner,
                                  const std::vector<diloco::TensorSpec>& syncer) {
  const size_t n = std::min(learner.size(), syncer.size());
  for (size_t i = 0; i < n; ++i) {
    const auto& a = learner[i];
    const auto& b = syncer[i];
    if (a.name != b.name || a.shape != b.shape || a.is_embedding != b.is_embedding) {
      return "tensor " + std::to_string(i) + ": the learner has " + Describe(a) + ", the syncer's model " + Describe(b);
    }
  }
  if (learner.size() != syncer.size()) {
    const bool learner_longer = learner.size() > syncer.size();
    const auto& extra = learner_longer ? learner[n] : syncer[n];
    return "the learner has " + std::to_string(learner.size()) + " tensors, the syncer's model " +
           std::to_string(syncer.size()) + "; tensor " + std::to_string(n) + " " + Describe(extra) +
           " is only in the " + (learner_longer ? "learner's" : "syncer's");
  }
  return "";
}

}  // namespace atl::model
