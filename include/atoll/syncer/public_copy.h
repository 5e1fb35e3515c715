// PublicCopy: the one public copy Φ_p of a fragment that learners hold, and the bounded history of
// the lattice deltas that made its recent versions (docs/decisions/014).
//
// Every closed round advances Φ_p by one lattice delta of Θ_p − Φ_p (error feedback: what a
// delta's step leaves stays in Θ_p − Φ_p and goes out with the next one). A learner that holds
// version u of Φ_p gets version v as one message: the exact integer sum of the deltas u+1..v,
// while u is in the history; from further behind it gets the full copy. Either way it lands on
// exactly the bits the syncer holds (the value checksum of every pull says so), and the syncer
// keeps nothing per learner: memory is Φ_p plus the history, whatever the number of learners.
// A learner's outer gradient is taken against the version it was computed from, Φ_p^u = Φ_p^v
// minus the deltas since (ValuesAt, exact).
//
// Pull payloads of the current version are cached (several learners usually ask for the same
// one); the cache is bounded and emptied when the version moves.
// Thread-safety: none; the syncer's loop thread owns every instance (through SyncerCore).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "atoll/core/status.h"
#include "atoll/diloco/codec.h"
#include "atoll/exchange/lattice.h"
#include "atoll/syncer/api.h"

namespace atl::syncer {

struct PublicCopyOptions {
  // Each round's delta: at most qmax steps per value (7: int4-sized codes; 0: exact).
  int qmax = 7;
  diloco::Compression compression = diloco::Compression::kDeflate;
  int history_versions = 8;       // deltas kept (≥ 0)
  size_t history_bytes = 0;       // and at most this many bytes of them, but always the newest (0: no bound)
  size_t cache_bytes = 64 << 20;  // pull payloads of the current version kept for other learners
  ThreadPool* pool = nullptr;     // spreads encoding and sums over threads (may be null)
  // Values the copy's buffer has room for (at least its own): the syncer's largest fragment, so
  // that the buffers Commit swaps between fragments and a round's scratch never reallocate.
  size_t capacity = 0;
};

// The per-round quantiser of a downlink encoding: int2 1, int4 7, int8 127, bf16 255, fp32 0 (exact).
int DownlinkQmax(diloco::Encoding downlink);

class PublicCopy {
 public:
  // Φ⁰: the initial values snapped to their lattice (blocks of `block` values), version 0.
  static StatusOr<PublicCopy> Create(std::span<const float> initial, int block, PublicCopyOptions options);
  // A copy restored at `version` (no history): InvalidArgument when `values` do not fit the lattice.
  static StatusOr<PublicCopy> Restore(exchange::Lattice lattice, std::vector<float> values, int64_t version,
                                      PublicCopyOptions options);

  // Round `version` (= version() + 1) moved Θ: Φ ← Φ + Q(Θ − Φ), the delta kept in the history.
  Status Advance(std::span<const float> theta, int64_t version);
  // The same advance coded by the caller (exchange::EncodeLatticeStepBlocks over every block, as
  // the syncer's tiled round does): `next` holds the new values and is swapped in (it then holds
  // the old ones), `delta` is the round's raw delta.
  // `checksum`: the new values' ValuesChecksum when the caller formed it (a round's pass does, tile
  // by tile); else it is formed here. Returns the buffer of a delta the history let go (empty when
  // none), cleared: the caller's next round can code into it without fresh pages.
  std::vector<std::byte> Commit(std::vector<float>& next, std::vector<std::byte> delta, int64_t version,
                                int64_t saturated, std::optional<uint64_t> checksum = std::nullopt);
  // The advance done in place by the caller: a round's pass writes Φ's new values into
  // values_for_advance() (restoring them itself if the round is refused), then commits its delta.
  std::span<float> values_for_advance() { return phi_; }
  std::vector<std::byte> CommitInPlace(std::vector<std::byte> delta, int64_t version, int64_t saturated,
                                       std::optional<uint64_t> checksum = std::nullopt);
  // The options the copy codes with (its lattice quantiser, the pool).
  const PublicCopyOptions& options() const { return options_; }

  int64_t version() const { return version_; }
  std::span<const float> values() const { return phi_; }
  uint64_t checksum() const { return checksum_; }
  const exchange::Lattice& lattice() const { return lattice_; }
  // The oldest version a learner can be brought forward from with a delta.
  int64_t oldest() const;
  // The version whose values have checksum `c` (the current one or one in the history).
  std::optional<int64_t> VersionOf(uint64_t c) const;
  // Φ at version u, oldest() ≤ u ≤ version(), into `out` (exact). OutOfRange otherwise.
  Status ValuesAt(int64_t u, std::vector<float>& out) const;
  // What a learner holding version `have` gets: a delta from it (oldest() ≤ have < version()), or
  // the full copy (have = -1, or older than the history), stamped with the fragment and the
  // syncer's incarnation. Not for have = version(). Replies of the current version are shared
  // with the cache: M learners' pulls of the same one hold it once.
  StatusOr<SharedPull> Serve(int64_t have, int fragment, uint64_t incarnation);

  int64_t saturated() const { return saturated_; }  // values held at the lattice's edge, in total
  // Bytes of the buffers this copy holds (values, lattice, history, cache).
  size_t HeldBytes() const;

 private:
  struct Past {
    int64_t version = 0;           // the version this delta made
    uint64_t checksum = 0;         // of Φ at that version
    std::vector<std::byte> delta;  // raw lattice delta from version − 1
  };
  PublicCopy(exchange::Lattice lattice, std::vector<float> phi, int64_t version, PublicCopyOptions options);
  std::vector<std::byte> Evict();  // returns the largest buffer let go, cleared
  size_t HistoryBytes() const;
  StatusOr<std::vector<std::byte>> Compressed(std::vector<std::byte> raw, size_t* raw_size) const;

  PublicCopyOptions options_;
  exchange::Lattice lattice_;
  std::vector<float> phi_;
  uint64_t checksum_ = 0;
  int64_t version_ = 0;
  uint64_t base_checksum_ = 0;           // of Φ at oldest() when the history is not empty
  std::deque<Past> history_;             // oldest first; history_.back().version == version_
  std::map<int64_t, SharedPull> cache_;  // have → payload, for version_
  size_t cache_held_ = 0;
  int64_t saturated_ = 0;
};

}  // namespace atl::syncer
