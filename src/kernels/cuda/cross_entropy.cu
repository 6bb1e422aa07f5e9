// Softmax cross-entropy on the GPU: one block per row, the steps of math::softmax_row (max, exp
// and sum in double, one reciprocal) as block reductions in a fixed order. Each row's loss is kept
// in double and the mean is summed on the host in row order, as on the CPU. See cross_entropy.h.
#include <climits>
#include <vector>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"

namespace moe::kernels::cuda {
namespace {

__global__ void cross_entropy_forward_kernel(float* losses, double* losses_d, int* bad_row,
                                             float* probs, const float* logits,
                                             const int32_t* targets, size_t N, int V) {
  __shared__ float shf[kThreads];
  __shared__ double shd[kThreads];
  MOE_ROW_STRIDE(n, N) {
    const int32_t target = targets[n];
    if (target < 0 || target >= V) {  // block-uniform; reported by the host
      if (threadIdx.x == 0) atomicMin(bad_row, static_cast<int>(n));
      continue;
    }
    const float* x = logits + n * V;
    float* p = probs + n * V;
    const float x_target = x[target];  // read before p (which may alias x) is written
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_max(mx, shf);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      const float e = expf(x[j] - mx);
      p[j] = e;
      sum += e;
    }
    sum = block_sum(sum, shd);
    const float inv = static_cast<float>(1.0 / sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] *= inv;
    if (threadIdx.x == 0) {
      // loss = logsumexp(x) - x[target], as math::softmax_row returns it
      const double loss = log(sum) + static_cast<double>(mx) - static_cast<double>(x_target);
      losses[n] = static_cast<float>(loss);
      losses_d[n] = loss;
    }
  }
}

__global__ void cross_entropy_backward_kernel(float* dlogits, const float* probs,
                                              const int32_t* targets, size_t N, int V,
                                              float scale) {
  MOE_GRID_STRIDE(i, N * V) {
    const size_t n = i / V;
    const int j = static_cast<int>(i - n * V);
    dlogits[i] = math::cross_entropy_grad(dlogits[i], probs[i], j == targets[n], scale);
  }
}


}  // namespace

double cross_entropy_forward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V) {
  MOE_CHECK(N >= 0 && V > 0, "cross_entropy_forward: N=", N, " V=", V);
  if (N == 0) return 0.0;
  char* ws = static_cast<char*>(workspace(Workspace::kCrossEntropyLosses).get(256 + sizeof(double) * N));
  int* bad_row = reinterpret_cast<int*>(ws);
  double* losses_d = reinterpret_cast<double*>(ws + 256);
  const int no_bad_row = INT_MAX;
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(bad_row, &no_bad_row, sizeof(int), cudaMemcpyHostToDevice, stream()));
  MOE_LAUNCH(cross_entropy_forward_kernel, row_blocks(N), kThreads, 0, stream())(
      losses, losses_d, bad_row, probs, logits, targets, N, V);
  MOE_CUDA_LAUNCHED("cross_entropy_forward");
  std::vector<double> loss(N);
  int bad = 0;
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(loss.data(), losses_d, sizeof(double) * N, cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaMemcpyAsync(&bad, bad_row, sizeof(int), cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  if (bad != no_bad_row) {
    int32_t target = 0;
    MOE_CUDA_CHECK(cudaMemcpy(&target, targets + bad, sizeof(int32_t), cudaMemcpyDeviceToHost));
    throw Error(str_cat("cross_entropy_forward: target ", target, " of row ", bad,
                        " is outside the vocabulary [0, ", V, ")"));
  }
  double total = 0.0;
  for (int n = 0; n < N; ++n) total += loss[n];
  return total / N;
}

void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int N,
                            int V, float scale) {
  MOE_CHECK(N >= 0 && V > 0, "cross_entropy_backward: N=", N, " V=", V);
  const size_t n = static_cast<size_t>(N) * V;
  if (n == 0) return;
  MOE_LAUNCH(cross_entropy_backward_kernel, elem_blocks(n), kThreads, 0, stream())(dlogits, probs, targets,
                                                                                   N, V, scale);
  MOE_CUDA_LAUNCHED("cross_entropy_backward");
}

}  // namespace moe::kernels::cuda
