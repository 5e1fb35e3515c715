#include "atoll/syncer/api.h"

#include <cstring>

#include "atoll/exchange/fragment_exchange.h"

namespace atl::syncer {

StatusOr<ShardSpec> ParseShardSpec(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--shard '" + std::string(text.substr(0, 32)) + "': " + why +
                                " (expected i/S: shard i of S, 0 <= i < S, e.g. 0/2)");
  };
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return bad("no '/'");
  const auto parse = [](std::string_view s, int& out) {
    if (s.empty() || s.size() > 6) return false;
    out = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      out = out * 10 + (ch - '0');
    }
    return true;
  };
  ShardSpec spec;
  if (!parse(text.substr(0, slash), spec.index)) return bad("the shard index is not a number");
  if (!parse(text.substr(slash + 1), spec.count)) return bad("the shard count is not a number");
  if (spec.count < 1 || spec.count > kMaxShards) return bad("the shard count must be 1.." + std::to_string(kMaxShards));
  if (spec.index >= spec.count) return bad("the shard index must be below the shard count");
  return spec;
}

Status ApplyPulled(const PullPayload& r, int64_t have_version, size_t numel, std::vector<float>& copy,
                   exchange::Lattice& lattice, std::vector<float>* previous) {
  if (r.is_delta && (r.base_version != have_version || copy.size() != numel || lattice.numel != numel ||
                     lattice.block != r.block_size)) {
    return DataLossError("pull: delta against version " + std::to_string(r.base_version) + " (block " +
                         std::to_string(r.block_size) + "), but this learner holds version " +
                         std::to_string(have_version) + " (block " + std::to_string(lattice.block) + ")");
  }
  if (r.block_size < 8 || r.block_size > 65536)
    return DataLossError("pull: block size " + std::to_string(r.block_size));
  const size_t max_raw =
      r.is_delta ? exchange::MaxLatticeDeltaBytes(lattice) : exchange::MaxLatticeFullBytes(r.block_size, numel);
  if (r.raw_bytes > max_raw) {
    return DataLossError("pull: a payload of " + std::to_string(r.raw_bytes) + " raw bytes (at most " +
                         std::to_string(max_raw) + " for this fragment)");
  }
  std::vector<std::byte> inflated;
  std::span<const std::byte> raw = r.bytes;
  if (r.compression != diloco::Compression::kNone) {
    if (Status st = diloco::DecompressBytes(r.bytes, static_cast<size_t>(r.raw_bytes), inflated); !st.ok()) {
      return DataLossError("pull: " + st.message());
    }
    raw = inflated;
  } else if (r.bytes.size() != r.raw_bytes) {
    return DataLossError("pull: " + std::to_string(r.bytes.size()) + " bytes, the header says " +
                         std::to_string(r.raw_bytes));
  }
  std::vector<float> next;
  exchange::Lattice next_lattice;
  if (r.is_delta) {
    next = copy;
    next_lattice = lattice;
    if (Status st = exchange::ApplyLatticeDelta(lattice, raw, next); !st.ok())
      return DataLossError("pull: " + st.message());
  } else {
    auto l = exchange::DecodeLatticeFull(raw, r.block_size, numel, next);
    if (!l.ok()) return DataLossError("pull: malformed full fragment: " + l.status().message());
    next_lattice = std::move(*l);
  }
  if (exchange::ValuesChecksum(next) != r.value_checksum) {
    return DataLossError("fragment " + std::to_string(r.fragment) + " version " + std::to_string(r.version) +
                         ": value checksum differs from the syncer's (copy diverged; fetch in full)");
  }
  copy.swap(next);
  lattice = std::move(next_lattice);
  if (previous != nullptr) *previous = std::move(next);
  return Status::Ok();
}

}  // namespace atl::syncer
