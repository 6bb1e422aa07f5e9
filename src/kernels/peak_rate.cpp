// The GEMM peak of a precision: best of several short runs. See peak_rate.h.
#include "kernels/peak_rate.h"

#include <time.h>

#include <algorithm>
#include <cstddef>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"

namespace moe::kernels {

double thread_cpu_seconds() {
  timespec ts{};
  MOE_CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double best_gemm_gflops(const std::function<void(int n)>& product, const std::vector<int>& sizes,
                        int runs_per_size, const std::function<double()>& clock, double min_seconds_per_size) {
  MOE_CHECK(!sizes.empty() && runs_per_size >= 1 && runs_per_size <= kMaxPeakRuns && min_seconds_per_size >= 0,
            "best_gemm_gflops: ", sizes.size(), " sizes, runs_per_size=", runs_per_size,
            " (1..", kMaxPeakRuns, "), min_seconds_per_size=", min_seconds_per_size);
  double best = 0;
  for (int n : sizes) {
    MOE_CHECK(n > 0, "best_gemm_gflops: size ", n, " must be > 0");
    product(n);  // untimed
    const double flops = 2.0 * n * static_cast<double>(n) * n;
    double spent = 0;
    for (int r = 0; r < kMaxPeakRuns && (r < runs_per_size || spent < min_seconds_per_size); ++r) {
      const double t0 = clock();
      product(n);
      const double dt = clock() - t0;
      spent += std::max(dt, 0.0);
      if (dt > 0) best = std::max(best, flops / dt * 1e-9);
    }
  }
  return best;
}

double measure_peak_gflops(Precision precision, const std::vector<int>& sizes,
                           int runs_per_size, double min_seconds_per_size) {
  const bool bf16 = precision == Precision::kBf16;
  MOE_CHECK(!bf16 || bf16_cpu_available(), "measure_peak_gflops: bf16 on the CPU: ",
            bf16_cpu_unavailable_reason());
  const int largest = bf16 ? 0 : *std::max_element(sizes.begin(), sizes.end());
  const size_t cap = static_cast<size_t>(largest) * static_cast<size_t>(largest);
  std::vector<float> a(cap), b(cap), c(cap);
  auto sgemm_fp32 = [&](int n) {
    kernels::sgemm(false, false, n, n, n, 1.0f, a.data(), 0, b.data(), 0, 0.0f, c.data(), 0);
  };
  // Deterministic, well-scaled inputs (values in [-0.5, 0.5)); the timing does not depend on them.
  for (size_t i = 0; i < cap; ++i) {
    a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f;
  }
  // bf16: oneDNN's matmul on inputs already in bf16 (the roofline: no conversion).
  auto sgemm = [&](int n) {
    if (bf16) return bf16_roofline_product(n);
    sgemm_fp32(n);
  };
  if (blas_threads() == 1)
    return best_gemm_gflops(sgemm, sizes, runs_per_size, thread_cpu_seconds, min_seconds_per_size);
  return best_gemm_gflops(sgemm, sizes, runs_per_size, now_seconds, min_seconds_per_size);
}

}  // namespace moe::kernels
