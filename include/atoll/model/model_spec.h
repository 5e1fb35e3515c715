// Model specs: the run's model as data, not a preset. A spec is a safetensors file of the run's
// initial weights — any architecture: tensor names, shapes, dtypes and values — from which the
// syncer builds the fragment plan, the model signature and Θ⁰ (docs/model.md, "Any model").
// `atoll init --preset tiny --out model.safetensors` writes one for an atoll preset; a PyTorch user
// writes one with `safetensors.torch.save_file(model.state_dict(), path)` (or the atoll package).
//
// Only the header is read when a spec is opened; values are read per fragment when needed (the
// initial values need not stay resident). Dtypes F32, BF16 and F16 are read (as fp32). Tensors are
// in the file's data order. Which tensors are embeddings (merged by weighted mean, never RDA): the
// file's "atoll.embeddings" metadata when it has one, else the names matching any of the run's
// glob patterns (`[model] embeddings`, default kDefaultEmbeddingPatterns).
//
// Torch-free (target atoll_checkpoint). Thread-safety: a ModelSpec is an immutable value; the
// read functions may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "atoll/core/enum_names.h"
#include "atoll/core/status.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/tensor_spec.h"

namespace atl::model {

inline const std::vector<std::string> kDefaultEmbeddingPatterns = {"*embed*", "*wte*", "*tok_emb*"};

// The dtypes a spec's tensors may have, by their safetensors names.
enum class SpecDtype { kF32, kBf16, kF16 };
inline constexpr EnumNames<SpecDtype, 3> kSpecDtypeNames{
    "dtype", {{{SpecDtype::kF32, "F32"}, {SpecDtype::kBf16, "BF16"}, {SpecDtype::kF16, "F16"}}}};
constexpr const auto& NamesOf(SpecDtype) { return kSpecDtypeNames; }
inline const char* SpecDtypeName(SpecDtype d) { return kSpecDtypeNames.Name(d); }

struct ModelSpec {
  std::string path;
  std::vector<diloco::TensorSpec> tensors;  // in data order
  std::vector<SpecDtype> dtypes;            // per tensor
  std::vector<uint64_t> offsets;            // per tensor: the first byte of its data in the file
  uint64_t data_begin = 0, data_bytes = 0;  // the data section
  nlohmann::json metadata = nlohmann::json::object();
  // The atoll preset the spec was written from ("" for any other model).
  std::string preset() const;
  int64_t num_params() const;
};

// Reads the header of the safetensors file at `path`. NotFound for a missing file; DataLoss for a
// malformed header or data layout; InvalidArgument for a dtype other than F32/BF16/F16, an empty
// model, or a bad pattern list.
StatusOr<ModelSpec> OpenModelSpec(const std::string& path, const std::vector<std::string>& embedding_patterns);
// Reads the whole data section once and checks it against the file's "atoll.checksum" when it has
// one (DataLoss naming the file on a mismatch); also refuses non-finite values. Streams: memory
// stays bounded.
Status VerifyModelSpec(const ModelSpec& spec);
// The initial values of `fragment` (of a plan built over spec.tensors), as fp32, into `out`.
Status ReadSpecFragment(const ModelSpec& spec, const diloco::Fragment& fragment, std::span<float> out);
// One tensor's values, as fp32.
Status ReadSpecTensor(const ModelSpec& spec, size_t tensor, std::span<float> out);

// Writes an F32 safetensors file tensor by tensor without holding it in memory: `fill(t, out)`
// writes tensor t's values into `out` (its numel floats, at most `chunk` at a time: `begin` is the
// first element). Atomic (temp, fsync, rename); "atoll.checksum" and "atoll.embeddings" are added
// to `metadata`.
using TensorFill = std::function<void(size_t tensor, int64_t begin, std::span<float> out)>;
Status WriteModelSpec(const std::string& path, const std::vector<diloco::TensorSpec>& tensors,
                      const nlohmann::json& metadata, const TensorFill& fill);

// The first difference between two models' tensor lists, in words ("tensor 3: the learner has
// 'h.0.w' [768, 768], the syncer's model 'h.0.w' [768, 1024]"), or "" when they are the same.
std::string FirstTensorDifference(const std::vector<diloco::TensorSpec>& learner,
                                  const std::vector<diloco::TensorSpec>& syncer);

}  // namespace atl::model
