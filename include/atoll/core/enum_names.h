// EnumNames: the spellings of an enum's values, written once beside the enum, from which its
// Name/Parse pair, the run config's JSON form and the flags' help text are all derived.
//
//   enum class Weights { kTokens, kUniform };
//   inline constexpr EnumNames<Weights, 2> kWeightsNames{"weights", {{{Weights::kTokens, "tokens"},
//                                                                     {Weights::kUniform, "uniform"}}}};
//   constexpr const auto& NamesOf(Weights) { return kWeightsNames; }   // found by ADL
//
// A value may have several spellings: Name gives the first, Parse accepts any (an old spelling
// kept working). Parse of anything else is InvalidArgument "<what> must be a, b or c (got 'x')".
// Thread-safety: constant tables and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "atoll/core/status.h"
#include "atoll/core/text.h"

namespace atl {

template <typename E, size_t N>
struct EnumNames {
  const char* what;  // the setting's name in messages: "merge"
  std::array<std::pair<E, const char*>, N> names;

  // The first spelling of e; "?" for a value outside the table (a bug, never a config value).
  constexpr const char* Name(E e) const {
    for (const auto& [value, name] : names) {
      if (value == e) return name;
    }
    return "?";
  }

  StatusOr<E> Parse(std::string_view s) const {
    for (const auto& [value, name] : names) {
      if (s == name) return value;
    }
    // s may come from a peer: at most 32 bytes of it, as valid UTF-8, in the message.
    return InvalidArgumentError(std::string(what) + " must be " + Alternatives(", ", " or ") + " (got '" +
                                TruncateUtf8(s, 32) + "')");
  }

  // The values' first spellings in table order, joined: ("a, b or c") or (" | ", " | ") → "a | b | c".
  std::string Alternatives(std::string_view sep, std::string_view last_sep) const {
    std::string out;
    size_t shown = 0;
    for (size_t i = 0; i < N; ++i) {
      if (IsAlias(i)) continue;
      ++shown;
    }
    size_t k = 0;
    for (size_t i = 0; i < N; ++i) {
      if (IsAlias(i)) continue;
      if (k > 0) out += k + 1 == shown ? last_sep : sep;
      out += names[i].second;
      ++k;
    }
    return out;
  }

 private:
  // A later spelling of a value that an earlier entry already names.
  constexpr bool IsAlias(size_t i) const {
    for (size_t j = 0; j < i; ++j) {
      if (names[j].first == names[i].first) return true;
    }
    return false;
  }
};

}  // namespace atl
