// Fuzzes the syncer's push parsing (src/transport/wire.cc): a PushChunk message as it arrives
// from the network; a header goes through ParsePushHeader, data chunks through AppendChunk
// against an announced total. Input: total selector, then protobuf bytes of one or more chunks
// (each preceded by a length byte).
#include <vector>

#include "atoll.pb.h"
#include "fuzz_util.h"
#include "wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace atl;
  fuzz::Input in(data, size);
  const int64_t total = int64_t{in.Byte()} << (in.Byte() % 40);
  std::string_view rest = in.Rest();
  std::vector<std::byte> payload;
  while (!rest.empty()) {
    const size_t len = std::min<size_t>(static_cast<uint8_t>(rest[0]), rest.size() - 1);
    atl::v1::PushChunk chunk;
    const bool parsed = chunk.ParseFromArray(rest.data() + 1, static_cast<int>(len));
    rest.remove_prefix(1 + len);
    if (!parsed) continue;
    if (chunk.kind_case() == atl::v1::PushChunk::kHeader) {
      (void)transport::ParsePushHeader(chunk.header());
    } else if (chunk.kind_case() == atl::v1::PushChunk::kData && total <= (int64_t{1} << 20)) {
      (void)transport::AppendChunk(chunk.data(), total, payload);
    }
  }
  return 0;
}
