// SwiGLU, embedding lookup, residual add, copy and zero fill on the GPU. The embedding gradient
// runs one thread per column looping tokens in order, so each dwte element is summed in the same
// order as on the CPU, without atomics. See elementwise.h.
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/elementwise.h"

namespace moe::kernels::cuda {
namespace {

__global__ void swiglu_forward_kernel(float* h, const float* g, const float* u, size_t n) {
  MOE_GRID_STRIDE(i, n) h[i] = math::swiglu(g[i], u[i]);
}

__global__ void swiglu_backward_kernel(float* dg, float* du, const float* dh, const float* g,
                                       const float* u, size_t n) {
  MOE_GRID_STRIDE(i, n) {
    float a = dg[i], b = du[i];
    math::swiglu_backward(a, b, dh[i], g[i], u[i]);
    dg[i] = a;
    du[i] = b;
  }
}

__global__ void swiglu_backward_inplace_kernel(float* dg, float* du, const float* g,
                                               const float* u, size_t n) {
  MOE_GRID_STRIDE(i, n) {
    float a = 0.0f, b = 0.0f;
    math::swiglu_backward(a, b, dg[i], g[i], u[i]);
    dg[i] = a;
    du[i] = b;
  }
}

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         size_t n_tokens, size_t dim) {
  MOE_GRID_STRIDE(i, n_tokens * dim) {
    const size_t n = i / dim, j = i - n * dim;
    out[i] = wte[static_cast<size_t>(tokens[n]) * dim + j];
  }
}

// One thread per column j; tokens in order (the CPU's order for every dwte[v, j]).
__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int32_t* tokens,
                                          int n_tokens, int dim) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  for (int n = 0; n < n_tokens; ++n)
    dwte[static_cast<size_t>(tokens[n]) * dim + j] += dout[static_cast<size_t>(n) * dim + j];
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
  MOE_GRID_STRIDE(i, n) y[i] += x[i];
}

}  // namespace

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  if (n == 0) return;
  swiglu_forward_kernel<<<elem_blocks(n), kThreads, 0, stream()>>>(h, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_forward");
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  if (n == 0) return;
  swiglu_backward_kernel<<<elem_blocks(n), kThreads, 0, stream()>>>(dg, du, dh, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_backward");
}

void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n) {
  if (n == 0) return;
  swiglu_backward_inplace_kernel<<<elem_blocks(n), kThreads, 0, stream()>>>(dg, du, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_backward_inplace");
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_forward: n_tokens=", n_tokens, " dim=", dim);
  const size_t n = static_cast<size_t>(n_tokens) * dim;
  if (n == 0) return;
  embedding_forward_kernel<<<elem_blocks(n), kThreads, 0, stream()>>>(out, tokens, wte, n_tokens,
                                                                      dim);
  MOE_CUDA_LAUNCHED("embedding_forward");
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_backward: n_tokens=", n_tokens, " dim=", dim);
  if (n_tokens == 0 || dim == 0) return;
  embedding_backward_kernel<<<blocks_for(dim), kThreads, 0, stream()>>>(dwte, dout, tokens,
                                                                        n_tokens, dim);
  MOE_CUDA_LAUNCHED("embedding_backward");
}

void add_inplace(float* y, const float* x, size_t n) {
  if (n == 0) return;
  add_kernel<<<elem_blocks(n), kThreads, 0, stream()>>>(y, x, n);
  MOE_CUDA_LAUNCHED("add_inplace");
}

void copy(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

void fill_zero(float* x, size_t n) {
  if (n == 0) return;
  MOE_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream()));
}

}  // namespace moe::kernels::cuda
