// RMSNorm on the GPU: one block per row, row sums in double reduced in a fixed tree order.
// dw is summed without atomics: per-chunk partial sums over a fixed split of the rows (the split
// depends only on n_rows), then one thread per column adds the chunks in order. See rmsnorm.h.
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/rmsnorm.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kMaxChunks = 128;  // row chunks of the dw partial sums

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* x, const float* w,
                                       size_t n_rows, int dim, float eps) {
  __shared__ double sh[kThreads];
  MOE_ROW_STRIDE(r, n_rows) {
    const float* xr = x + r * dim;
    double ss = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
    ss = block_sum(ss, sh);
    const float rs = math::rmsnorm_rstd(ss, dim, eps);
    if (threadIdx.x == 0) rstd[r] = rs;
    float* o = out + r * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) o[j] = math::rmsnorm_out(xr[j], rs, w[j]);
  }
}

__global__ void rmsnorm_dx_kernel(float* dx, const float* dout, const float* x, const float* w,
                                  const float* rstd, size_t n_rows, int dim) {
  __shared__ double sh[kThreads];
  MOE_ROW_STRIDE(r, n_rows) {
    const float* xr = x + r * dim;
    const float* d = dout + r * dim;
    double dot = 0.0;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
      dot += static_cast<double>(d[j]) * w[j] * xr[j];
    dot = block_sum(dot, sh);
    const float rs = rstd[r];
    const float c = math::rmsnorm_backward_coeff(dot, rs, dim);
    float* dxr = dx + r * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
      dxr[j] += math::rmsnorm_dx(xr[j], d[j], w[j], rs, c);
  }
}

// partial[chunk, j] = sum over the chunk's rows (ascending) of dout·x·rstd.
__global__ void rmsnorm_dw_partial_kernel(float* partial, const float* dout, const float* x,
                                          const float* rstd, int n_rows, int dim,
                                          int rows_per_chunk) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(n_rows, r0 + rows_per_chunk);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * dim + j;
    acc += dout[i] * x[i] * rstd[r];
  }
  partial[static_cast<size_t>(blockIdx.y) * dim + j] = acc;
}

__global__ void rmsnorm_dw_reduce_kernel(float* dw, const float* partial, int n_chunks, int dim) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= dim) return;
  float acc = dw[j];
  for (int c = 0; c < n_chunks; ++c) acc += partial[static_cast<size_t>(c) * dim + j];
  dw[j] = acc;
}


}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps) {
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_forward: n_rows=", n_rows, " dim=", dim);
  if (n_rows == 0) return;
  MOE_LAUNCH(rmsnorm_forward_kernel, row_blocks(n_rows), kThreads, 0, stream())(out, rstd, x, w, n_rows,
                                                                                dim, eps);
  MOE_CUDA_LAUNCHED("rmsnorm_forward");
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim) {
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_backward: n_rows=", n_rows, " dim=", dim);
  if (n_rows == 0) return;
  MOE_LAUNCH(rmsnorm_dx_kernel, row_blocks(n_rows), kThreads, 0, stream())(dx, dout, x, w, rstd, n_rows,
                                                                           dim);
  MOE_CUDA_LAUNCHED("rmsnorm_backward dx");
  if (!dw) return;
  const int rows_per_chunk = (n_rows + kMaxChunks - 1) / kMaxChunks;
  const int n_chunks = (n_rows + rows_per_chunk - 1) / rows_per_chunk;
  float* partial = workspace(Workspace::kRmsnormPartial).as<float>(static_cast<size_t>(n_chunks) * dim);
  const dim3 grid(blocks_for(dim), n_chunks);
  MOE_LAUNCH(rmsnorm_dw_partial_kernel, grid, kThreads, 0, stream())(partial, dout, x, rstd, n_rows, dim,
                                                                     rows_per_chunk);
  MOE_CUDA_LAUNCHED("rmsnorm_backward dw partial");
  MOE_LAUNCH(rmsnorm_dw_reduce_kernel, blocks_for(dim), kThreads, 0, stream())(dw, partial, n_chunks, dim);
  MOE_CUDA_LAUNCHED("rmsnorm_backward dw");
}

}  // namespace moe::kernels::cuda
