// FragmentMerger: MergeFragment (merge.h) for a round whose contributions are not held as vectors
// — the syncer keeps each push encoded and decodes the part it needs when it needs it.
//
// The fragment is worked on in tiles of whole reduction chunks (reduce.h), in parallel over the
// pool, each thread holding a few tile-sized buffers and nothing fragment-sized:
//   pass 1  every contribution's slice norms (RDA's radius and unit vectors; also the norm the
//           caller's Vet sees before anything is merged),
//   pass 2  the norm of each RDA slice's direction Σ (w/Σw)·v/‖v‖,
//   pass 3  the merged values, handed to the caller's Sink one tile at a time.
// A contribution's values are asked for once per pass (Source; pass 3 reuses pass 2's sums when
// the caller lends a buffer for them, KeepSums); passes that a rule does not need
// are skipped (a weighted mean everywhere needs pass 3 alone, unless a Vet is given). Zero-weight
// contributions are never read. The merged values, norms and merged norm are the same bits at
// any thread count and equal MergeFragment's on the same vectors (MergeFragment is this merger
// over spans).
// Thread-safety: Run calls Source and Sink concurrently from the pool's threads for disjoint
// tiles; one Run at a time per merger.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "atoll/core/parallel.h"
#include "atoll/core/status.h"
#include "atoll/diloco/contributions.h"
#include "atoll/diloco/fragment_plan.h"
#include "atoll/diloco/merge.h"
#include "atoll/diloco/reduce.h"

namespace atl::diloco {

class FragmentMerger {
 public:
  // Writes contribution m's values of fragment positions [begin, end) into out[0, end − begin)
  // (a ContributionSource with the default fused forms).
  using Source = std::function<void(size_t m, size_t begin, size_t end, float* out)>;
  // Receives the merged values of tile `tile`, positions [begin, end).
  using Sink = std::function<void(size_t tile, size_t begin, size_t end, std::span<const float> merged)>;
  // Once every contribution's norm is known, before any is merged: false drops contribution m
  // (its weight becomes 0).
  using Vet = std::function<bool(size_t m, double norm)>;

  // InvalidArgument for no weights, a weight that is negative or not finite, or weights that sum
  // to infinity. `tile_values` as SegmentGrid's (0: kTileValues).
  static StatusOr<FragmentMerger> Create(const Fragment& fragment, MergeRule rule, std::vector<double> weights,
                                         ThreadPool* pool = nullptr, size_t tile_values = 0);

  const SegmentGrid& grid() const { return grid_; }
  // Runs the passes. A Vet that drops a contribution is applied before the merge's coefficients.
  void Run(const ContributionSource& source, const Sink& sink, const Vet& vet = {});
  void Run(const Source& source, const Sink& sink, const Vet& vet = {});
  // Contribution m's pass-1 result, known before Run (the syncer forms it when the push joins the
  // round): pass 1 then skips it. Must be what pass 1 would compute (NormsOf, same source).
  void GiveNorms(size_t m, std::span<const double> slice_norms, double norm);
  struct ContributionNorms {
    std::vector<double> slice_norms;  // per slice of the fragment
    double norm = 0;                  // over the fragment
  };
  // Pass 1 for contribution m of `source` alone: the norms Run would compute for it, bit for bit.
  static StatusOr<ContributionNorms> NormsOf(const Fragment& fragment, const ContributionSource& source, size_t m,
                                             ThreadPool* pool = nullptr);
  // A buffer of the fragment's size (resized by Run; the caller keeps it between rounds so its
  // pages stay mapped) in which pass 2 keeps each tile's sums Σ coef·v for pass 3, which then
  // reads them instead of asking every contribution for its values a third time. The sums are
  // kept rounded to fp32 (pass 2 measures the direction on the double sums first): pass 3 uses
  // nothing else of them, so the bits are the same either way. Without one (the default) nothing
  // fragment-sized is held.
  void KeepSums(std::vector<float>* buffer) { kept_ = buffer; }

  // After Run: the weights (vetted), contribution m's norm per slice and over the fragment (0 for
  // a zero-weight contribution, which is never read; not computed when no pass needed them), and
  // the merged fragment's norm.
  const std::vector<double>& weights() const { return weights_; }
  const std::vector<double>& slice_norms(size_t m) const { return slice_norms_[m]; }
  double norm(size_t m) const { return norms_[m]; }
  double merged_norm() const { return merged_norm_; }

 private:
  FragmentMerger() = default;
  bool Rda(size_t slice) const;
  bool AnyRda() const;
  void Norms(const ContributionSource& source);
  void Coefficients();
  // Σ_m coef·v over one tile into acc (double).
  void Accumulate(const ContributionSource& source, size_t begin, size_t end, std::vector<float>& v, double* acc) const;
  void DirectionNorms(const ContributionSource& source);
  void Merge(const ContributionSource& source, const Sink& sink);

  Fragment fragment_;
  SegmentGrid grid_{0};
  MergeRule rule_ = MergeRule::kRda;
  ThreadPool* pool_ = nullptr;
  std::vector<double> weights_;
  double sum_ = 0;
  std::vector<std::vector<double>> slice_norms_;  // [m][slice]
  std::vector<double> norms_;                     // [m]
  std::vector<std::vector<double>> coef_;         // [slice][m]
  std::vector<double> radius_, scale_;            // per slice (RDA)
  std::vector<bool> any_direction_;               // per slice (RDA)
  std::vector<bool> zero_;                        // per slice: merges to zeros (no weight; RDA: no direction)
  double merged_norm_ = 0;
  std::vector<float>* kept_ = nullptr;  // KeepSums
  std::vector<bool> given_;             // per contribution: GiveNorms
  bool directions_kept_ = false;        // pass 2 ran and left every tile's sums in *kept_
};

}  // namespace atl::diloco
