// Row-major GEMM on cuBLAS (column-major): C = op(A)·op(B) row-major is C^T = op(B)^T·op(A)^T
// column-major, so the operands swap and each row stride becomes a leading dimension. fp32 inputs
// run in fp32 (no TF32, see context.cu); with kernels::gemm_bf16() the inputs are rounded to bf16
// in a cached workspace and accumulated and written in fp32. See gemm.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "kernels/cuda/reduce.cuh"
#include "kernels/device_select.h"
#include "kernels/gemm.h"

namespace moe::kernels::cuda {
namespace {

// dst[r, c] = bf16(src[r·ld + c]) for r < rows, c < cols; dst is dense (row stride cols).
__global__ void to_bf16_kernel(__nv_bfloat16* dst, const float* src, size_t rows, size_t cols,
                               size_t ld) {
  const size_t n = rows * cols;
  MOE_GRID_STRIDE(i, n) {
    const size_t r = i / cols, c = i - r * cols;
    dst[i] = __float2bfloat16_rn(src[r * ld + c]);
  }
}

// C = beta·C (0 when beta == 0, as the CPU does for K == 0), row stride ldc.
__global__ void scale_kernel(float* C, size_t M, size_t N, size_t ldc, float beta) {
  const size_t n = M * N;
  MOE_GRID_STRIDE(i, n) {
    const size_t r = i / N, c = i - r * N;
    float* p = C + r * ldc + c;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

__global__ void fill_pattern_kernel(float* x, size_t n, unsigned mul) {
  MOE_GRID_STRIDE(i, n)
    x[i] = static_cast<float>((i * mul) % 1000) * 1e-3f - 0.5f;
}


// Rounds the stored [rows, cols] (row stride ld) operand to dense bf16 at dst.
void convert(__nv_bfloat16* dst, const float* src, int rows, int cols, int ld) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  MOE_LAUNCH(to_bf16_kernel, elem_blocks(n), kThreads, 0, stream())(dst, src, rows, cols, ld);
  MOE_CUDA_LAUNCHED("to_bf16");
}

// The column-major call for row-major operands (lda/ldb/ldc already resolved).
void gemm_ex(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const void* A, int lda,
             const void* B, int ldb, cudaDataType_t type, float beta, float* C, int ldc) {
  MOE_CUBLAS_CHECK(cublasGemmEx(blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, type, ldb,
                                A, type, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  MOE_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return;
  // Stored shapes: A is [M,K] (or [K,M] transposed), B is [K,N] (or [N,K]).
  const int a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  if (lda == 0) lda = a_cols;
  if (ldb == 0) ldb = b_cols;
  if (ldc == 0) ldc = N;
  MOE_CHECK(lda >= a_cols && ldb >= b_cols && ldc >= N, "gemm: row strides lda=", lda, " ldb=", ldb,
            " ldc=", ldc, " are below the row lengths ", a_cols, ", ", b_cols, ", ", N);
  if (K == 0) {  // cuBLAS is not asked for K == 0; scale C as the CPU does
    MOE_LAUNCH(scale_kernel, elem_blocks(static_cast<size_t>(M) * N), kThreads, 0, stream())(C, M, N, ldc,
                                                                                             beta);
    MOE_CUDA_LAUNCHED("gemm scale");
    return;
  }
  if (!gemm_bf16()) {
    gemm_ex(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, CUDA_R_32F, beta, C, ldc);
    return;
  }
  const size_t a_n = static_cast<size_t>(a_rows) * a_cols;
  const size_t b_n = static_cast<size_t>(b_rows) * b_cols;
  const size_t a_bytes = align256(a_n * sizeof(__nv_bfloat16));
  char* ws = static_cast<char*>(workspace(Workspace::kGemmBf16).get(a_bytes + b_n * sizeof(__nv_bfloat16)));
  auto* a16 = reinterpret_cast<__nv_bfloat16*>(ws);
  auto* b16 = reinterpret_cast<__nv_bfloat16*>(ws + a_bytes);
  convert(a16, A, a_rows, a_cols, lda);
  convert(b16, B, b_rows, b_cols, ldb);
  gemm_ex(trans_a, trans_b, M, N, K, alpha, a16, a_cols, b16, b_cols, CUDA_R_16BF, beta, C, ldc);
}

void gemm_grouped(const GemmProblem* problems, int count) {
  // Per-problem calls where the grouped call does not fit (bf16 inputs: see gemm.h), for K == 0
  // (cuBLAS is not asked) and for the empty ones.
  std::vector<const GemmProblem*> grouped;
  for (int i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    MOE_CHECK(p.M >= 0 && p.N >= 0 && p.K >= 0, "gemm_grouped: problem ", i, " has M=", p.M,
              " N=", p.N, " K=", p.K);
    if (p.M == 0 || p.N == 0) continue;
    if (gemm_bf16() || p.K == 0) {
      gemm(p.trans_a, p.trans_b, p.M, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb, p.beta, p.C, p.ldc);
      continue;
    }
    grouped.push_back(&p);
  }
  if (grouped.empty()) return;
  // Column-major view of each row-major product (as gemm_ex): C^T = op(B)^T · op(A)^T, one group
  // of one problem per product. The arrays are read on the host by this cuBLAS.
  const size_t n = grouped.size();
  std::vector<cublasOperation_t> ta(n), tb(n);
  std::vector<int> m(n), nn(n), k(n), lda(n), ldb(n), ldc(n), size(n, 1);
  std::vector<float> alpha(n, 1.0f), beta(n);
  std::vector<const void*> a(n), b(n);
  std::vector<void*> c(n);
  for (size_t i = 0; i < n; ++i) {
    const GemmProblem& p = *grouped[i];
    const int a_cols = p.trans_a ? p.M : p.K, b_cols = p.trans_b ? p.K : p.N;
    const int la = p.lda ? p.lda : a_cols, lb = p.ldb ? p.ldb : b_cols, lc = p.ldc ? p.ldc : p.N;
    MOE_CHECK(la >= a_cols && lb >= b_cols && lc >= p.N, "gemm_grouped: row strides lda=", la,
              " ldb=", lb, " ldc=", lc, " are below the row lengths ", a_cols, ", ", b_cols, ", ", p.N);
    ta[i] = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    tb[i] = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = p.N;
    nn[i] = p.M;
    k[i] = p.K;
    a[i] = p.B;
    lda[i] = lb;
    b[i] = p.A;
    ldb[i] = la;
    c[i] = p.C;
    ldc[i] = lc;
    beta[i] = p.beta;
  }
  // The operand pointers go to the device (cuBLAS reads them there); the copy takes the host
  // array at the call, and the product after it on the stream reads it.
  const size_t ptr_bytes = align256(n * sizeof(void*));
  char* ptrs = static_cast<char*>(workspace(Workspace::kGemmGroupedPtrs).get(3 * ptr_bytes));
  std::vector<const void*> all(3 * ptr_bytes / sizeof(void*), nullptr);
  for (size_t i = 0; i < n; ++i) {
    all[i] = a[i];
    all[ptr_bytes / sizeof(void*) + i] = b[i];
    all[2 * ptr_bytes / sizeof(void*) + i] = c[i];
  }
  MOE_CUDA_CHECK(cudaMemcpyAsync(ptrs, all.data(), 3 * ptr_bytes, cudaMemcpyHostToDevice, stream()));
  MOE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      blas(), ta.data(), tb.data(), m.data(), nn.data(), k.data(), alpha.data(),
      reinterpret_cast<const void* const*>(ptrs), CUDA_R_32F, lda.data(),
      reinterpret_cast<const void* const*>(ptrs + ptr_bytes), CUDA_R_32F, ldb.data(), beta.data(),
      reinterpret_cast<void* const*>(ptrs + 2 * ptr_bytes), CUDA_R_32F, ldc.data(),
      static_cast<int>(n), size.data(), CUBLAS_COMPUTE_32F));
}

double measure_gemm_gflops(int n, int repeats, bool bf16) {
  MOE_CHECK(n > 0 && repeats > 0, "measure_gemm_gflops: n=", n, " repeats=", repeats);
#ifndef __CUDACC__
  // Under the SIMT shim the "GPU" is this CPU: a 4096^3 product would take seconds and tell no more.
  n = std::min(n, 512);
#endif
  const size_t nn = static_cast<size_t>(n) * n;
  Buffer<float> a(nn, nullptr, Device::kCuda), b(nn, nullptr, Device::kCuda),
      c(nn, nullptr, Device::kCuda);
  MOE_LAUNCH(fill_pattern_kernel, elem_blocks(nn), kThreads, 0, stream())(a.data(), nn, 7919u);
  MOE_CUDA_LAUNCHED("fill");
  MOE_LAUNCH(fill_pattern_kernel, elem_blocks(nn), kThreads, 0, stream())(b.data(), nn, 104729u);
  MOE_CUDA_LAUNCHED("fill");
  Buffer<__nv_bfloat16> a16, b16;
  const void* pa = a.data();
  const void* pb = b.data();
  if (bf16) {
    a16.resize(nn, nullptr, Device::kCuda);
    b16.resize(nn, nullptr, Device::kCuda);
    convert(a16.data(), a.data(), n, n, n);
    convert(b16.data(), b.data(), n, n, n);
    pa = a16.data();
    pb = b16.data();
  }
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cudaEvent_t start, stop;
  MOE_CUDA_CHECK(cudaEventCreate(&start));
  MOE_CUDA_CHECK(cudaEventCreate(&stop));
  float best_ms = 1e30f;
  try {
    gemm_ex(false, false, n, n, n, 1.0f, pa, n, pb, n, type, 0.0f, c.data(), n);  // warm up
    for (int r = 0; r < repeats; ++r) {
      MOE_CUDA_CHECK(cudaEventRecord(start, stream()));
      gemm_ex(false, false, n, n, n, 1.0f, pa, n, pb, n, type, 0.0f, c.data(), n);
      MOE_CUDA_CHECK(cudaEventRecord(stop, stream()));
      MOE_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      MOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      best_ms = std::min(best_ms, ms);
    }
  } catch (...) {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
    throw;
  }
  MOE_CUDA_CHECK(cudaEventDestroy(start));
  MOE_CUDA_CHECK(cudaEventDestroy(stop));
  return 2.0 * n * static_cast<double>(n) * n / (best_ms * 1e-3) * 1e-9;
}

}  // namespace moe::kernels::cuda
