// Small helpers shared by the GoogleTest suites.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

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
