// TensorSpec: how the framework-agnostic core sees one model parameter — a name, a shape, its
// element count, and whether it is an embedding (embeddings merge by weighted mean, never RDA).
// The learner (libtorch) exposes its parameters as a list of these plus flat fp32 storage; the
// syncer, the fragment plan and the wire never need to know about libtorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace atl::diloco {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;  // product of shape (1 for a scalar)
  bool is_embedding = false;
};

// Product of the dimensions (1 for an empty shape).
int64_t NumelOf(const std::vector<int64_t>& shape);

// Model signature: a 64-bit hash of every tensor's name, shape, dtype ("f32") and embedding flag
// in order. Learners and the syncer refuse to talk when their signatures differ.
uint64_t ModelSignature(const std::vector<TensorSpec>& tensors);

}  // namespace atl::diloco
