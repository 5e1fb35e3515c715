#include "atoll/diloco/fragment_merger.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace atl::diloco {
namespace {

// A contribution's values are asked for in pieces of this many (a whole number of lanes, so that
// LaneSquares adds them up as SumSquares would the whole segment).
constexpr size_t kPieceValues = 1024;
static_assert(kPieceValues % LaneSquares::kLanes == 0 && kReduceChunk % kPieceValues == 0);

// Per-thread tile buffers (pool threads keep theirs between rounds).
std::vector<float>& FloatTile(int which) {
  thread_local std::vector<float> tiles[2];
  return tiles[which];
}
std::vector<double>& DoubleTile() {
  thread_local std::vector<double> tile;
  return tile;
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

namespace {

// A Source function as a ContributionSource.
class FunctionSource final : public ContributionSource {
 public:
  explicit FunctionSource(const FragmentMerger::Source& fn) : fn_(fn) {}
  void Values(size_t m, size_t begin, size_t end, float* out) const override { fn_(m, begin, end, out); }

 private:
  const FragmentMerger::Source& fn_;
};

}  // namespace

void FragmentMerger::Run(const Source& source, const Sink& sink, const Vet& vet) {
  Run(FunctionSource(source), sink, vet);
}

void FragmentMerger::Run(const ContributionSource& source, const Sink& sink, const Vet& vet) {
  if (AnyRda() || vet) Norms(source);
  if (vet) {
    sum_ = 0;
    for (size_t m = 0; m < weights_.size(); ++m) {
      if (weights_[m] > 0 && !vet(m, norms_[m])) weights_[m] = 0;
      sum_ += weights_[m];
    }
  }
  Coefficients();
  directions_kept_ = false;
  DirectionNorms(source);
  Merge(source, sink);
}

void FragmentMerger::GiveNorms(size_t m, std::span<const double> slice_norms, double norm) {
  ATOLL_CHECK(m < weights_.size() && slice_norms.size() == fragment_.slices.size());
  slice_norms_[m].assign(slice_norms.begin(), slice_norms.end());
  norms_[m] = norm;
  given_.resize(weights_.size(), false);
  given_[m] = true;
}

StatusOr<FragmentMerger::ContributionNorms> FragmentMerger::NormsOf(const Fragment& fragment,
                                                                    const ContributionSource& source, size_t m,
                                                                    ThreadPool* pool) {
  // A merger of contribution m alone (the others weigh 0 and are never read) runs pass 1.
  std::vector<double> weights(m + 1, 0.0);
  weights[m] = 1.0;
  ATOLL_ASSIGN_OR_RETURN(FragmentMerger merger, Create(fragment, MergeRule::kRda, std::move(weights), pool));
  merger.Norms(source);
  return ContributionNorms{merger.slice_norms_[m], merger.norms_[m]};
}

void FragmentMerger::Norms(const ContributionSource& source) {
  const auto& segs = grid_.segments();
  given_.resize(weights_.size(), false);
  std::vector<std::vector<double>> parts(weights_.size());
  bool any = false;
  for (size_t m = 0; m < weights_.size(); ++m) {
    if (weights_[m] > 0 && !given_[m]) {
      parts[m].assign(segs.size(), 0.0);
      any = true;
    }
  }
  if (!any) return;  // every norm was given
  // Segment by segment, each in pieces of kPieceValues with every contribution in turn: a piece of
  // each contribution stays in L1 between its decoding and its use, and so do the piece's values
  // of whatever the source reads beside the contribution (the reference, the base).
  auto tile = [&](size_t t) {
    std::vector<float>& v = FloatTile(0);
    v.resize(kPieceValues);
    std::vector<LaneSquares> sums(weights_.size());
    for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
      std::fill(sums.begin(), sums.end(), LaneSquares{});
      for (size_t pb = segs[k].begin; pb < segs[k].end; pb += kPieceValues) {
        const size_t pe = std::min(segs[k].end, pb + kPieceValues);
        for (size_t m = 0; m < weights_.size(); ++m) {
          if (parts[m].empty()) continue;
          source.AddSquares(m, pb, pe, v.data(), sums[m]);
        }
      }
      for (size_t m = 0; m < weights_.size(); ++m) {
        if (!parts[m].empty()) parts[m][k] = sums[m].Sum();
      }
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(grid_.num_tiles(), tile);
  } else {
    for (size_t t = 0; t < grid_.num_tiles(); ++t) tile(t);
  }
  for (size_t m = 0; m < weights_.size(); ++m) {
    if (parts[m].empty()) continue;
    const std::vector<double> per_slice = grid_.PerSlice(parts[m]);
    for (size_t s = 0; s < per_slice.size(); ++s) slice_norms_[m][s] = std::sqrt(per_slice[s]);
    norms_[m] = std::sqrt(SegmentGrid::Total(parts[m]));
  }
}

void FragmentMerger::Coefficients() {
  const size_t slices = fragment_.slices.size();
  coef_.assign(slices, std::vector<double>(weights_.size(), 0.0));
  radius_.assign(slices, 0.0);
  scale_.assign(slices, 0.0);
  any_direction_.assign(slices, false);
  zero_.assign(slices, false);
  for (size_t s = 0; s < slices; ++s) zero_[s] = sum_ == 0 || Rda(s);  // RDA slices: until a direction is found
  for (size_t s = 0; s < slices && sum_ > 0; ++s) {
    for (size_t m = 0; m < weights_.size(); ++m) {
      if (weights_[m] == 0) continue;
      if (!Rda(s)) {
        coef_[s][m] = weights_[m] / sum_;
        continue;
      }
      // RDA (as RdaMerge): radius = Σ (w/Σw)·‖v‖; direction = Σ (w/Σw)·v/‖v‖.
      const double norm = slice_norms_[m][s];
      radius_[s] += weights_[m] / sum_ * norm;
      if (norm > 0) {
        coef_[s][m] = weights_[m] / sum_ / norm;
        any_direction_[s] = true;
      }
    }
  }
}

void FragmentMerger::Accumulate(const ContributionSource& source, size_t begin, size_t end, std::vector<float>& v,
                                double* acc) const {
  const auto& segs = grid_.segments();
  const size_t t = begin / grid_.tile_values();
  const size_t first = grid_.first_segment(t), last = grid_.first_segment(t + 1);
  for (size_t k = first; k < last; ++k) {  // segment by segment and piece by piece, as Norms
    for (size_t pb = segs[k].begin; pb < segs[k].end; pb += kPieceValues) {
      const size_t pe = std::min(segs[k].end, pb + kPieceValues);
      source.Accumulate(coef_[segs[k].slice], pb, pe, v.data(), acc + (pb - begin));
    }
  }
}

void FragmentMerger::DirectionNorms(const ContributionSource& source) {
  bool needed = false;
  for (size_t s = 0; s < fragment_.slices.size(); ++s) needed |= Rda(s) && any_direction_[s];
  if (!needed || sum_ == 0) return;
  const auto& segs = grid_.segments();
  std::vector<double> parts(segs.size(), 0.0);
  if (kept_ != nullptr) kept_->resize(grid_.numel());
  auto tile = [&](size_t t) {
    const size_t b = grid_.tile_begin(t), e = grid_.tile_end(t);
    std::vector<float>& v = FloatTile(0);
    v.resize(kPieceValues);
    std::vector<double>& acc = DoubleTile();
    acc.resize(grid_.tile_values());
    Accumulate(source, b, e, v, acc.data());
    for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
      if (Rda(segs[k].slice)) parts[k] = SumSquares(acc.data() + (segs[k].begin - b), segs[k].end - segs[k].begin);
    }
    // Pass 3 reads a sum only as fp32 (Merge): kept so, half the bytes of the doubles.
    if (kept_ != nullptr) std::copy(acc.begin(), acc.begin() + static_cast<std::ptrdiff_t>(e - b), kept_->data() + b);
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(grid_.num_tiles(), tile);
  } else {
    for (size_t t = 0; t < grid_.num_tiles(); ++t) tile(t);
  }
  directions_kept_ = kept_ != nullptr;
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

void FragmentMerger::Merge(const ContributionSource& source, const Sink& sink) {
  const auto& segs = grid_.segments();
  std::vector<double> parts(segs.size(), 0.0);
  auto tile = [&](size_t t) {
    const size_t b = grid_.tile_begin(t), e = grid_.tile_end(t);
    std::vector<float>& out = FloatTile(1);
    out.resize(grid_.tile_values());
    // The sums pass 2 kept (as fp32), or formed here (as double, read as fp32).
    const bool kept = kept_ != nullptr && directions_kept_;
    const float* kept_sums = kept ? kept_->data() + b : nullptr;
    const double* acc = nullptr;
    if (!kept) {
      std::vector<float>& v = FloatTile(0);
      std::vector<double>& tile_acc = DoubleTile();
      v.resize(kPieceValues);
      tile_acc.resize(grid_.tile_values());
      if (sum_ > 0) Accumulate(source, b, e, v, tile_acc.data());
      acc = tile_acc.data();
    }
    // a: the tile's sums, fp32 (kept) or double (formed here); either is read as fp32.
    const auto merge = [&](const auto* a) {
      for (size_t k = grid_.first_segment(t); k < grid_.first_segment(t + 1); ++k) {
        const size_t s = segs[k].slice, off = segs[k].begin - b, len = segs[k].end - segs[k].begin;
        float* o = out.data() + off;
        if (zero_[s]) {
          std::fill(o, o + len, 0.0f);
        } else if (Rda(s)) {
          const double scale = scale_[s];
          for (size_t j = 0; j < len; ++j)
            o[j] = static_cast<float>(static_cast<double>(static_cast<float>(a[off + j])) * scale);
        } else {
          for (size_t j = 0; j < len; ++j) o[j] = static_cast<float>(a[off + j]);
        }
        parts[k] = SumSquares(o, len);
      }
    };
    if (kept) merge(kept_sums);
    else merge(acc);
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
