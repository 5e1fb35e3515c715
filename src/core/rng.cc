#include "atoll/core/rng.h"

#include <cmath>
#include <numbers>

#include "atoll/core/status.h"

namespace atl {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Rng::Rng(uint64_t seed) {
  uint64_t st = seed;
  for (auto& s : s_) s = SplitMix64(st);
}

static inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t Rng::NextU64() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

uint64_t Rng::UniformInt(uint64_t n) {
  ATOLL_CHECK(n > 0);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = NextU64();
  } while (x >= limit);
  return x % n;
}

double Rng::Exponential(double mean) {
  ATOLL_CHECK(mean > 0);
  // 1 - U is in (0, 1], so the log is finite.
  return -mean * std::log(1.0 - Uniform());
}

double Rng::Normal() {
  if (has_cached_normal_) {
    has_cached_normal_ = false;
    return cached_normal_;
  }
  const double u1 = 1.0 - Uniform();  // (0, 1]
  const double u2 = Uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  cached_normal_ = r * std::sin(theta);
  has_cached_normal_ = true;
  return r * std::cos(theta);
}

double Rng::LogNormal(double median, double sigma) {
  ATOLL_CHECK(median > 0);
  return median * std::exp(sigma * Normal());
}

Rng Rng::Fork(uint64_t label) {
  uint64_t st = NextU64() ^ (label * 0xD1B54A32D192ED03ULL);
  return Rng(SplitMix64(st));
}

}  // namespace atl
