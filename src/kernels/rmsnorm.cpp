// RMSNorm forward/backward. See rmsnorm.h. Row sums are accumulated in double, in index order,
// so results are deterministic and independent of the vector width.
#include "kernels/rmsnorm.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/device_select.h"

namespace moe::kernels {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps) {
  MOE_CUDA_DISPATCH(rmsnorm_forward, out, rstd, x, w, n_rows, dim, eps);
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_forward: n_rows=", n_rows, " dim=", dim);
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* o = out + static_cast<size_t>(r) * dim;
    double ss = 0.0;
    for (int j = 0; j < dim; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float rs = math::rmsnorm_rstd(ss, dim, eps);
    rstd[r] = rs;
    for (int j = 0; j < dim; ++j) o[j] = math::rmsnorm_out(xr[j], rs, w[j]);
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim) {
  MOE_CUDA_DISPATCH(rmsnorm_backward, dx, dw, dout, x, w, rstd, n_rows, dim);
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_backward: n_rows=", n_rows, " dim=", dim);
  // out_j = x_j·r·w_j with r = (mean(x²)+eps)^(-1/2), dr/dx_j = -r³·x_j/dim, so
  //   dx_j = r·w_j·dout_j - (r³/dim)·x_j·Σ_i dout_i·w_i·x_i ;  dw_j = Σ_rows dout_j·x_j·r
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    const float* d = dout + static_cast<size_t>(r) * dim;
    float* dxr = dx + static_cast<size_t>(r) * dim;
    float rs = rstd[r];
    double dot = 0.0;
    for (int j = 0; j < dim; ++j) dot += static_cast<double>(d[j]) * w[j] * xr[j];
    const float c = math::rmsnorm_backward_coeff(dot, rs, dim);
    for (int j = 0; j < dim; ++j) dxr[j] += math::rmsnorm_dx(xr[j], d[j], w[j], rs, c);
    if (dw) {
      for (int j = 0; j < dim; ++j) dw[j] += d[j] * xr[j] * rs;
    }
  }
}

}  // namespace moe::kernels
