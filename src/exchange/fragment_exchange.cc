#include "atoll/exchange/fragment_exchange.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "atoll/core/checksum.h"

namespace atl::exchange {

void GatherFragment(const diloco::Fragment& fragment, std::span<const std::span<float>> tensors, std::span<float> out) {
  ATOLL_CHECK(static_cast<int64_t>(out.size()) == fragment.numel);
  size_t pos = 0;
  for (const auto& s : fragment.slices) {
    ATOLL_CHECK(s.tensor >= 0 && static_cast<size_t>(s.tensor) < tensors.size());
    auto src = tensors[s.tensor].subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.count));
    std::copy(src.begin(), src.end(), out.begin() + static_cast<ptrdiff_t>(pos));
    pos += static_cast<size_t>(s.count);
  }
}

void ScatterFragment(const diloco::Fragment& fragment, std::span<const float> values,
                     std::span<const std::span<float>> tensors, double alpha) {
  ATOLL_CHECK(static_cast<int64_t>(values.size()) == fragment.numel);
  ATOLL_CHECK(alpha >= 0.0 && alpha < 1.0);
  size_t pos = 0;
  const float a = static_cast<float>(alpha), b = static_cast<float>(1.0 - alpha);
  for (const auto& s : fragment.slices) {
    auto dst = tensors[s.tensor].subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.count));
    if (alpha == 0.0) {
      std::copy(values.begin() + static_cast<ptrdiff_t>(pos), values.begin() + static_cast<ptrdiff_t>(pos + dst.size()),
                dst.begin());
    } else {
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = a * dst[i] + b * values[pos + i];
    }
    pos += dst.size();
  }
}

std::vector<std::vector<float>> GatherAll(const diloco::FragmentPlan& plan, std::span<const std::span<float>> tensors) {
  std::vector<std::vector<float>> out;
  out.reserve(plan.fragments.size());
  for (const auto& f : plan.fragments) {
    out.emplace_back(static_cast<size_t>(f.numel));
    GatherFragment(f, tensors, out.back());
  }
  return out;
}

void ScatterAll(const diloco::FragmentPlan& plan, const std::function<std::span<const float>(int)>& values_of,
                std::span<const std::span<float>> tensors) {
  for (const auto& f : plan.fragments) ScatterFragment(f, values_of(f.index), tensors);
}

bool AllFinite(std::span<const float> values) {
  for (float v : values) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

Status EncodeDeltaAndAdvance(const diloco::CodecOptions& codec, std::span<const float> theta,
                             std::span<float> public_copy, std::vector<std::byte>& encoded) {
  if (theta.size() != public_copy.size()) {
    return InvalidArgumentError("delta: theta has " + std::to_string(theta.size()) + " values, public copy " +
                                std::to_string(public_copy.size()));
  }
  std::vector<float> delta(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) delta[i] = theta[i] - public_copy[i];
  ATOLL_RETURN_IF_ERROR(diloco::Encode(codec, delta, encoded));
  // Advance through exactly the same code path the learner runs.
  return ApplyDelta(codec, encoded, public_copy);
}

Status ApplyDelta(const diloco::CodecOptions& codec, std::span<const std::byte> encoded, std::span<float> public_copy) {
  std::vector<float> delta(public_copy.size());
  ATOLL_RETURN_IF_ERROR(diloco::Decode(codec, encoded, delta));
  for (size_t i = 0; i < delta.size(); ++i) public_copy[i] += delta[i];
  return Status::Ok();
}

Status EncodeOuterGradient(const diloco::CodecOptions& codec, std::span<const float> public_base,
                           std::span<const float> local, std::vector<std::byte>& encoded) {
  if (public_base.size() != local.size()) {
    return InvalidArgumentError("outer gradient: base has " + std::to_string(public_base.size()) + " values, local " +
                                std::to_string(local.size()));
  }
  std::vector<float> delta(local.size());
  for (size_t i = 0; i < local.size(); ++i) delta[i] = public_base[i] - local[i];
  return diloco::Encode(codec, delta, encoded);
}

Status DecodeLocal(const diloco::CodecOptions& codec, std::span<const std::byte> encoded,
                   std::span<const float> public_base, std::span<float> out) {
  if (public_base.size() != out.size()) return InvalidArgumentError("outer gradient: size mismatch");
  ATOLL_RETURN_IF_ERROR(diloco::Decode(codec, encoded, out));  // out = Δ̂ = Φ_base − θ_m
  for (size_t i = 0; i < out.size(); ++i) out[i] = public_base[i] - out[i];
  return Status::Ok();
}

uint64_t PieceChecksum(std::span<const float> piece) { return Checksum64(piece.data(), piece.size() * sizeof(float)); }

uint64_t CombinePieceChecksums(std::span<const uint64_t> pieces, size_t n) {
  if (n <= kChecksumPieceValues) return pieces.empty() ? PieceChecksum({}) : pieces.front();
  return Checksum64(pieces.data(), pieces.size() * sizeof(uint64_t));
}

uint64_t ValuesChecksum(std::span<const float> values, ThreadPool* pool) {
  if (values.size() <= kChecksumPieceValues) return PieceChecksum(values);
  std::vector<uint64_t> pieces((values.size() + kChecksumPieceValues - 1) / kChecksumPieceValues);
  ForRanges(pool, pieces.size(), 16, [&](size_t first, size_t last) {
    for (size_t i = first; i < last; ++i) {
      pieces[i] = PieceChecksum(values.subspan(
          i * kChecksumPieceValues, std::min(kChecksumPieceValues, values.size() - i * kChecksumPieceValues)));
    }
  });
  return CombinePieceChecksums(pieces, values.size());
}

}  // namespace atl::exchange
