// SwiGLU activation, embedding lookup and residual add. See elementwise.h.
#include "kernels/elementwise.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu_clones.h"
#include "kernels/device_select.h"
#include "kernels/lanes.h"

namespace moe::kernels {

namespace {

// SwiGLU's CPU loops, a native vector at a time (kernels/lanes.h) in per-instruction-set clones
// (MOE_ISA_CLONES, kernels/cpu_clones.h). libm's expf is one call per element and kept these
// passes at ~7% of an E8 k2 F3584 MoE layer (bench moe-layer --breakdown); the 4-lane SSE form
// took 8% of a bf16 training step of the tiny model (perf, 2026-12-03). On an AVX2 Zen 8M
// elements: forward 4.4 -> 2.7 ns an element against the 16-lane form (2026-12-05).
using namespace lanes;

template <class F, class I>
MOE_LANES F sigmoid_lanes(F z) {
  return 1.0f / (exp_lanes<F, I>(-z) + 1.0f);
}

// h = silu(g)·u
template <class F, class I>
MOE_LANES F swiglu_lanes(F g, F u) {
  return g * sigmoid_lanes<F, I>(g) * u;
}
// dg += dh·u·silu'(g), du += dh·silu(g), silu'(z) = s·(1 + z·(1 - s))  (math::swiglu_backward)
template <class F, class I>
MOE_LANES void swiglu_backward_lanes(F& dg, F& du, F dh, F g, F u) {
  const F s = sigmoid_lanes<F, I>(g);
  dg += dh * u * (s * (g * (1.0f - s) + 1.0f));
  du += dh * (g * s);
}

template <int W>
MOE_LANES void swiglu_forward_lanes(float* h, const float* g, const float* u, size_t n) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  size_t i = 0;
  for (; i + W <= n; i += W) storev(h + i, swiglu_lanes<F, I>(loadv<F>(g + i), loadv<F>(u + i)));
  for (; i < n; ++i) h[i] = swiglu_lanes<float, int32_t>(g[i], u[i]);
}
MOE_ISA_CLONES(swiglu_forward_cpu, swiglu_forward_lanes,
               (float* h, const float* g, const float* u, size_t n), (h, g, u, n))

template <int W>
MOE_LANES void swiglu_backward_lanes_n(float* dg, float* du, const float* dh, const float* g,
                                       const float* u, size_t n) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  size_t i = 0;
  for (; i + W <= n; i += W) {
    F dgv = loadv<F>(dg + i), duv = loadv<F>(du + i);
    swiglu_backward_lanes<F, I>(dgv, duv, loadv<F>(dh + i), loadv<F>(g + i), loadv<F>(u + i));
    storev(dg + i, dgv);
    storev(du + i, duv);
  }
  for (; i < n; ++i) swiglu_backward_lanes<float, int32_t>(dg[i], du[i], dh[i], g[i], u[i]);
}
MOE_ISA_CLONES(swiglu_backward_cpu, swiglu_backward_lanes_n,
               (float* dg, float* du, const float* dh, const float* g, const float* u, size_t n),
               (dg, du, dh, g, u, n))

template <int W>
MOE_LANES void swiglu_backward_inplace_lanes(float* dg, float* du, const float* g, const float* u,
                                             size_t n) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  size_t i = 0;
  for (; i + W <= n; i += W) {
    F dgv{}, duv{};
    swiglu_backward_lanes<F, I>(dgv, duv, loadv<F>(dg + i), loadv<F>(g + i), loadv<F>(u + i));
    storev(dg + i, dgv);
    storev(du + i, duv);
  }
  for (; i < n; ++i) {
    const float dh = dg[i];
    dg[i] = 0.0f;
    du[i] = 0.0f;
    swiglu_backward_lanes<float, int32_t>(dg[i], du[i], dh, g[i], u[i]);
  }
}
MOE_ISA_CLONES(swiglu_backward_inplace_cpu, swiglu_backward_inplace_lanes,
               (float* dg, float* du, const float* g, const float* u, size_t n), (dg, du, g, u, n))

}  // namespace

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  MOE_CUDA_DISPATCH(swiglu_forward, h, g, u, n);
  swiglu_forward_cpu(h, g, u, n);
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  MOE_CUDA_DISPATCH(swiglu_backward, dg, du, dh, g, u, n);
  swiglu_backward_cpu(dg, du, dh, g, u, n);
}

void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n) {
  MOE_CUDA_DISPATCH(swiglu_backward_inplace, dg, du, g, u, n);
  swiglu_backward_inplace_cpu(dg, du, g, u, n);
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
