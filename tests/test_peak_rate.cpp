// Tests of the MFU peak (kernels/peak_rate.h): the best of several runs is the fastest run, every
// size is measured, and a precision without a measurement is refused with its name.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/peak_rate.h"

namespace {

using moe::kernels::best_gemm_gflops;
using moe::kernels::measure_peak_gflops;

TEST(PeakRate, BestOfRunsIsTheFastestRunAtEverySize) {
  // A "product" that is slow (a busy moment) on all but one timed call per size: the peak must
  // come from the fast call of the size with the best rate, not from an average or the first run.
  std::map<int, int> calls;
  auto product = [&](int n) {
    const int c = calls[n]++;
    const bool fast = c == 2;  // call 0 is the untimed one
    std::this_thread::sleep_for(std::chrono::milliseconds(fast ? 2 : 30));
  };
  const double best = best_gemm_gflops(product, {100, 200}, 4, moe::now_seconds);
  EXPECT_EQ(calls[100], 5);
  EXPECT_EQ(calls[200], 5);
  const double fastest = 2.0 * 200 * 200 * 200 / 2e-3 * 1e-9;  // 200³ in 2 ms: 8 GFLOP/s
  EXPECT_LE(best, fastest * 1.0001);
  // A sleep overshoots on a loaded machine, but a 30 ms call (15x slower) must not be the best.
  EXPECT_GT(best, fastest / 5);
}

TEST(PeakRate, FastProductsRunUntilTheMinimumTime) {
  // 1 ms products with a 30 ms minimum: more calls than runs_per_size, until the time is spent;
  // with no minimum, exactly runs_per_size; never more than kMaxPeakRuns.
  int calls = 0;
  auto product = [&](int) {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  best_gemm_gflops(product, {64}, 3, moe::now_seconds, 0.030);
  EXPECT_GE(calls - 1, 10);  // call 0 is untimed; a sleep may overshoot, so 10 is safe
  EXPECT_LE(calls - 1, moe::kernels::kMaxPeakRuns);
  calls = 0;
  best_gemm_gflops(product, {64}, 3, moe::now_seconds);
  EXPECT_EQ(calls, 4);
  calls = 0;
  best_gemm_gflops([&](int) { ++calls; }, {64}, 3, moe::now_seconds, 1e9);  // instant calls: the cap
  EXPECT_EQ(calls - 1, moe::kernels::kMaxPeakRuns);
  EXPECT_THROW(best_gemm_gflops(product, {64}, 0, moe::now_seconds), moe::Error);
}

TEST(PeakRate, Fp32MeasuresAndOtherPrecisionsAreRefused) {
  EXPECT_GT(measure_peak_gflops(moe::Precision::kFp32, {64, 96}, 2), 0.0);
  try {
    moe::parse_precision("fp8", "--precision");  // the only way to name a precision
    FAIL() << "fp8 was accepted";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp8'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(best_gemm_gflops([](int) {}, {}, 3, moe::now_seconds), moe::Error);
}

TEST(PeakRate, ThreadCpuTimeDoesNotCountWaiting) {
  // A preempted (here: sleeping) thread is not charged for the wait: what keeps the peak steady
  // on a shared machine.
  const double t0 = moe::kernels::thread_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double slept = moe::kernels::thread_cpu_seconds() - t0;
  EXPECT_GE(slept, 0.0);
  EXPECT_LT(slept, 0.025);
}

}  // namespace
