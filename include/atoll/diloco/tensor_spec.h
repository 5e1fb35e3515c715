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

// The parameter list of a small Llama-style GPT, used by tests, benchmarks and `atoll demo`/`plan`
// so that they all talk about the same shape. In order:
//   tok_emb.weight [vocab, d] (is_embedding; tied with the output head)
//   per layer i: layers.i.attn_norm.weight [d], layers.i.attn.{wq,wk,wv,wo}.weight [d, d],
//                layers.i.mlp_norm.weight [d], layers.i.mlp.{w1,w3}.weight [ffn, d],
//                layers.i.mlp.w2.weight [d, ffn]
//   norm.weight [d]
// The defaults are the tiny test model: vocab 4096, d 128, 4 layers, ffn 344 (1,315,968 values).
std::vector<TensorSpec> ExampleGptTensors(int64_t vocab = 4096, int64_t d = 128, int layers = 4, int64_t ffn = 344);

}  // namespace atl::diloco
