// The CPU bf16 GEMM (kernels/gemm_bf16_cpu.h) against a double-precision loop on bf16-rounded
// inputs, and its weight copy (used while its scope is open, never once the weights changed).
// SKIPPED in a build without oneDNN or on a CPU without AVX-512 BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/adamw.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/peak_rate.h"

namespace moe::kernels {
namespace {

#define SKIP_WITHOUT_BF16() \
  if (!bf16_cpu_available()) GTEST_SKIP() << bf16_cpu_unavailable_reason()

std::vector<float> normal(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

struct Case {
  bool ta, tb;
  int M, N, K, lda, ldb, ldc;  // 0: dense
  float alpha, beta;
};

// Checks C = alpha op(A) op(B) + beta C against a double loop over the bf16-rounded A and B.
// fp32 accumulation of K products: the error is bounded by ~K·2^-24 of sum |a||b|; 1e-5 of it
// (K <= 300 here) is loose for fp32 and 30x tighter than the error of unrounded inputs (2^-9).
void check_case(const Case& c) {
  const int ra = c.ta ? c.K : c.M, ca = c.ta ? c.M : c.K, rb = c.tb ? c.N : c.K, cb = c.tb ? c.K : c.N;
  const int lda = c.lda ? c.lda : ca, ldb = c.ldb ? c.ldb : cb, ldc = c.ldc ? c.ldc : c.N;
  const std::vector<float> A = normal(static_cast<size_t>(ra) * lda + 1, 1), B = normal(static_cast<size_t>(rb) * ldb + 1, 2);
  std::vector<float> C = normal(static_cast<size_t>(std::max(c.M, 1)) * ldc, 3);
  const std::vector<float> C0 = C;
  gemm_bf16_cpu(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.lda, B.data(), c.ldb, c.beta, C.data(), c.ldc);
  auto a = [&](int i, int k) { return double(round_to_bf16(c.ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k])); };
  auto b = [&](int k, int j) { return double(round_to_bf16(c.tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j])); };
  for (int i = 0; i < c.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const size_t at = size_t(i) * ldc + j;
      if (j >= c.N) {  // outside the N columns of a strided C: untouched
        ASSERT_EQ(C[at], C0[at]) << "column " << j << " beyond N=" << c.N << " was written";
        continue;
      }
      double dot = 0, mag = 0;
      for (int k = 0; k < c.K; ++k) {
        dot += a(i, k) * b(k, j);
        mag += std::fabs(a(i, k) * b(k, j));
      }
      const double want = c.alpha * dot + (c.beta == 0 ? 0.0 : c.beta * double(C0[at]));
      const double tol = 1e-5 * (std::fabs(c.alpha) * mag + std::fabs(c.beta * C0[at])) + 1e-30;
      ASSERT_NEAR(C[at], want, tol) << "ta=" << c.ta << " tb=" << c.tb << " M=" << c.M << " N=" << c.N
                                    << " K=" << c.K << " at (" << i << "," << j << ")";
    }
}

TEST(GemmBf16Cpu, MatchesDoubleLoopOnRoundedInputs) {
  SKIP_WITHOUT_BF16();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({ta, tb, 37, 53, 29, 0, 0, 0, 1.0f, 0.0f});
      check_case({ta, tb, 1, 1, 1, 0, 0, 0, 1.0f, 1.0f});
      check_case({ta, tb, 64, 33, 257, 0, 0, 0, 0.5f, 1.0f});
      check_case({ta, tb, 17, 95, 130, 0, 0, 0, 1.0f, -0.75f});
      check_case({ta, tb, 9, 12, 31, 40, 50, 20, 2.0f, 1.0f});  // row strides (attention's heads)
    }
}

TEST(GemmBf16Cpu, EmptySizes) {
  SKIP_WITHOUT_BF16();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_case({ta, tb, 0, 8, 5, 0, 0, 0, 1.0f, 1.0f});  // M = 0: C untouched
      check_case({ta, tb, 6, 0, 5, 0, 0, 0, 1.0f, 1.0f});
      check_case({ta, tb, 6, 7, 0, 0, 0, 0, 1.0f, 0.5f});  // K = 0: C scaled by beta
      check_case({ta, tb, 6, 7, 0, 0, 0, 0, 1.0f, 0.0f});
    }
}

// kernels::gemm is the bf16 GEMM on a bf16 execution context (bit for bit), sgemm stays fp32.
TEST(GemmBf16Cpu, GemmDispatchesByPrecision) {
  SKIP_WITHOUT_BF16();
  const int M = 40, N = 24, K = 70;
  const std::vector<float> A = normal(M * K, 4), B = normal(K * N, 5);
  std::vector<float> want(M * N), got(M * N), fp32(M * N);
  gemm_bf16_cpu(false, true, M, N, K, 1.0f, A.data(), 0, B.data(), 0, 0.0f, want.data(), 0);
  ExecContext bf16_gemms(Device::kCpu, /*gemm_bf16=*/true);
  const ContextScope on(bf16_gemms);
  gemm(false, true, M, N, K, 1.0f, A.data(), 0, B.data(), 0, 0.0f, got.data(), 0);
  sgemm(false, true, M, N, K, 1.0f, A.data(), 0, B.data(), 0, 0.0f, fp32.data(), 0);
  EXPECT_EQ(got, want);
  EXPECT_NE(fp32, want);  // the rounding is real: fp32 inputs give another answer
}

// The weight copy gives the same bits as converting per GEMM; an AdamW update inside the scope
// drops it (the next GEMM sees the new weights), and a closed scope is never read.
TEST(GemmBf16Cpu, WeightCopyIsNeverStale) {
  SKIP_WITHOUT_BF16();
  const int T = 12, in = 48, out = 20;
  const std::vector<float> x = normal(T * in, 6);
  std::vector<float> w = normal(out * in, 7), g = normal(out * in, 8), m(out * in), v(out * in);
  auto forward = [&] {
    std::vector<float> y(T * out);
    linear_forward(y.data(), x.data(), w.data(), T, in, out);
    return y;
  };
  ExecContext bf16_gemms(Device::kCpu, /*gemm_bf16=*/true);
  const ContextScope on(bf16_gemms);
  const std::vector<float> per_gemm = forward();
  std::vector<float> after;
  {
    Bf16WeightScope scope(w.data(), w.size());
    const int64_t reads = bf16_weight_copy_reads();
    EXPECT_EQ(forward(), per_gemm);
    EXPECT_EQ(bf16_weight_copy_reads(), reads + 1) << "the open copy was not read";
    adamw_update(w.data(), g.data(), m.data(), v.data(), w.size(), AdamWParams{0.05f}, 1, 1.0f);
    after = forward();
    EXPECT_EQ(bf16_weight_copy_reads(), reads + 1) << "a copy older than the update was read";
    EXPECT_NE(after, per_gemm);
  }
  const std::vector<float> fresh = forward();  // closed scope: per-GEMM conversion of the new w
  EXPECT_EQ(after, fresh);
  {
    Bf16WeightScope scope(w.data(), w.size());
    EXPECT_EQ(forward(), fresh);  // a new scope copies the updated weights
  }
  for (float& e : w) e *= 2.0f;  // a change the scopes never saw
  const std::vector<float> doubled = forward();
  for (size_t i = 0; i < doubled.size(); ++i) ASSERT_EQ(doubled[i], 2.0f * fresh[i]);
}

// An input scope converts its block once for every GEMM that reads it, with the bits of the
// per-GEMM conversion; sub-blocks read the same copy; writing into a held input is an error; a
// closed scope is never read (the next GEMM converts the changed input itself).
TEST(GemmBf16Cpu, InputScopeConvertsOnceAndIsNeverStale) {
  SKIP_WITHOUT_BF16();
  const int T = 16, in = 40, out = 24;
  std::vector<float> x = normal(T * in, 9);
  const std::vector<float> w = normal(out * in, 10), dy = normal(T * out, 11);
  ExecContext bf16_gemms(Device::kCpu, /*gemm_bf16=*/true);
  const ContextScope on(bf16_gemms);
  auto three = [&] {  // q, k, v of one input; then the weight gradient of the first rows alone
    std::vector<float> y(3 * T * out), dw(out * in);
    for (int i = 0; i < 3; ++i) linear_forward(y.data() + i * T * out, x.data(), w.data(), T, in, out);
    gemm(true, false, out, in, T / 2, 1.0f, dy.data(), 0, x.data(), 0, 0.0f, dw.data(), 0);
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  const std::vector<float> per_gemm = three();
  const int64_t before = bf16_input_conversions();
  {
    const Bf16InputScope once(x.data(), x.size());
    EXPECT_EQ(three(), per_gemm);
    EXPECT_EQ(bf16_input_conversions(), before + 1) << "the input was not converted exactly once";
    EXPECT_THROW(gemm(false, true, T, in, in, 1.0f, x.data(), 0, x.data(), 0, 0.0f, x.data(), 0),
                 std::exception)
        << "a GEMM wrote into an input the scope holds";
    {
      const Bf16InputScope inner(dy.data(), dy.size());  // nested: both copies are read
      EXPECT_EQ(three(), per_gemm);
      EXPECT_EQ(bf16_input_conversions(), before + 2);
    }
  }
  for (float& e : x) e *= 2.0f;  // a change after the scope closed
  const std::vector<float> doubled = three();
  EXPECT_EQ(bf16_input_conversions(), before + 2) << "a closed scope was read";
  for (size_t i = 0; i < doubled.size(); ++i) ASSERT_EQ(doubled[i], 2.0f * per_gemm[i]);
}

TEST(GemmBf16Cpu, RoundToNearestEven) {
  // bf16 keeps 7 mantissa bits: one ulp at 1 is 1/128 = 4/512.
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 512), 1.0f);               // below half an ulp: down
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 512), 1.0f + 4.0f / 512);  // above half: up
  EXPECT_EQ(round_to_bf16(1.0f + 2.0f / 512), 1.0f);               // tie: to even (down)
  EXPECT_EQ(round_to_bf16(1.0f + 6.0f / 512), 1.0f + 8.0f / 512);  // tie: to even (up)
  EXPECT_EQ(round_to_bf16(-1.0f - 3.0f / 512), -1.0f - 4.0f / 512);
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
}

TEST(GemmBf16Cpu, RooflineRate) {
  SKIP_WITHOUT_BF16();
  // The bf16 peak runs oneDNN's product and gives a positive, finite rate. No floor: a loaded
  // machine once measured 0.29 GFLOP/s here (the rates themselves are the benchmarks' business).
  const double rate = measure_peak_gflops(moe::Precision::kBf16, {256}, 2);
  EXPECT_TRUE(std::isfinite(rate) && rate > 0.0) << rate;
}

}  // namespace
}  // namespace moe::kernels
