// Shared by the CUDA kernels: error checks that throw moe::Error naming the call, the process's
// stream and cuBLAS handle, and launch-size helpers. Only .cu files include this.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/context.h"

#define MOE_CUDA_CHECK(call)                                                              \
  do {                                                                                    \
    cudaError_t moe_err_ = (call);                                                        \
    if (moe_err_ != cudaSuccess)                                                          \
      throw ::moe::Error(::moe::str_cat(#call, ": ", cudaGetErrorString(moe_err_)));      \
  } while (0)

#define MOE_CUBLAS_CHECK(call)                                                            \
  do {                                                                                    \
    cublasStatus_t moe_st_ = (call);                                                      \
    if (moe_st_ != CUBLAS_STATUS_SUCCESS)                                                 \
      throw ::moe::Error(::moe::str_cat(#call, ": cuBLAS status ", static_cast<int>(moe_st_))); \
  } while (0)

// Checks the launch just queued (configuration errors surface here, execution errors at the
// next synchronising call).
#define MOE_CUDA_LAUNCHED(name) MOE_CUDA_CHECK(cudaGetLastError())

namespace moe::kernels::cuda {

cudaStream_t stream();
cublasHandle_t blas();

constexpr int kThreads = 256;
inline unsigned blocks_for(size_t n, int threads = kThreads) {
  size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647u ? 2147483647u : b));
}

}  // namespace moe::kernels::cuda
