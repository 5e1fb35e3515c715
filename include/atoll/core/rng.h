// Rng: a small, fast, seeded random number generator (xoshiro256** seeded through splitmix64).
//
// Every component that needs randomness takes an Rng (or a seed) as a parameter so that runs,
// chaos schedules and simulations replay exactly. The sequence for a given seed is fixed by this
// file and identical on every platform (no std:: distributions, whose outputs vary by library).
// Thread-safety: none; give each thread its own Rng (see Fork()).
#pragma once

#include <cstdint>

namespace atl {

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t NextU64();
  // Uniform in [0, 1) with 53 random bits.
  double Uniform();
  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n); n > 0. Unbiased (rejection).
  uint64_t UniformInt(uint64_t n);
  // Exponential with the given mean (> 0).
  double Exponential(double mean);
  // Standard normal (Box-Muller, one value per call; the pair's second value is cached).
  double Normal();
  double Normal(double mean, double stddev) { return mean + stddev * Normal(); }
  // Log-normal with the given median and sigma of the underlying normal.
  double LogNormal(double median, double sigma);
  // Bernoulli(p).
  bool Bernoulli(double p) { return Uniform() < p; }

  // A new independent stream derived from this one and a label (e.g. learner id).
  Rng Fork(uint64_t label);

 private:
  uint64_t s_[4];
  bool has_cached_normal_ = false;
  double cached_normal_ = 0.0;
};

// splitmix64 step: the seed mixer, also handy for hashing small integers.
uint64_t SplitMix64(uint64_t& state);

}  // namespace atl
