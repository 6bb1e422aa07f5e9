// The tests' inputs and error measures without GoogleTest, for the binaries that do not link it
// (moetrain_cuda_tests, the op table's benchmarks): random tensors from core/rng.h and the
// relative L2 error. tests/test_util.h includes it for the GoogleTest suites.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/rng.h"

namespace moe::test_util {

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
}  // namespace moe::test_util
