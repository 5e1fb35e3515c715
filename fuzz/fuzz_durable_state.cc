// Fuzzes the syncer's restart path: DurableState::Restore from a state folder in which one file
// (a fragment file, learners.json or meta.json) holds fuzzed bytes. With the high bit of the mode
// byte set the target first fixes the file's checksum, so the parsers behind it are reached.
#include <cstring>
#include <nlohmann/json.hpp>

#include "atoll/core/checksum.h"
#include "atoll/core/text.h"
#include "atoll/syncer/durable_state.h"
#include "testing/plans.h"
#include "fuzz_util.h"

namespace {

using namespace atl;

const syncer::SyncerCore& Prototype() {
  static const syncer::SyncerCore core = [] {
    const diloco::FragmentPlan plan = testing::SmallStridedPlan();
    syncer::SyncerOptions o;
    o.H = 2;
    auto c = syncer::SyncerCore::Create(o, plan, {std::vector<float>(4, 1.0f), std::vector<float>(4, 2.0f)});
    return std::move(*c);
  }();
  return core;
}

std::string FixChecksum(int file, std::string bytes) {
  if (file == 0) {  // fragment file: format 1 has the body's checksum at offset 32 of a 40-byte
                    // header; format 2 the body's at 48 and the header's own at 56 of 64 bytes
    const bool v1 = bytes.compare(0, 8, "ATOLFRG1") == 0;
    const size_t header = v1 ? 40 : 64, body_sum_at = v1 ? 32 : 48;
    if (bytes.size() < header) return bytes;
    const uint64_t sum = Checksum64(bytes.data() + header, bytes.size() - header);
    std::memcpy(bytes.data() + body_sum_at, &sum, 8);
    if (!v1) {
      const uint64_t head = Checksum64(bytes.data(), 56);
      std::memcpy(bytes.data() + 56, &head, 8);
    }
    return bytes;
  }
  auto j = nlohmann::json::parse(bytes, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bytes;
  j.erase("checksum");
  j["checksum"] = ChecksumHex(Checksum64(DumpJson(j)));
  return DumpJson(j);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const uint8_t mode = in.Byte();
  const int file = (mode & 0x7F) % 3;
  std::string bytes(in.Rest());
  if (mode & 0x80) bytes = FixChecksum(file, std::move(bytes));
  // A complete state, written once; each input replaces one file and the original is put back.
  static const std::string dir = fuzz::ScratchDir() + "/state";
  static const bool saved = syncer::DurableState(dir).SaveAll(Prototype()).ok();
  if (!saved) return 0;
  const char* names[] = {"/fragment-000.bin", "/learners.json", "/meta.json"};
  static const std::string originals[] = {fuzz::ReadScratch(dir + names[0]), fuzz::ReadScratch(dir + names[1]),
                                          fuzz::ReadScratch(dir + names[2])};
  const std::string path = dir + names[file];
  if (!fuzz::WriteScratch(path, bytes)) return 0;
  syncer::SyncerCore core = Prototype();
  if (syncer::DurableState(dir).Restore(core, TimePoint{}).ok()) {
    (void)DumpJson(core.StatusJson(TimePoint{}));  // what was restored can be shown
    (void)core.Pull(0, 0, -1);
  }
  fuzz::WriteScratch(path, originals[file]);
  return 0;
}
