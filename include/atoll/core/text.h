// Text that came from outside (a client's host name, a run id): cut to a byte limit without
// splitting a UTF-8 character, JSON output that never throws on bad bytes, and lists in one flag.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

// Valid UTF-8 of at most `max_bytes` bytes: `s` cut before the first character that would not
// fit, with every byte that is not part of a well-formed UTF-8 sequence (stray continuation
// bytes, overlong forms, surrogates, > U+10FFFF, truncated sequences) replaced by '?'.
std::string TruncateUtf8(std::string_view s, size_t max_bytes);

// True when `s` is well-formed UTF-8.
bool IsValidUtf8(std::string_view s);

// Every piece of `text` between `sep`s, empty ones included ("a,,b" → "a", "", "b"; "" → "").
std::vector<std::string> SplitText(std::string_view text, char sep);

// nlohmann::json::dump that never throws on invalid UTF-8 in strings (replaces it with U+FFFD).
// A template so that atoll_core needs no JSON library.
template <typename Json>
std::string DumpJson(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace atl
