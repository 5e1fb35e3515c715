// The fragment exchange both ends of the wire share: gathering a fragment's slices out of the
// model's tensors into one flat buffer (and back), and the compressed downlink with a copy Φ that
// the syncer and a learner hold bit-identically (the syncer keeps one per learner and fragment;
// docs/decisions/002-per-learner-copies.md).
//
// Downlink with error feedback. When a learner asks for fragment p, the syncer encodes the delta
// d = Θ_p − Φ_p (int4/int8/bf16/fp32) against that learner's copy, decodes it to d̂ and sets
// Φ_p ← Φ_p + d̂ (fp32 adds in one fixed order). The learner applies the same d̂ the same way and
// so holds the same bits. The quantisation error Θ_p − Φ_p is never lost: it is part of the next
// delta. A learner that starts from the run's initial values catches up with a delta from them;
// one whose copy the syncer does not know gets Θ_p in full fp32.
//
// Uplink. A learner's outer gradient for fragment p is Δ_m = Φ_p^{base} − θ_{m,p} (against the
// public copy it last received), encoded; the syncer reconstructs θ_{m,p} = Φ_p^{base} − Δ̂_m and
// takes the outer gradient against the current global value, v_m = Θ_p − θ_{m,p}, or uses Δ̂_m
// itself (SyncerOptions::outer_gradient, docs/decisions/007).
// Thread-safety: pure functions over caller-owned buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "atoll/core/parallel.h"
#include "atoll/core/status.h"
#include "atoll/diloco/codec.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/reduce.h"

namespace atl::exchange {

// Copies fragment p's slices out of `tensors` (one span per TensorSpec of the plan, in plan
// order) into `out` (size fragment.numel), slices concatenated in order.
void GatherFragment(const diloco::Fragment& fragment, std::span<const std::span<float>> tensors, std::span<float> out);
// The inverse: writes `values` into the tensors. With mix α ∈ [0,1):
// θ ← α·θ + (1−α)·value (α = 0 overwrites).
void ScatterFragment(const diloco::Fragment& fragment, std::span<const float> values,
                     std::span<const std::span<float>> tensors, double alpha = 0.0);
// The whole model: every fragment of `plan` gathered from `tensors`, in plan order; and every
// fragment p written into them from values_of(p) (size fragment.numel), overwriting.
std::vector<std::vector<float>> GatherAll(const diloco::FragmentPlan& plan, std::span<const std::span<float>> tensors);
void ScatterAll(const diloco::FragmentPlan& plan, const std::function<std::span<const float>(int)>& values_of,
                std::span<const std::span<float>> tensors);

// Encodes Θ − Φ into `encoded` and advances Φ by the decoded delta (Φ ← Φ + d̂).
// InvalidArgument when sizes differ or Θ is not finite.
Status EncodeDeltaAndAdvance(const diloco::CodecOptions& codec, std::span<const float> theta,
                             std::span<float> public_copy, std::vector<std::byte>& encoded);
// Learner side: Φ ← Φ + decode(encoded). DataLoss on a malformed payload (Φ unchanged).
Status ApplyDelta(const diloco::CodecOptions& codec, std::span<const std::byte> encoded, std::span<float> public_copy);

// Uplink: encodes Δ = Φ_base − θ.
Status EncodeOuterGradient(const diloco::CodecOptions& codec, std::span<const float> public_base,
                           std::span<const float> local, std::vector<std::byte>& encoded);
// Syncer side: the learner's parameters θ_m = Φ_base − Δ̂ into out. InvalidArgument on a size
// mismatch or a malformed payload.
Status DecodeLocal(const diloco::CodecOptions& codec, std::span<const std::byte> encoded,
                   std::span<const float> public_base, std::span<float> out);

// The checksum of fp32 values (the bits both sides must agree on): up to kChecksumPieceValues
// values, the XXH3-64 of their bytes; more, the XXH3-64 of the XXH3-64s of consecutive pieces of
// kChecksumPieceValues values (little-endian, in order), so that the pieces can be hashed in
// parallel, or by a round's pass tile by tile while they are in cache (a piece is one tile).
inline constexpr size_t kChecksumPieceValues = diloco::kTileValues;
uint64_t ValuesChecksum(std::span<const float> values, ThreadPool* pool = nullptr);
// The same from the pieces' own checksums (PieceChecksum of each piece, in order) of n values.
uint64_t PieceChecksum(std::span<const float> piece);
uint64_t CombinePieceChecksums(std::span<const uint64_t> pieces, size_t n);

// True when every value is finite.
bool AllFinite(std::span<const float> values);

}  // namespace atl::exchange
