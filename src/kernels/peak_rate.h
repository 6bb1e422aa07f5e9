// The GEMM rate that MFU and the benchmarks' "% of sgemm" count against (the trainer's progress
// line and metrics.jsonl, bench moe-layer, the planner's calibrated profile). One timed product
// moves with the machine's load (67..91 GFLOP/s between runs on a shared 2-core machine, and an
// E8 k2 F3584 layer then ran at 125% of it): the peak here is the best of several short runs at
// a few sizes, i.e. what the core reaches when nothing else runs on it. Noise only slows a run
// down, so the best is the stable figure. It is the peak of one precision, named by the caller.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/modes.h"

namespace moe::kernels {

// Seconds of CPU time this thread has used: a run preempted by another process is not charged
// for the time it waited (wall time is, and on a shared machine that is most of the noise).
double thread_cpu_seconds();

// GFLOP/s of the fastest of the timed calls of product(n) (one n×n×n product, 2n³ flops) for each
// n of sizes, after one untimed call per size (page faults, BLAS buffers), timed by `clock`
// (seconds): at least `runs_per_size` calls, and more until they have taken `min_seconds_per_size`
// (at most kMaxPeakRuns calls), so a fast product is sampled over as long a stretch as a slow one.
constexpr int kMaxPeakRuns = 200;
double best_gemm_gflops(const std::function<void(int n)>& product, const std::vector<int>& sizes,
                        int runs_per_size, const std::function<double()>& clock,
                        double min_seconds_per_size = 0);

// The sizes and runs measure_peak_gflops uses: about 0.5 s at 100 GFLOP/s. At least 0.1 s a size:
// AMX's bf16 products (800 GFLOP/s, 2.7 ms at 1024³) took 60 ms in all with 5 runs, and one start
// in a busy moment read 640 against 755-822 idle.
inline const std::vector<int>& peak_sizes() {
  static const std::vector<int> sizes = {1024, 1536};
  return sizes;
}
constexpr int kPeakRunsPerSize = 5;
constexpr double kPeakMinSecondsPerSize = 0.1;

// The CPU peak of `precision` (fp32: sgemm through kernels::gemm, the trainer's kernel; bf16:
// the same call with bf16 inputs through oneDNN, refused where that is unavailable), in
// GFLOP/s, on this thread's BLAS thread count: timed in thread CPU time with one BLAS thread (the
// rate of the core while it runs), in wall time with more (the other threads' work is not this
// thread's).
double measure_peak_gflops(Precision precision = Precision::kFp32,
                           const std::vector<int>& sizes = peak_sizes(),
                           int runs_per_size = kPeakRunsPerSize,
                           double min_seconds_per_size = kPeakMinSecondsPerSize);

}  // namespace moe::kernels
