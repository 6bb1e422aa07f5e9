// Shared by the CUDA kernels: error checks that throw moe::Error naming the call, the process's
// stream and cuBLAS handle, the launch macros, and launch-size helpers. Only .cu files include
// this. Under nvcc they are CUDA; under a host compiler (-DMOETRAIN_EMULATE_CUDA=ON) the same
// source runs on the CPU through the SIMT shim (kernels/simt/simt_cpu.h).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string_view>
#ifndef __CUDACC__
#include "kernels/simt/simt_cpu.h"
namespace moe::simt {
const std::string& cublas_detail();  // why the fake cuBLAS refused the last call
}
#endif

#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/context.h"

#define MOE_CUDA_CHECK(call)                                                         \
  do {                                                                               \
    cudaError_t moe_err_ = (call);                                                   \
    if (moe_err_ != cudaSuccess)                                                     \
      throw ::moe::Error(::moe::str_cat(#call, ": ", cudaGetErrorString(moe_err_))); \
  } while (0)

// One line naming the cuBLAS function (the text of the call up to its '('), its status, and under
// the SIMT shim the fake library's reason.
#ifdef __CUDACC__
#define MOE_CUBLAS_DETAIL() ""
#else
#define MOE_CUBLAS_DETAIL() ::moe::simt::cublas_detail()
#endif
#define MOE_CUBLAS_CHECK(call)                                                          \
  do {                                                                                  \
    cublasStatus_t moe_st_ = (call);                                                    \
    if (moe_st_ != CUBLAS_STATUS_SUCCESS) {                                             \
      const std::string_view moe_call_(#call);                                          \
      throw ::moe::Error(::moe::str_cat(moe_call_.substr(0, moe_call_.find('(')), ": ", \
                                        cublasGetStatusName(moe_st_), " (",             \
                                        std::string_view(MOE_CUBLAS_DETAIL()), ")"));   \
    }                                                                                   \
  } while (0)

// Checks the launch just queued (configuration errors surface here, execution errors at the
// next synchronising call), naming the launch.
#define MOE_CUDA_LAUNCHED(name)                                                                    \
  do {                                                                                             \
    cudaError_t moe_err_ = cudaGetLastError();                                                     \
    if (moe_err_ != cudaSuccess)                                                                   \
      throw ::moe::Error(::moe::str_cat(name, ": launch failed: ", cudaGetErrorString(moe_err_))); \
  } while (0)

// kernel<<<grid, block, smem, stream>>>(args...) as MOE_LAUNCH(kernel, grid, block, smem,
// stream)(args...), which the host compiler builds too. Dynamic shared memory likewise.
#ifdef __CUDACC__
#define MOE_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#define MOE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#else
#define MOE_LAUNCH(kernel, grid, block, smem, stream) \
  ::moe::simt::make_launch(#kernel, kernel, (grid), (block), (smem), (stream))
#define MOE_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::moe::simt::g_dynamic_shared)
#endif

namespace moe::kernels::cuda {

cudaStream_t stream();
cublasHandle_t blas();

constexpr int kThreads = 256;
inline unsigned blocks_for(size_t n, int threads = kThreads) {
  size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 2147483647u ? 2147483647u : b));
}

}  // namespace moe::kernels::cuda
