#include "atoll/core/text.h"

#include <algorithm>
#include <cstdint>

namespace atl {
namespace {

// Length of the well-formed UTF-8 sequence at s[i], or 0 if there is none.
size_t SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t min = 0, cp = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2, min = 0x80, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, min = 0x800, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, min = 0x10000, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string TruncateUtf8(std::string_view s, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(s.size(), max_bytes));
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = SequenceLength(s, i);
    const size_t take = n == 0 ? 1 : n;
    if (out.size() + take > max_bytes) break;
    if (n == 0) {
      out.push_back('?');
    } else {
      out.append(s.substr(i, n));
    }
    i += take;
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::vector<std::string> SplitText(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = text.find(sep, start)) != std::string_view::npos; start = at + 1) {
    out.emplace_back(text.substr(start, at - start));
  }
  out.emplace_back(text.substr(start));
  return out;
}

}  // namespace atl
