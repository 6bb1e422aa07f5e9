// Whole-string decimal number parsing for text read from files and folder names, without the
// exceptions of std::stoi / std::stoull (whose what() is the bare word "stoi"): a bad or
// out-of-range number is a moe::Error naming `what` (the field, file or folder) and the text.
#pragma once
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace moe::io {

// The value of `text` if it is all decimal digits (an optional leading '-' for signed T) and fits
// in [lo, hi]; nullopt otherwise. No spaces, no '+', no hex, no trailing characters.
template <class T>
std::optional<T> try_parse_int(std::string_view text, T lo = std::numeric_limits<T>::min(),
                               T hi = std::numeric_limits<T>::max()) {
  if (text.empty()) return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, 10);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (v < lo || v > hi) return std::nullopt;
  return v;
}

// Like try_parse_int, but a moe::Error "<what>: "<text>" is not an integer in [lo, hi]".
template <class T>
T parse_int(std::string_view text, const std::string& what, T lo = std::numeric_limits<T>::min(),
            T hi = std::numeric_limits<T>::max()) {
  std::optional<T> v = try_parse_int<T>(text, lo, hi);
  // +0 so that int8_t / uint8_t bounds print as numbers, not characters.
  MOE_CHECK(v.has_value(), what, ": \"", std::string(text.substr(0, 64)),
            text.size() > 64 ? "..." : "", "\" is not an integer in [", +lo, ", ", +hi, "]");
  return *v;
}

}  // namespace moe::io
