// Reading and writing config.json fields: errors that name the field, floats written as their
// shortest decimal. Shared by the DeepSeek reader (model/config.cpp) and the other families'
// (model/family.cpp).
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "io/json_file.h"

namespace moe::model {

// Reads j[name] into out when present and not null; a missing required field, a value of the
// wrong type or out of T's range is an error naming the field and `src`.
template <class T>
inline void read_field(const nlohmann::json& j, const char* name, T& out, bool required, const std::string& src) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) {
    MOE_CHECK(!required, src, ": missing field \"", name, "\"");
    return;
  }
  if constexpr (std::is_same_v<T, bool>) {
    MOE_CHECK(it->is_boolean(), src, ": field \"", name, "\" must be true or false, got ", io::excerpt(*it));
  } else if constexpr (std::is_integral_v<T>) {
    // Whole numbers (32 or 32.0) within T's range: casting a double outside it is undefined.
    MOE_CHECK(it->is_number_integer() ||
                  (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>()),
              src, ": field \"", name, "\" must be an integer, got ", io::excerpt(*it));
    MOE_CHECK(it->get<double>() >= static_cast<double>(std::numeric_limits<T>::min()) &&
                  it->get<double>() <= static_cast<double>(std::numeric_limits<T>::max()),
              src, ": field \"", name, "\" = ", io::excerpt(*it), " is out of range [",
              std::numeric_limits<T>::min(), ", ", std::numeric_limits<T>::max(), "]");
  } else if constexpr (std::is_floating_point_v<T>) {
    MOE_CHECK(it->is_number(), src, ": field \"", name, "\" must be a number, got ", io::excerpt(*it));
    // Beyond T's range a double would become inf (and config.json would save it as null).
    MOE_CHECK(std::abs(it->get<double>()) <= static_cast<double>(std::numeric_limits<T>::max()),
              src, ": field \"", name, "\" = ", io::excerpt(*it), " is out of range for a ",
              8 * sizeof(T), "-bit float");
  } else {
    MOE_CHECK(it->is_string(), src, ": field \"", name, "\" must be a string, got ", io::excerpt(*it));
  }
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    out = static_cast<T>(it->get<double>());
  } else {
    out = it->get<T>();
  }
}

// 0.01f as 0.01, not 0.009999999776482582: shortest decimal that reads back as the same float
// (how config.json files are written).
inline double float_json(float f) {
  char buf[32];
  for (int prec = 6; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

// "moetrain_tokenizer_fingerprint" (moetrain's field, every family): checked for its characters
// and length only.
void read_tokenizer_fingerprint(const nlohmann::json& j, const std::string& src, std::string& out);

}  // namespace moe::model
