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
