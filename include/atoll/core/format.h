// Numbers for people: the one thousands-grouping helper every report and CLI line uses.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace atl {

// 1234567 → "1,234,567"; -1234 → "-1,234"; 999 → "999".
std::string Grouped(int64_t value);

// A count kept as a double (token totals summed in floating point, e.g. 1773568.0000000019):
// rounded to the nearest integer, then grouped. Non-finite values give "n/a".
std::string GroupedRound(double value);

// Bytes in decimal units with one decimal: 999 → "999.0 B", 1234567 → "1.2 MB" (up to TB).
std::string HumanBytes(double bytes);

}  // namespace atl
