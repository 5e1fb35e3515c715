#include "atoll/core/format.h"

#include <cmath>
#include <cstdio>

namespace atl {

std::string Grouped(int64_t value) {
  // Through the unsigned magnitude, so INT64_MIN works too.
  const uint64_t magnitude = value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

std::string GroupedRound(double value) {
  if (!std::isfinite(value)) return "n/a";
  const double r = std::round(value);
  if (r >= 9.2e18 || r <= -9.2e18) {  // beyond int64: scientific notation
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3e", r);
    return buf;
  }
  return Grouped(static_cast<int64_t>(r));
}

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f %s", b, units[u]);
  return buf;
}

}  // namespace atl
