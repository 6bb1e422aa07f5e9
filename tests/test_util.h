// Small helpers shared by the GoogleTest suites.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/rng.h"
#include "test_inputs.h"

namespace moe::test_util {

// The message of the moe::Error that f throws; "" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- errors ----
// max |a - ref| / max |ref|: a scale-aware error for whole tensors.
inline double max_rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

// Scratch files and folders of a test process, removed when the process exits (set
// MOETRAIN_KEEP_TEST_FILES=1 to keep them for a look).
class ScratchRegistry {
 public:
  static ScratchRegistry& get() {
    static ScratchRegistry r;
    return r;
  }
  void add(const std::filesystem::path& p) {
    const std::lock_guard<std::mutex> lock(mu_);
    paths_.push_back(p);
  }
  ~ScratchRegistry() {
    if (std::getenv("MOETRAIN_KEEP_TEST_FILES")) return;
    std::error_code ec;
    for (const auto& p : paths_) std::filesystem::remove_all(p, ec);
  }

 private:
  std::mutex mu_;
  std::vector<std::filesystem::path> paths_;
};

// <gtest temp dir>/moe_<prefix>_<pid>_<name>, removed at exit. Nothing is created.
inline std::filesystem::path scratch_path(const std::string& prefix, const std::string& name) {
  std::filesystem::path p = std::filesystem::path(::testing::TempDir()) /
                            ("moe_" + prefix + "_" + std::to_string(::getpid()) + "_" + name);
  ScratchRegistry::get().add(p);
  return p;
}

// A fresh, empty folder (scratch_path's), removed at exit.
inline std::string fresh_scratch_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path p = scratch_path(prefix, name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace moe::test_util
