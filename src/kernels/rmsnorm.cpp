// RMSNorm forward/backward. See rmsnorm.h. Row sums are accumulated in double over kLanes
// interleaved accumulators combined in a fixed order (the same on every instruction set: the
// row loops run as MOE_CPU_CLONES, compiled without FMA contraction), so results are
// deterministic and independent of the vector width. One accumulator in index order, as before,
// made each row's sum a chain of dependent double adds.
#include "kernels/rmsnorm.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/cpu_clones.h"
#include "kernels/device_select.h"

namespace moe::kernels {
namespace {

constexpr int kLanes = 16;

// Σ_j term(j) for j < n: lane l sums the j ≡ l (mod kLanes) of the whole groups of kLanes, the
// lanes are folded in halves (l += l + 8, then l += l + 4, ...), then the tail is added in order.
template <class Term>
inline double lane_sum(int n, Term term) {
  double acc[kLanes] = {};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  double s = acc[0];
  for (; j < n; ++j) s += term(j);
  return s;
}

MOE_CPU_CLONES void forward_rows(float* out, float* rstd, const float* x, const float* w, int n_rows,
                                 int dim, float eps) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    float* o = out + static_cast<size_t>(r) * dim;
    const double ss = lane_sum(dim, [&](int j) { return static_cast<double>(xr[j]) * xr[j]; });
    const float rs = math::rmsnorm_rstd(ss, dim, eps);
    rstd[r] = rs;
    for (int j = 0; j < dim; ++j) o[j] = math::rmsnorm_out(xr[j], rs, w[j]);
  }
}

MOE_CPU_CLONES void backward_rows(float* dx, float* dw, const float* dout, const float* x,
                                  const float* w, const float* rstd, int n_rows, int dim) {
  for (int r = 0; r < n_rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * dim;
    const float* d = dout + static_cast<size_t>(r) * dim;
    float* dxr = dx + static_cast<size_t>(r) * dim;
    const float rs = rstd[r];
    const double dot =
        lane_sum(dim, [&](int j) { return static_cast<double>(d[j]) * w[j] * xr[j]; });
    const float c = math::rmsnorm_backward_coeff(dot, rs, dim);
    for (int j = 0; j < dim; ++j) dxr[j] += math::rmsnorm_dx(xr[j], d[j], w[j], rs, c);
    if (dw) {
      for (int j = 0; j < dim; ++j) dw[j] += d[j] * xr[j] * rs;
    }
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps) {
  MOE_CUDA_DISPATCH(rmsnorm_forward, out, rstd, x, w, n_rows, dim, eps);
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_forward: n_rows=", n_rows, " dim=", dim);
  forward_rows(out, rstd, x, w, n_rows, dim, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim) {
  MOE_CUDA_DISPATCH(rmsnorm_backward, dx, dw, dout, x, w, rstd, n_rows, dim);
  MOE_CHECK(n_rows >= 0 && dim > 0, "rmsnorm_backward: n_rows=", n_rows, " dim=", dim);
  // out_j = x_j·r·w_j with r = (mean(x²)+eps)^(-1/2), dr/dx_j = -r³·x_j/dim, so
  //   dx_j = r·w_j·dout_j - (r³/dim)·x_j·Σ_i dout_i·w_i·x_i ;  dw_j = Σ_rows dout_j·x_j·r
  backward_rows(dx, dw, dout, x, w, rstd, n_rows, dim);
}

}  // namespace moe::kernels
