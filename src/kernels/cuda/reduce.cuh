// Helpers shared by the CUDA leaf kernels: warp and block reductions in a fixed order (so every
// run gives the same bits), launch shapes for row kernels, and a cached device workspace. Only
// .cu files include this.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/buffer.h"
#include "kernels/cuda/common.cuh"
#include "kernels/device_select.h"

// for (size_t i = global thread index; i < n; i += grid size)
#define MOE_GRID_STRIDE(i, n)                                                          \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
// for (size_t r = blockIdx.x; r < rows; r += gridDim.x): one block per row
#define MOE_ROW_STRIDE(r, rows) for (size_t r = blockIdx.x; r < (rows); r += gridDim.x)

namespace moe::kernels::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions: every lane ends with the same value, combined in a fixed pattern.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a power of two <= kThreads): a shared-memory tree in a fixed
// order. Every thread returns the total. `sh` holds blockDim.x elements; the block must reach the
// call together (it synchronises).
template <class T>
__device__ T block_sum(T v, T* sh) {
  const int tid = threadIdx.x;
  sh[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sh[tid] += sh[tid + s];
    __syncthreads();
  }
  const T total = sh[0];
  __syncthreads();  // sh may be reused by the caller right away
  return total;
}
__device__ inline float block_max(float v, float* sh) {
  const int tid = threadIdx.x;
  sh[tid] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sh[tid] = fmaxf(sh[tid], sh[tid + s]);
    __syncthreads();
  }
  const float m = sh[0];
  __syncthreads();
  return m;
}

// Row kernels (one block per row, threads across the H columns, rows grid-strided): a warp
// multiple no larger than kThreads, and at most 2^20 blocks per launch.
inline int row_threads(int H) {
  int t = (H + 31) / 32 * 32;
  return t < 32 ? 32 : (t > kThreads ? kThreads : t);
}
inline unsigned row_blocks(size_t rows) {
  constexpr size_t kMax = size_t{1} << 20;
  return static_cast<unsigned>(rows < 1 ? 1 : (rows > kMax ? kMax : rows));
}
// Element kernels: grid-stride loops over at most 2^16 blocks of kThreads.
inline unsigned elem_blocks(size_t n) {
  unsigned b = blocks_for(n);
  return b > 65536u ? 65536u : b;
}

// A device workspace of an execution context, grown on demand and kept for the next call (the
// stream is the legacy default stream, so consecutive users are ordered), charged to the
// context's scratch tracker. Contents are not kept on growth.
class Scratch {
 public:
  explicit Scratch(MemTracker* tracker = nullptr) : tracker_(tracker) {}
  void* get(size_t bytes) {
    if (bytes > buf_.size()) buf_.resize(bytes, tracker_, Device::kCuda);
    return buf_.data();
  }
  template <class T>
  T* as(size_t n) {
    return static_cast<T*>(get(n * sizeof(T)));
  }

 private:
  MemTracker* tracker_;
  Buffer<unsigned char> buf_;
};

// The current context's workspace `w` (context.h's Workspace).
Scratch& workspace(Workspace w);

// Bytes rounded up to 256 (alignment of the pieces carved out of one Scratch).
inline size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace moe::kernels::cuda
