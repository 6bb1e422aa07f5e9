// RMSNorm: out = x / sqrt(mean(x²) + eps) · w, per row. rstd [n_rows] is saved for backward.
#pragma once

namespace moe::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps);
// dx += ..., dw += ... (see gemm.h for the += convention). dw may be nullptr.
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim);
}  // namespace cuda

}  // namespace moe::kernels
