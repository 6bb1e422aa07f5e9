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

// ---- inputs ----
// n normal samples times scale, drawn from rng.
inline std::vector<float> randn(Rng& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}
// The same from a fresh stream `stream` of seed (core/rng.h's derive_rng): suites that build
// each tensor from its own seed.
inline std::vector<float> randn(size_t n, uint64_t seed, uint64_t stream, double scale) {
  Rng rng = derive_rng(seed, stream);
  return randn(rng, n, scale);
}
// n samples uniform in [lo, hi).
inline std::vector<float> uniform(Rng& rng, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * rng.uniform());
  return v;
}
// A host Buffer's elements as a vector.
template <class T>
std::vector<T> to_vec(const Buffer<T>& b) {
  return std::vector<T>(b.data(), b.data() + b.size());
}

// ---- errors ----
// ||a - ref||_2 / ||ref||_2 (relative L2; the square root of the normalised MSE).
inline double norm_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1e-30));
}
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
