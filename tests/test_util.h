// Small helpers shared by the GoogleTest suites.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace moe::test_util {

// The message of the moe::Error that f throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe::test_util
