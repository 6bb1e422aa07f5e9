// SwiGLU, embedding lookup, residual add, copy and zero fill on the GPU. The embedding gradient
// sorts the token positions by token id (stable radix sort, so positions stay ascending within a
// token), then one block per distinct token adds its rows in that order: each dwte element is
// summed in the CPU's order, without atomics. See elementwise.h.
#include "kernels/cuda/radix_sort.cuh"

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

__global__ void swiglu_backward_inplace_kernel(float* dg, float* du, const float* g, const float* u,
                                               size_t n) {
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

__global__ void iota_kernel(int32_t* x, int n) {
  MOE_GRID_STRIDE(i, static_cast<size_t>(n)) x[i] = static_cast<int32_t>(i);
}

// Block i owns the run of equal tokens starting at sorted position i (other blocks exit) and adds
// its rows, positions ascending, into dwte[token].
__global__ void embedding_backward_kernel(float* dwte, const float* dout,
                                          const uint32_t* tok_sorted, const int32_t* pos_sorted,
                                          int n_tokens, int dim) {
  for (int i = blockIdx.x; i < n_tokens; i += gridDim.x) {
    const uint32_t v = tok_sorted[i];
    if (i > 0 && tok_sorted[i - 1] == v) continue;
    int end = i + 1;
    while (end < n_tokens && tok_sorted[end] == v) ++end;
    float* d = dwte + static_cast<size_t>(static_cast<int32_t>(v)) * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
      float acc = d[j];
      for (int m = i; m < end; ++m) acc += dout[static_cast<size_t>(pos_sorted[m]) * dim + j];
      d[j] = acc;
    }
  }
}

__global__ void add_kernel(float* y, const float* x, size_t n) {
  MOE_GRID_STRIDE(i, n) y[i] += x[i];
}


}  // namespace

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  if (n == 0) return;
  MOE_LAUNCH(swiglu_forward_kernel, elem_blocks(n), kThreads, 0, stream())(h, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_forward");
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  if (n == 0) return;
  MOE_LAUNCH(swiglu_backward_kernel, elem_blocks(n), kThreads, 0, stream())(dg, du, dh, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_backward");
}

void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n) {
  if (n == 0) return;
  MOE_LAUNCH(swiglu_backward_inplace_kernel, elem_blocks(n), kThreads, 0, stream())(dg, du, g, u, n);
  MOE_CUDA_LAUNCHED("swiglu_backward_inplace");
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_forward: n_tokens=", n_tokens, " dim=", dim);
  const size_t n = static_cast<size_t>(n_tokens) * dim;
  if (n == 0) return;
  MOE_LAUNCH(embedding_forward_kernel, elem_blocks(n), kThreads, 0, stream())(out, tokens, wte, n_tokens,
                                                                              dim);
  MOE_CUDA_LAUNCHED("embedding_forward");
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_backward: n_tokens=", n_tokens, " dim=", dim);
  if (n_tokens == 0 || dim == 0) return;
  // Token ids as unsigned keys (all 32 bits: the vocabulary size is not known here).
  const uint32_t* keys_in = reinterpret_cast<const uint32_t*>(tokens);
  size_t temp_bytes = 0;
  MOE_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, static_cast<uint32_t*>(nullptr),
                                      static_cast<const int32_t*>(nullptr),
                                      static_cast<int32_t*>(nullptr), n_tokens, 0, 32, stream()));
  const size_t n_bytes = align256(sizeof(int32_t) * static_cast<size_t>(n_tokens));
  char* ws = static_cast<char*>(workspace(Workspace::kEmbedding).get(3 * n_bytes + temp_bytes));
  auto* tok_sorted = reinterpret_cast<uint32_t*>(ws);
  auto* pos = reinterpret_cast<int32_t*>(ws + n_bytes);
  auto* pos_sorted = reinterpret_cast<int32_t*>(ws + 2 * n_bytes);
  MOE_LAUNCH(iota_kernel, elem_blocks(n_tokens), kThreads, 0, stream())(pos, n_tokens);
  MOE_CUDA_LAUNCHED("embedding_backward iota");
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + 3 * n_bytes, temp_bytes, keys_in, tok_sorted,
                                                 pos, pos_sorted, n_tokens, 0, 32, stream()));
  MOE_LAUNCH(embedding_backward_kernel, row_blocks(n_tokens), row_threads(dim), 0, stream())(
      dwte, dout, tok_sorted, pos_sorted, n_tokens, dim);
  MOE_CUDA_LAUNCHED("embedding_backward");
}

void add_inplace(float* y, const float* x, size_t n) {
  if (n == 0) return;
  MOE_LAUNCH(add_kernel, elem_blocks(n), kThreads, 0, stream())(y, x, n);
  MOE_CUDA_LAUNCHED("add_inplace");
}

void copy(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  MOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

void fill_zero(float* x, size_t n) {
  if (n == 0) return;
  MOE_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream()));
}

}  // namespace moe::kernels::cuda
