// Safetensors files of named fp32 tensors, plus checksummed JSON manifests: the on-disk format of
// every atoll checkpoint (learner model + AdamW state, and the syncer's global parameters Θ).
//
// Layout (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N
// bytes of JSON header (padded with spaces to a multiple of 8), then the raw little-endian data.
// The header maps each tensor name to {"dtype":"F32","shape":[...],"data_offsets":[b,e]} in the
// order given by the writer, plus "__metadata__" (string → string). atoll adds two metadata
// keys: "atoll.checksum" (XXH3-64 hex of the data section, verified on read) and
// "atoll.embeddings" (JSON list of the names flagged is_embedding). The files load unchanged in
// PyTorch with `safetensors.torch.load_file`.
//
// Torch-free (target atoll_checkpoint). Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/json_file.h"
#include "atoll/core/status.h"
#include "atoll/diloco/tensor_spec.h"

namespace atl::model {

struct SafetensorsData {
  std::vector<diloco::TensorSpec> tensors;             // in data-offset order (= the writer's order)
  std::vector<std::vector<float>> values;              // values[i] has tensors[i].numel floats
  nlohmann::json metadata = nlohmann::json::object();  // "__metadata__" (string values)

  // Index of the tensor called `name`, or -1.
  int Find(std::string_view name) const;
};

// Serialises tensors to safetensors bytes. `metadata` must be a JSON object; string values are
// stored as they are, other values as their JSON text (safetensors allows only strings).
// InvalidArgument when the lists differ in length, a span's size differs from its spec's numel,
// a name repeats or is empty, or metadata is not an object.
StatusOr<std::string> EncodeSafetensors(const std::vector<diloco::TensorSpec>& tensors,
                                        const std::vector<std::span<const float>>& values,
                                        const nlohmann::json& metadata);

// Parses safetensors bytes. DataLoss for a truncated or malformed file or a checksum mismatch;
// InvalidArgument for a well-formed file holding a dtype other than F32.
StatusOr<SafetensorsData> DecodeSafetensors(std::string_view bytes);

// EncodeSafetensors + WriteFileAtomic (temp file, fsync, rename).
Status WriteSafetensors(const std::string& path, const std::vector<diloco::TensorSpec>& tensors,
                        const std::vector<std::span<const float>>& values, const nlohmann::json& metadata);

// ReadFile + DecodeSafetensors; errors carry the path.
StatusOr<SafetensorsData> ReadSafetensors(const std::string& path);

// Reads a file and checks its XXH3-64 against `expected_hex` (as ChecksumHex writes it).
// NotFound when absent; DataLoss "<path> is corrupted: checksum …" on mismatch.
StatusOr<std::string> ReadFileVerified(const std::string& path, const std::string& expected_hex);

// Checksummed JSON manifests: the one format of atoll/core/json_file.h.
using ::atl::ReadJsonWithChecksum;
using ::atl::WriteJsonWithChecksum;

}  // namespace atl::model
