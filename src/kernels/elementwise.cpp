// SwiGLU activation, embedding lookup and residual add. See elementwise.h.
#include "kernels/elementwise.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace moe::kernels {

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float s = 1.0f / (1.0f + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  // silu(z) = z·s(z), silu'(z) = s(z)·(1 + z·(1 - s(z)))
  for (size_t i = 0; i < n; ++i) {
    float z = g[i];
    float s = 1.0f / (1.0f + std::exp(-z));
    dg[i] += dh[i] * u[i] * (s * (1.0f + z * (1.0f - s)));
    du[i] += dh[i] * (z * s);
  }
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_forward: n_tokens=", n_tokens, " dim=", dim);
  for (int n = 0; n < n_tokens; ++n) {
    std::memcpy(out + static_cast<size_t>(n) * dim, wte + static_cast<size_t>(tokens[n]) * dim,
                sizeof(float) * dim);
  }
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim) {
  MOE_CHECK(n_tokens >= 0 && dim >= 0, "embedding_backward: n_tokens=", n_tokens, " dim=", dim);
  for (int n = 0; n < n_tokens; ++n) {
    float* d = dwte + static_cast<size_t>(tokens[n]) * dim;
    const float* s = dout + static_cast<size_t>(n) * dim;
    for (int j = 0; j < dim; ++j) d[j] += s[j];
  }
}

void add_inplace(float* y, const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace moe::kernels
