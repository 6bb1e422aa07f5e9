// SwiGLU activation, embedding lookup and residual add. See elementwise.h.
#include "kernels/elementwise.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/device_select.h"

namespace moe::kernels {

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  MOE_CUDA_DISPATCH(swiglu_forward, h, g, u, n);
  for (size_t i = 0; i < n; ++i) h[i] = math::swiglu(g[i], u[i]);
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  MOE_CUDA_DISPATCH(swiglu_backward, dg, du, dh, g, u, n);
  for (size_t i = 0; i < n; ++i) math::swiglu_backward(dg[i], du[i], dh[i], g[i], u[i]);
}

void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n) {
  MOE_CUDA_DISPATCH(swiglu_backward_inplace, dg, du, g, u, n);
  for (size_t i = 0; i < n; ++i) {
    const float dh = dg[i];
    dg[i] = 0.0f;
    du[i] = 0.0f;
    math::swiglu_backward(dg[i], du[i], dh, g[i], u[i]);
  }
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim) {
  MOE_CUDA_DISPATCH(embedding_forward, out, tokens, wte, n_tokens, dim);
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_forward: n_tokens=", n_tokens, " dim=", dim);
  for (int n = 0; n < n_tokens; ++n) {
    std::memcpy(out + static_cast<size_t>(n) * dim, wte + static_cast<size_t>(tokens[n]) * dim,
                sizeof(float) * dim);
  }
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim) {
  MOE_CUDA_DISPATCH(embedding_backward, dwte, dout, tokens, n_tokens, dim);
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_backward: n_tokens=", n_tokens, " dim=", dim);
  for (int n = 0; n < n_tokens; ++n) {
    float* d = dwte + static_cast<size_t>(tokens[n]) * dim;
    const float* s = dout + static_cast<size_t>(n) * dim;
    for (int j = 0; j < dim; ++j) d[j] += s[j];
  }
}

void add_inplace(float* y, const float* x, size_t n) {
  MOE_CUDA_DISPATCH(add_inplace, y, x, n);
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void copy(float* dst, const float* src, size_t n) {
  MOE_CUDA_DISPATCH(copy, dst, src, n);
  if (n) std::memcpy(dst, src, n * sizeof(float));
}

void fill_zero(float* x, size_t n) {
  MOE_CUDA_DISPATCH(fill_zero, x, n);
  if (n) std::memset(x, 0, n * sizeof(float));
}

}  // namespace moe::kernels
