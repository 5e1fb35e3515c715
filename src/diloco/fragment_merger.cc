#include "atoll/diloco/fragment_merger.h"

#include "atoll/core/simd.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

// Per-thread tile buffers (pool threads keep theirs between rounds).
std::vector<float>& FloatTile(int which) {
  thread_local std::vector<float> tiles[2];
  return tiles[which];
}
std::vector<double>& DoubleTile() {
  thread_local std::vector<double> tile;
  return tile;
}

// a += c·x in double.
ATOLL_SIMD_CLONES void AddScaled(double* __restrict a, const float* __restrict x, double c, size_t n) {
  for (size_t j = 0; j < n; ++j) a[j] += c * static_cast<double>(x[j]);
}

}  // namespace

StatusOr<FragmentMerger> FragmentMerger::Create(const Fragment& fragment, MergeRule rule, std::vector<double> weights,
                                                ThreadPool* pool, size_t tile_values) {
  const std::string what = "merge fragment " + std::to_string(fragment.index);
  if (weights.empty()) return InvalidArgumentError(what + ": no inputs");
  if (tile_values % kReduceChunk != 0) return InvalidArgumentError(what + ": tiles must be whole reduction chunks");
  FragmentMerger f;
  for (size_t m = 0; m < weights.size(); ++m) {
    if (!std::isfinite(weights[m]) || weights[m] < 0) {
      return InvalidArgumentError(what + ": weight " + std::to_string(m) + " is " + std::to_string(weights[m]) +
                                  " (must be finite and ≥ 0)");
    }
    f.sum_ += weights[m];
  }
  if (!std::isfinite(f.sum_)) return InvalidArgumentError(what + ": the weights sum to infinity");
  f.fragment_ = fragment;
  f.grid_ = SegmentGrid(fragment, tile_values);
  f.rule_ = rule;
  f.pool_ = pool;
  f.weights_ = std::move(weights);
  const size_t slices = fragment.slices.size();
  f.slice_norms_.assign(f.weights_.size(), std::vector<double>(slices, 0.0));
  f.norms_.assign(f.weights_.size(), 0.0);
  return f;
}

bool FragmentMerger::Rda(size_t slice) const {
  return rule_ == MergeRule::kRdaAll || (rule_ == MergeRule::kRda && !fragment_.slices[slice].is_embedding);
}

bool FragmentMerger::AnyRda() const {
  for (size_t s = 0; s < fragment_.slices.size(); ++s) {
    if (Rda(s)) return true;
  }
  return false;
}

void FragmentMerger::Run(const Source& source, const Sink& sink, const Vet& vet) {
  if (AnyRda() || vet) Norms(source);
  if (vet) {
    sum_ = 0;
    for (size_t m = 0; m < weights_.size(); ++m) {
      if (weights_[m] > 0 && !vet(m, norms_[m])) weights_[m] = 0;
      sum_ += weights_[m];
    }
  }
  Coefficients();
  DirectionNorms(source);
  Merge(source, sink);
}

void FragmentMerger::Norms(const Source& source) {
  const auto& segs = grid_.segments();
  std::vector<std::vector<double>> parts(weights_.size());
  for (size_t m = 0; m < weights_.size(); ++m) {
    if (weights_[m] > 0) parts[m].assign(segs.size(), 0.0);
  }
  // Segment by segment (≤ kReduceChunk values: each contribution's part stays in L1 between its
  // decoding and its use), every contribution in turn.
  auto tile = [&](size_t t) {
    std::vector<float>& v = FloatTile(0);
    v.resize(kReduceChunk);
    for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
      for (size_t m = 0; m < weights_.size(); ++m) {
        if (weights_[m] == 0) continue;
        source(m, segs[k].begin, segs[k].end, v.data());
        parts[m][k] = SumSquares(v.data(), segs[k].end - segs[k].begin);
      }
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(grid_.num_tiles(), tile);
  } else {
    for (size_t t = 0; t < grid_.num_tiles(); ++t) tile(t);
  }
  for (size_t m = 0; m < weights_.size(); ++m) {
    if (weights_[m] == 0) continue;
    const std::vector<double> per_slice = grid_.PerSlice(parts[m]);
    for (size_t s = 0; s < per_slice.size(); ++s) slice_norms_[m][s] = std::sqrt(per_slice[s]);
    norms_[m] = std::sqrt(SegmentGrid::Total(parts[m]));
  }
}

void FragmentMerger::Coefficients() {
  const size_t slices = fragment_.slices.size();
  coef_.assign(weights_.size(), std::vector<double>(slices, 0.0));
  radius_.assign(slices, 0.0);
  scale_.assign(slices, 0.0);
  any_direction_.assign(slices, false);
  zero_.assign(slices, false);
  for (size_t s = 0; s < slices; ++s) zero_[s] = sum_ == 0 || Rda(s);  // RDA slices: until a direction is found
  for (size_t s = 0; s < slices && sum_ > 0; ++s) {
    for (size_t m = 0; m < weights_.size(); ++m) {
      if (weights_[m] == 0) continue;
      if (!Rda(s)) {
        coef_[m][s] = weights_[m] / sum_;
        continue;
      }
      // RDA (as RdaMerge): radius = Σ (w/Σw)·‖v‖; direction = Σ (w/Σw)·v/‖v‖.
      const double norm = slice_norms_[m][s];
      radius_[s] += weights_[m] / sum_ * norm;
      if (norm > 0) {
        coef_[m][s] = weights_[m] / sum_ / norm;
        any_direction_[s] = true;
      }
    }
  }
}

void FragmentMerger::Accumulate(const Source& source, size_t begin, size_t end, std::vector<float>& v,
                                std::vector<double>& acc) const {
  const auto& segs = grid_.segments();
  const size_t t = begin / grid_.tile_values();
  const size_t first = grid_.first_segment(t), last = grid_.first_segment(t + 1);
  std::fill(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(end - begin), 0.0);
  for (size_t k = first; k < last; ++k) {  // segment by segment, as Norms
    double* a = acc.data() + (segs[k].begin - begin);
    for (size_t m = 0; m < weights_.size(); ++m) {
      const double c = coef_[m][segs[k].slice];
      if (c == 0) continue;
      source(m, segs[k].begin, segs[k].end, v.data());
      AddScaled(a, v.data(), c, segs[k].end - segs[k].begin);
    }
  }
}

void FragmentMerger::DirectionNorms(const Source& source) {
  bool needed = false;
  for (size_t s = 0; s < fragment_.slices.size(); ++s) needed |= Rda(s) && any_direction_[s];
  if (!needed || sum_ == 0) return;
  const auto& segs = grid_.segments();
  std::vector<double> parts(segs.size(), 0.0);
  auto tile = [&](size_t t) {
    const size_t b = grid_.tile_begin(t), e = grid_.tile_end(t);
    std::vector<float>& v = FloatTile(0);
    std::vector<double>& acc = DoubleTile();
    v.resize(kReduceChunk);
    acc.resize(grid_.tile_values());
    Accumulate(source, b, e, v, acc);
    for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
      if (Rda(segs[k].slice)) parts[k] = SumSquares(acc.data() + (segs[k].begin - b), segs[k].end - segs[k].begin);
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(grid_.num_tiles(), tile);
  } else {
    for (size_t t = 0; t < grid_.num_tiles(); ++t) tile(t);
  }
  const std::vector<double> per_slice = grid_.PerSlice(parts);
  for (size_t s = 0; s < per_slice.size(); ++s) {
    if (!Rda(s) || !any_direction_[s]) continue;
    const double direction_norm = std::sqrt(per_slice[s]);
    // The unit vectors cancelled exactly: unit(0) = 0.
    if (direction_norm > 0) {
      scale_[s] = radius_[s] / direction_norm;
      zero_[s] = false;
    }
  }
}

void FragmentMerger::Merge(const Source& source, const Sink& sink) {
  const auto& segs = grid_.segments();
  std::vector<double> parts(segs.size(), 0.0);
  auto tile = [&](size_t t) {
    const size_t b = grid_.tile_begin(t), e = grid_.tile_end(t);
    std::vector<float>& v = FloatTile(0);
    std::vector<float>& out = FloatTile(1);
    std::vector<double>& acc = DoubleTile();
    v.resize(kReduceChunk);
    out.resize(grid_.tile_values());
    acc.resize(grid_.tile_values());
    if (sum_ > 0) Accumulate(source, b, e, v, acc);
    for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
      const size_t s = segs[k].slice, off = segs[k].begin - b, len = segs[k].end - segs[k].begin;
      float* o = out.data() + off;
      const double* a = acc.data() + off;
      if (zero_[s]) {
        std::fill(o, o + len, 0.0f);
      } else if (Rda(s)) {
        const double scale = scale_[s];
        for (size_t j = 0; j < len; ++j) o[j] = static_cast<float>(static_cast<double>(static_cast<float>(a[j])) * scale);
      } else {
        for (size_t j = 0; j < len; ++j) o[j] = static_cast<float>(a[j]);
      }
      parts[k] = SumSquares(o, len);
    }
    sink(t, b, e, std::span<const float>(out.data(), e - b));
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(grid_.num_tiles(), tile);
  } else {
    for (size_t t = 0; t < grid_.num_tiles(); ++t) tile(t);
  }
  merged_norm_ = std::sqrt(SegmentGrid::Total(parts));
}

}  // namespace atl::diloco
