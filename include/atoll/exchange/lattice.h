// The downlink's public copy on a lattice: one shared copy Φ_p per fragment that every learner can
// reach exactly from any version it holds, with one message (docs/decisions/014).
//
// Lattice. A fragment's values are cut into blocks of `block` values; block b has a unit
// u_b = 2^exp[b]. The public copy Φ holds in every block only values k·u_b with integer k,
// |k| ≤ kLatticeMax = 2^24 − 1, so every such value is an exact fp32 and the sum of two of them is
// exact too (IEEE addition of two multiples of u_b whose result is in range returns it exactly).
// exp[b] comes from the run's initial values Θ⁰ (MakeLattice): the block's largest |value| (at
// least 2^-6) sets u_b to 2^-14 of its power of two, so a block can grow 1,024-fold (a zero block
// to 16) before its values leave the range, and its resolution is 6·10⁻⁵ of the block's size.
//
// A lattice delta moves Φ by integers: per block a shift s and codes k_i, adding k_i·2^s·u_b.
// Deltas compose exactly: the sum of any chain of deltas is again one lattice delta (integer
// sums, SumLatticeDeltas), so a learner that holds version u gets version v as one delta, and
// lands on exactly the bits the syncer holds. The syncer makes one delta per round
// (EncodeLatticeStep: Θ_p − Φ_p quantised to at most `qmax` steps of a power-of-two step per
// block, with error feedback: what the step leaves is in the next round's delta).
//
// Raw layout (little-endian), per block: int8 shift s (0..40), uint8 width w ∈ {0, 4, 8, 16, 32},
// then the block's codes k (b values): w = 0: none (all zero); 4: two's-complement nibbles, low
// nibble first, an odd block's last high nibble 0; 8/16/32: two's-complement integers. Full copy
// (EncodeLatticeFull): one int8 exponent per block, then the values of Φ in the delta layout
// (codes k = Φ/u_b). Decoders refuse (DataLoss) anything an encoder never writes: a truncated or
// overlong buffer, an unknown width, a shift beyond 40, a non-zero padding nibble, a result out of
// range, an exponent outside [kMinExp, kMaxExp].
// `pool` (may be null) spreads the work over block ranges; the bytes and values are the same.
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "atoll/core/parallel.h"
#include "atoll/core/status.h"

namespace atl::exchange {

inline constexpr int64_t kLatticeMax = (int64_t{1} << 24) - 1;
inline constexpr int kMinExp = -100, kMaxExp = 103;  // 2^103 · (2^24 − 1) < FLT_MAX
inline constexpr int kMaxShift = 40;

struct Lattice {
  int block = 256;
  size_t numel = 0;
  std::vector<int8_t> exp;  // one per block: the unit of block b is 2^exp[b]

  size_t num_blocks() const { return exp.size(); }
};

// The lattice of a fragment whose run started from `initial` (block ≥ 8). InvalidArgument for a
// bad block size or non-finite values.
StatusOr<Lattice> MakeLattice(std::span<const float> initial, int block);
// Φ⁰: `values` rounded to the nearest lattice value (ties to even), clamped to the range.
void SnapToLattice(const Lattice& lattice, std::span<float> values);

// Counts of one encode, for the syncer's status.
struct LatticeStepStats {
  int64_t saturated = 0;  // values held at the edge of the range (Θ left it)
};

// One round's delta: Φ ← Φ + Q(Θ − Φ), where Q picks per block the smallest power-of-two step
// (≥ u_b) that keeps every code within ±qmax (qmax ≥ 1), or, with qmax = 0, the unit step and
// unbounded codes (Φ = Θ rounded to the lattice). Writes the raw delta and advances Φ exactly as
// ApplyLatticeDelta would. InvalidArgument on a size mismatch or non-finite Θ.
Status EncodeLatticeStep(const Lattice& lattice, int qmax, std::span<const float> theta, std::span<float> phi,
                         std::vector<std::byte>& raw, LatticeStepStats* stats = nullptr, ThreadPool* pool = nullptr);
// EncodeLatticeStep for blocks [first, last) alone, Θ finite (not checked): reads Θ and Φ there,
// writes the advanced values into phi_out there (which may be phi) and appends the blocks' delta
// to `out`; adds the values held at the range's edge to *saturated. The blocks of a fragment coded
// range by range and joined in order are EncodeLatticeStep's bytes.
void EncodeLatticeStepBlocks(const Lattice& lattice, int qmax, size_t first, size_t last, std::span<const float> theta,
                             std::span<const float> phi, std::span<float> phi_out, std::vector<std::byte>& out,
                             int64_t* saturated);
// For tests: the same by the exact per-value path alone (no vector kernels), which the fast paths
// must equal bit for bit.
void TEST_EncodeLatticeStepBlocksExact(const Lattice& lattice, int qmax, size_t first, size_t last,
                                       std::span<const float> theta, std::span<const float> phi,
                                       std::span<float> phi_out, std::vector<std::byte>& out, int64_t* saturated);
// Φ ← Φ + sign·delta (sign ±1). DataLoss for a malformed delta or a result out of range; Φ is
// unchanged then.
Status ApplyLatticeDelta(const Lattice& lattice, std::span<const std::byte> raw, std::span<float> phi, int sign = 1,
                         ThreadPool* pool = nullptr);
// The exact sum of a chain of deltas of the same lattice, as one delta (no deltas: all zero).
// DataLoss for a malformed delta.
Status SumLatticeDeltas(const Lattice& lattice, std::span<const std::span<const std::byte>> chain,
                        std::vector<std::byte>& raw, ThreadPool* pool = nullptr);
// Size in bytes of a well-formed raw delta (DataLoss otherwise): what a receiver checks before use.
StatusOr<size_t> CheckLatticeDelta(const Lattice& lattice, std::span<const std::byte> raw);
// The largest raw delta of this lattice (every block at width 32).
size_t MaxLatticeDeltaBytes(const Lattice& lattice);

// A full copy: the exponents and Φ's codes. DecodeLatticeFull rebuilds both (Φ sized `numel`).
Status EncodeLatticeFull(const Lattice& lattice, std::span<const float> phi, std::vector<std::byte>& raw,
                         ThreadPool* pool = nullptr);
StatusOr<Lattice> DecodeLatticeFull(std::span<const std::byte> raw, int block, size_t numel, std::vector<float>& phi,
                                    ThreadPool* pool = nullptr);
size_t MaxLatticeFullBytes(int block, size_t numel);

}  // namespace atl::exchange
