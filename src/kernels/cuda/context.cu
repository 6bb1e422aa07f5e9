// The process's CUDA stream and cuBLAS handle. See context.h.
#include "kernels/cuda/common.cuh"

namespace moe::kernels::cuda {
namespace {
cudaStream_t g_stream = nullptr;
cublasHandle_t g_blas = nullptr;
}  // namespace

void init_context() {
  if (g_blas) return;
  // The legacy default stream: core/device's cudaMemcpy / cudaMemset are ordered with every
  // kernel and GEMM without events (v1; overlap with communication needs streams and events).
  g_stream = nullptr;
  MOE_CUBLAS_CHECK(cublasCreate(&g_blas));
  MOE_CUBLAS_CHECK(cublasSetStream(g_blas, g_stream));
  // fp32 GEMMs stay fp32 (no TF32), so the CUDA backend matches the CPU to fp32 round-off.
  MOE_CUBLAS_CHECK(cublasSetMathMode(g_blas, CUBLAS_DEFAULT_MATH));
}

cudaStream_t stream() {
  init_context();
  return g_stream;
}

cublasHandle_t blas() {
  init_context();
  return g_blas;
}

void synchronize(const char* where) {
  cudaError_t e = cudaStreamSynchronize(stream());
  if (e != cudaSuccess) throw Error(str_cat(where, ": CUDA error: ", cudaGetErrorString(e)));
}

}  // namespace moe::kernels::cuda
