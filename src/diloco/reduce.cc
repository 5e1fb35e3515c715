#include "atoll/diloco/reduce.h"

#include <algorithm>

#include "atoll/core/simd.h"
#include "atoll/core/status.h"

namespace atl::diloco {
namespace {

constexpr size_t kLanes = 8;

template <typename T, typename Square>
double Lanes(const T* x, size_t n, Square square) {
  double acc[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) acc[k] += square(i + k);
  }
  double tail = 0;
  for (; i < n; ++i) tail += square(i);
  double s = 0;
  for (double a : acc) s += a;
  (void)x;
  return s + tail;
}

}  // namespace

ATOLL_SIMD_CLONES double SumSquares(const float* x, size_t n) {
  return Lanes(x, n, [x](size_t i) {
    const double v = static_cast<double>(x[i]);
    return v * v;
  });
}

ATOLL_SIMD_CLONES double SumSquares(const double* x, size_t n) {
  return Lanes(x, n, [x](size_t i) { return x[i] * x[i]; });
}

ATOLL_SIMD_CLONES double SumSquaredDifferences(const float* a, const float* b, size_t n) {
  return Lanes(a, n, [a, b](size_t i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    return d * d;
  });
}

namespace {

// x[i]² into lanes[i % 8] for the whole lanes of x, and the rest in order into *tail.
ATOLL_SIMD_CLONES void AddSquares(const float* __restrict x, size_t n, double* __restrict lanes, double* tail) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lanes[k] += static_cast<double>(x[i + k]) * static_cast<double>(x[i + k]);
  }
  for (; i < n; ++i) *tail += static_cast<double>(x[i]) * static_cast<double>(x[i]);
}

}  // namespace

void LaneSquares::Add(const float* x, size_t n) { AddSquares(x, n, lanes_, &tail_); }

double LaneSquares::Sum() const {
  double s = 0;
  for (double a : lanes_) s += a;
  return s + tail_;
}

double ChunkedSumSquares(std::span<const float> x) {
  double s = 0;
  for (size_t base = 0; base < x.size(); base += kReduceChunk) {
    s += SumSquares(x.data() + base, std::min(kReduceChunk, x.size() - base));
  }
  return s;
}

SegmentGrid::SegmentGrid(const Fragment& fragment, size_t tile_values) {
  tile_ = tile_values == 0 ? kTileValues : tile_values;
  std::vector<int64_t> counts;
  for (const TensorSlice& s : fragment.slices) counts.push_back(s.count);
  Build(counts);
}

SegmentGrid::SegmentGrid(size_t n, size_t tile_values) {
  tile_ = tile_values == 0 ? kTileValues : tile_values;
  Build({static_cast<int64_t>(n)});
}

void SegmentGrid::Build(const std::vector<int64_t>& slice_counts) {
  ATOLL_CHECK(tile_ % kReduceChunk == 0 && tile_ > 0);
  slice_count_ = slice_counts.size();
  size_t pos = 0;
  for (size_t s = 0; s < slice_counts.size(); ++s) {
    const size_t end = pos + static_cast<size_t>(slice_counts[s]);
    while (pos < end) {
      const size_t chunk_end = (pos / kReduceChunk + 1) * kReduceChunk;
      const size_t seg_end = std::min(end, chunk_end);
      segments_.push_back({s, pos, seg_end});
      pos = seg_end;
    }
  }
  numel_ = pos;
  const size_t tiles = std::max<size_t>(1, (numel_ + tile_ - 1) / tile_);
  tile_first_.assign(tiles + 1, segments_.size());
  size_t k = 0;
  for (size_t t = 0; t < tiles; ++t) {
    while (k < segments_.size() && segments_[k].begin < t * tile_) ++k;
    tile_first_[t] = k;
  }
}

std::vector<double> SegmentGrid::PerSlice(std::span<const double> parts) const {
  ATOLL_CHECK(parts.size() == segments_.size());
  std::vector<double> out(slice_count_, 0.0);
  for (size_t k = 0; k < segments_.size(); ++k) out[segments_[k].slice] += parts[k];
  return out;
}

double SegmentGrid::Total(std::span<const double> parts) {
  double s = 0;
  for (double p : parts) s += p;
  return s;
}

}  // namespace atl::diloco
