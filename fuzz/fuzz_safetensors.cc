// Fuzzes safetensors decoding (src/model/safetensors.cc, the checkpoint and export format) and
// the checksummed JSON manifests read from files. Input: mode byte, then the file's bytes.
#include "atoll/model/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace atl;
  fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const std::string_view bytes = in.Rest();
  if (mode % 2 == 0) {
    auto st = model::DecodeSafetensors(bytes);
    if (st.ok()) {
      std::vector<std::span<const float>> views(st->values.begin(), st->values.end());
      (void)model::EncodeSafetensors(st->tensors, views, st->metadata);
    }
    return 0;
  }
  const std::string path = fuzz::ScratchDir() + "/manifest.json";
  if (!fuzz::WriteScratch(path, bytes)) return 0;
  (void)model::ReadJsonWithChecksum(path);
  return 0;
}
