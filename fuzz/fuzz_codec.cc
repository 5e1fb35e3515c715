// Fuzzes the wire codecs' Decode (every encoding, compression, block size and value count) and,
// for what decodes, the learner's delta path (ApplyDelta). Input: encoding + 6 × compression
// (0 none, 1 deflate, 2 an unknown one), block-size selector, value count, then the payload.
#include <vector>

#include "atoll/diloco/codec.h"
#include "atoll/exchange/fragment_exchange.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace atl;
  fuzz::Input in(data, size);
  diloco::CodecOptions o;
  const uint8_t kind = in.Byte();
  o.encoding = static_cast<diloco::Encoding>(kind % 6);            // 5: an unknown encoding
  o.compression = static_cast<diloco::Compression>(kind / 6 % 3);  // 2: an unknown compression
  o.block_size = 2 * (in.Byte() % 40);                             // 0..78: in and out of range
  const size_t n = in.Byte();
  const std::string_view bytes = in.Rest();
  std::span<const std::byte> encoded(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  std::vector<float> out(n);
  if (!diloco::Decode(o, encoded, out).ok()) return 0;
  std::vector<float> copy(n, 1.0f);
  (void)exchange::ApplyDelta(o, encoded, copy);
  std::vector<std::byte> again;
  (void)diloco::Encode(o, out, again);  // what decoded re-encodes (or is refused), never crashes
  return 0;
}
