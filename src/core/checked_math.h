// Overflow-checked size arithmetic for sizes that come from user files (configs, headers,
// manifests): a product or sum that would wrap is reported instead of silently becoming small.
//   checked_mul / checked_add: false on overflow (the result is then unspecified)
//   mul_or_throw / add_or_throw: a moe::Error "<what> overflows (a * b)" instead
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace moe {

template <class T>
[[nodiscard]] bool checked_mul(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return !__builtin_mul_overflow(a, b, out);
}

template <class T>
[[nodiscard]] bool checked_add(T a, T b, T* out) {
  static_assert(std::is_integral_v<T>);
  return !__builtin_add_overflow(a, b, out);
}

// a * b, or a moe::Error naming `what` (e.g. "config.json: vocab_size * hidden_size").
template <class T>
T mul_or_throw(T a, T b, const std::string& what) {
  T out{};
  MOE_CHECK(checked_mul(a, b, &out), what, " overflows (", a, " * ", b, ")");
  return out;
}

template <class T>
T add_or_throw(T a, T b, const std::string& what) {
  T out{};
  MOE_CHECK(checked_add(a, b, &out), what, " overflows (", a, " + ", b, ")");
  return out;
}

}  // namespace moe
