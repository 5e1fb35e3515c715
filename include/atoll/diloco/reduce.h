// Reductions over a fragment's values that come out the same, bit for bit, at any number of
// threads and any tiling of the work.
//
// A fragment of n values is cut into chunks of kReduceChunk values counted from its start; the
// part of a chunk inside one slice is a *segment* (a segment never crosses a chunk or a slice
// boundary). A sum of squares is formed per segment (SumSquares: 8 independent lanes in double,
// the lanes then added in order) and the segments' sums are added in order: per slice for slice
// norms, over the whole fragment for a fragment's norm. Work split into tiles of whole chunks
// (kTileValues) therefore reproduces the sums of one pass over the fragment exactly.
// Thread-safety: pure functions; a SegmentGrid is immutable once built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "atoll/diloco/fragment_plan.h"

namespace atl::diloco {

inline constexpr size_t kReduceChunk = 4096;
// Values one unit of parallel work covers: whole chunks, small enough that the few buffers of
// this size a thread works on stay in its cache.
inline constexpr size_t kTileValues = 4 * kReduceChunk;

// Σ x² in double with 8 independent partial sums (the loop vectorises without -ffast-math).
double SumSquares(const float* x, size_t n);
double SumSquares(const double* x, size_t n);
// Σ (a − b)², formed like SumSquares.
double SumSquaredDifferences(const float* a, const float* b, size_t n);
// Σ x² of a plain vector: one slice, chunks of kReduceChunk added in order.
double ChunkedSumSquares(std::span<const float> x);

// SumSquares of one segment given in consecutive pieces: each piece but the last a whole number of
// lanes (a multiple of 8 values). Add(x, n) takes the next piece; Sum() is then SumSquares of the
// whole segment, bit for bit.
class LaneSquares {
 public:
  static constexpr size_t kLanes = 8;
  void Add(const float* x, size_t n);
  double Sum() const;
  // The lanes, for a fused kernel that adds whole lanes of values in order (as Add does).
  double* lanes() { return lanes_; }

 private:
  double lanes_[kLanes] = {};
  double tail_ = 0;
};

struct Segment {
  size_t slice = 0;
  size_t begin = 0, end = 0;  // [begin, end) in the fragment's value positions
};

// The segments of a fragment (or of one slice of `n` values), and the tiles of whole chunks that
// cover them. Tile t spans [t·tile, min(n, (t+1)·tile)) and holds the segments
// [first_segment(t), first_segment(t + 1)).
class SegmentGrid {
 public:
  // `tile_values`: a multiple of kReduceChunk (0: kTileValues).
  explicit SegmentGrid(const Fragment& fragment, size_t tile_values = 0);
  // A vector of n values as one slice.
  explicit SegmentGrid(size_t n, size_t tile_values = 0);

  size_t numel() const { return numel_; }
  size_t num_slices() const { return slice_count_; }
  const std::vector<Segment>& segments() const { return segments_; }
  size_t tile_values() const { return tile_; }
  size_t num_tiles() const { return tile_first_.size() - 1; }
  size_t tile_begin(size_t t) const { return t * tile_; }
  size_t tile_end(size_t t) const { return t + 1 == num_tiles() ? numel_ : (t + 1) * tile_; }
  size_t first_segment(size_t t) const { return tile_first_[t]; }

  // Σ of per-segment sums `parts` (in segment order) for each slice.
  std::vector<double> PerSlice(std::span<const double> parts) const;
  // Σ of every segment's sum, in order.
  static double Total(std::span<const double> parts);

 private:
  void Build(const std::vector<int64_t>& slice_counts);
  size_t numel_ = 0, slice_count_ = 0, tile_ = 0;
  std::vector<Segment> segments_;
  std::vector<size_t> tile_first_;  // num_tiles + 1 entries
};

}  // namespace atl::diloco
