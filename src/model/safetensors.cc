#include "atoll/model/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <set>

#include "atoll/core/checksum.h"
#include "atoll/core/file.h"

namespace atl::model {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; atoll writes native floats");

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit
constexpr char kChecksumKey[] = "atoll.checksum";
constexpr char kEmbeddingsKey[] = "atoll.embeddings";

// Names unique and not reserved, one value per element; returns the data section's size.
StatusOr<uint64_t> CheckTensorsToEncode(const std::vector<diloco::TensorSpec>& tensors,
                                        const std::vector<std::span<const float>>& values,
                                        const nlohmann::json& metadata) {
  if (tensors.size() != values.size()) {
    return InvalidArgumentError("safetensors: " + std::to_string(tensors.size()) + " tensor specs but " +
                                std::to_string(values.size()) + " values");
  }
  if (!metadata.is_null() && !metadata.is_object()) {
    return InvalidArgumentError("safetensors: metadata must be a JSON object");
  }
  std::set<std::string> seen;
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      return InvalidArgumentError("safetensors: empty, reserved or repeated tensor name '" + t.name + "'");
    }
    int64_t numel = diloco::NumelOf(t.shape);
    if (numel < 0 || static_cast<size_t>(numel) != values[i].size()) {
      return InvalidArgumentError("safetensors: tensor '" + t.name + "' has shape of " + std::to_string(numel) +
                                  " elements but " + std::to_string(values[i].size()) + " values");
    }
    data_bytes += values[i].size() * sizeof(float);
  }
  return data_bytes;
}

// The JSON header, padded with spaces to a multiple of 8 bytes. safetensors metadata values
// must be strings: non-string values are stored as their JSON text, and the embedding list
// and data checksum are atoll's own keys.
std::string EncodeHeader(const std::vector<diloco::TensorSpec>& tensors,
                         const std::vector<std::span<const float>>& values, const nlohmann::json& metadata,
                         std::string_view data) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  if (metadata.is_object()) {
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      meta[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
  }
  nlohmann::json embeddings = nlohmann::json::array();
  for (const auto& t : tensors) {
    if (t.is_embedding) embeddings.push_back(t.name);
  }
  meta[kEmbeddingsKey] = embeddings.dump();
  meta[kChecksumKey] = ChecksumHex(Checksum64(data.data(), data.size()));
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t end = offset + values[i].size_bytes();
    header[tensors[i].name] = {{"dtype", "F32"}, {"shape", tensors[i].shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string head = header.dump();
  head.append((8 - head.size() % 8) % 8, ' ');
  return head;
}

}  // namespace

int SafetensorsData::Find(std::string_view name) const {
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

StatusOr<std::string> EncodeSafetensors(const std::vector<diloco::TensorSpec>& tensors,
                                        const std::vector<std::span<const float>>& values,
                                        const nlohmann::json& metadata) {
  ATOLL_ASSIGN_OR_RETURN(uint64_t data_bytes, CheckTensorsToEncode(tensors, values, metadata));
  // Data section first: its checksum goes into the header.
  std::string data;
  data.resize(data_bytes);
  uint64_t offset = 0;
  for (const auto& v : values) {
    if (!v.empty()) std::memcpy(data.data() + offset, v.data(), v.size_bytes());
    offset += v.size_bytes();
  }
  const std::string head = EncodeHeader(tensors, values, metadata, data);

  std::string out;
  out.reserve(8 + head.size() + data.size());
  uint64_t n = head.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += head;
  out += data;
  return out;
}

namespace {

// A tensor's header entry: its spec and its byte range within the data section.
struct TensorEntry {
  diloco::TensorSpec spec;
  uint64_t begin, end;
};

// The 8-byte length and the JSON header it announces; `data` is set to what follows the header.
StatusOr<nlohmann::json> ParseHeader(std::string_view bytes, std::string_view& data) {
  if (bytes.size() < 8) return DataLossError("safetensors: truncated (no header length)");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeaderBytes || n > bytes.size() - 8) {
    return DataLossError("safetensors: header length " + std::to_string(n) + " exceeds the file (" +
                         std::to_string(bytes.size()) + " bytes)");
  }
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLossError("safetensors: header is not a JSON object");
  }
  data = bytes.substr(8 + n);
  return header;
}

StatusOr<TensorEntry> ParseTensorEntry(const std::string& name, const nlohmann::json& v, uint64_t data_size) {
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
      !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
      v["data_offsets"].size() != 2) {
    return DataLossError("safetensors: malformed entry for tensor '" + name + "'");
  }
  if (v["dtype"].get<std::string>() != "F32") {
    return InvalidArgumentError("safetensors: tensor '" + name + "' has dtype " + v["dtype"].get<std::string>() +
                                "; atoll reads F32 only");
  }
  TensorEntry e;
  e.spec.name = name;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) {
      return DataLossError("safetensors: bad shape for tensor '" + name + "'");
    }
    e.spec.shape.push_back(d.get<int64_t>());
  }
  e.spec.numel = diloco::NumelOf(e.spec.shape);
  if (!v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned()) {
    return DataLossError("safetensors: bad data_offsets for tensor '" + name + "'");
  }
  e.begin = v["data_offsets"][0].get<uint64_t>();
  e.end = v["data_offsets"][1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size || e.end - e.begin != static_cast<uint64_t>(e.spec.numel) * sizeof(float)) {
    return DataLossError("safetensors: tensor '" + name + "' data_offsets [" + std::to_string(e.begin) + ", " +
                         std::to_string(e.end) + ") do not match its shape or the file size");
  }
  return e;
}

// Sorts the entries by offset and requires them to tile the data section exactly.
Status CheckDataLayout(std::vector<TensorEntry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  uint64_t expect = 0;
  for (const auto& e : entries) {
    if (e.begin != expect) return DataLossError("safetensors: tensor data overlaps or has gaps");
    expect = e.end;
  }
  if (expect != data_size) return DataLossError("safetensors: trailing bytes after the data");
  return Status::Ok();
}

// Files from other writers carry no atoll checksum: only a present one is checked.
Status VerifyDataChecksum(const nlohmann::json& metadata, std::string_view data) {
  if (!metadata.contains(kChecksumKey)) return Status::Ok();
  const auto& want = metadata[kChecksumKey];
  std::string got = ChecksumHex(Checksum64(data.data(), data.size()));
  if (!want.is_string() || want.get<std::string>() != got) {
    return DataLossError("safetensors: data checksum mismatch (header says " + want.dump() + ", data hashes to " + got +
                         "): the file is corrupted");
  }
  return Status::Ok();
}

// Metadata values are strings in safetensors, so the embedding list is a JSON array in a string;
// a malformed one just marks no tensor as an embedding.
std::set<std::string> EmbeddingNames(const nlohmann::json& metadata) {
  std::set<std::string> embeddings;
  if (metadata.contains(kEmbeddingsKey) && metadata[kEmbeddingsKey].is_string()) {
    auto list = nlohmann::json::parse(metadata[kEmbeddingsKey].get<std::string>(), nullptr, false);
    if (list.is_array()) {
      for (const auto& s : list) {
        if (s.is_string()) embeddings.insert(s.get<std::string>());
      }
    }
  }
  return embeddings;
}

}  // namespace

StatusOr<SafetensorsData> DecodeSafetensors(std::string_view bytes) {
  std::string_view data;
  ATOLL_ASSIGN_OR_RETURN(nlohmann::json header, ParseHeader(bytes, data));
  std::vector<TensorEntry> entries;
  SafetensorsData out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return DataLossError("safetensors: __metadata__ not an object");
      out.metadata = it.value();
      continue;
    }
    ATOLL_ASSIGN_OR_RETURN(TensorEntry e, ParseTensorEntry(it.key(), it.value(), data.size()));
    entries.push_back(std::move(e));
  }
  ATOLL_RETURN_IF_ERROR(CheckDataLayout(entries, data.size()));
  ATOLL_RETURN_IF_ERROR(VerifyDataChecksum(out.metadata, data));
  const std::set<std::string> embeddings = EmbeddingNames(out.metadata);
  for (auto& e : entries) {
    e.spec.is_embedding = embeddings.count(e.spec.name) > 0;
    std::vector<float> values(static_cast<size_t>(e.spec.numel));
    if (!values.empty()) std::memcpy(values.data(), data.data() + e.begin, e.end - e.begin);
    out.tensors.push_back(std::move(e.spec));
    out.values.push_back(std::move(values));
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<diloco::TensorSpec>& tensors,
                        const std::vector<std::span<const float>>& values, const nlohmann::json& metadata) {
  ATOLL_ASSIGN_OR_RETURN(std::string bytes, EncodeSafetensors(tensors, values, metadata));
  return WriteFileAtomic(path, bytes);
}

StatusOr<SafetensorsData> ReadSafetensors(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  auto decoded = DecodeSafetensors(bytes);
  if (!decoded.ok()) return decoded.status().WithContext(path);
  return decoded;
}

StatusOr<std::string> ReadFileVerified(const std::string& path, const std::string& expected_hex) {
  ATOLL_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  std::string got = ChecksumHex(Checksum64(bytes));
  if (got != expected_hex) {
    return DataLossError(path + " is corrupted: checksum " + got + ", expected " + expected_hex);
  }
  return bytes;
}

}  // namespace atl::model
