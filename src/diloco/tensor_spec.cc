#include "atoll/diloco/tensor_spec.h"

#include "atoll/core/checksum.h"

namespace atl::diloco {

int64_t NumelOf(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t ModelSignature(const std::vector<TensorSpec>& tensors) {
  Hasher h;
  for (const auto& t : tensors) {
    h.Update(t.name.data(), t.name.size());
    h.Update("\0", 1);
    for (int64_t d : t.shape) h.Update(&d, sizeof(d));
    const char kDtype[] = "f32";
    h.Update(kDtype, 3);
    const uint8_t emb = t.is_embedding ? 1 : 0;
    h.Update(&emb, 1);
    h.Update("\n", 1);
  }
  return h.Digest();
}

}  // namespace atl::diloco

namespace atl::diloco {

std::vector<TensorSpec> ExampleGptTensors(int64_t vocab, int64_t d, int layers, int64_t ffn) {
  std::vector<TensorSpec> t;
  auto add = [&t](std::string name, std::vector<int64_t> shape, bool emb = false) {
    const int64_t n = NumelOf(shape);
    t.push_back({std::move(name), std::move(shape), n, emb});
  };
  add("tok_emb.weight", {vocab, d}, true);
  for (int i = 0; i < layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "attn_norm.weight", {d});
    for (const char* w : {"wq", "wk", "wv", "wo"}) add(p + "attn." + w + ".weight", {d, d});
    add(p + "mlp_norm.weight", {d});
    add(p + "mlp.w1.weight", {ffn, d});
    add(p + "mlp.w2.weight", {d, ffn});
    add(p + "mlp.w3.weight", {ffn, d});
  }
  add("norm.weight", {d});
  return t;
}

}  // namespace atl::diloco
