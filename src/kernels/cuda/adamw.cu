// AdamW and the gradient sum of squares on the GPU. The update's scalars come from the same
// adamw_scalars as the CPU's, the element update is math::adamw_element. The sum of squares is
// deterministic: a grid that depends only on n, per-block double partials in a fixed tree order,
// and the partials added on the host in block order. See adamw.h.
#include <vector>

#include "kernels/adamw.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"

namespace moe::kernels::cuda {
namespace {

constexpr unsigned kMaxSumBlocks = 1024;

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n,
                             math::AdamWScalars s, float grad_scale) {
  MOE_GRID_STRIDE(i, n) {
    float pi = p[i], mi = m[i], vi = v[i];
    math::adamw_element(pi, g[i], mi, vi, s, grad_scale);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void sum_squares_kernel(double* partial, const float* x, size_t n) {
  __shared__ double sh[kThreads];
  double s = 0.0;
  MOE_GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * x[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}


}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale) {
  const math::AdamWScalars s = adamw_scalars(hp, step);  // checks step
  if (n == 0) return;
  MOE_LAUNCH(adamw_kernel, elem_blocks(n), kThreads, 0, stream())(p, g, m, v, n, s, grad_scale);
  MOE_CUDA_LAUNCHED("adamw_update");
}

double sum_squares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  unsigned blocks = blocks_for(n);
  if (blocks > kMaxSumBlocks) blocks = kMaxSumBlocks;
  double* partial = workspace(Workspace::kAdamwPartial).as<double>(blocks);
  MOE_LAUNCH(sum_squares_kernel, blocks, kThreads, 0, stream())(partial, x, n);
  MOE_CUDA_LAUNCHED("sum_squares");
  std::vector<double> host(blocks);
  MOE_CUDA_CHECK(cudaMemcpyAsync(host.data(), partial, sizeof(double) * blocks,
                                 cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  double total = 0.0;
  for (double b : host) total += b;
  return total;
}

}  // namespace moe::kernels::cuda
