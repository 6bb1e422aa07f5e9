// SwiGLU activation, embedding lookup and residual add. See elementwise.h.
#include "kernels/elementwise.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu_clones.h"
#include "kernels/device_select.h"

namespace moe::kernels {

namespace {

// SwiGLU's CPU loops, sixteen lanes at a time (GCC/Clang vector extensions), in CPU-feature
// clones (kernels/cpu_clones.h): one zmm register per vector where the CPU has AVX-512, four SSE
// registers on any x86-64, a generic lowering elsewhere. libm's expf is one call per element and
// kept these passes at ~7% of an E8 k2 F3584 MoE layer (bench moe-layer --breakdown); the 4-lane
// SSE form took 8% of a bf16 training step of the tiny model (perf, 2026-12-03).
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
constexpr size_t kLanes = 16;
// The helpers below take and return F16 by value. They are always inlined into the clones, so no
// call crosses the clones' different vector ABIs, and GCC's note about that ABI (which it also
// gives where the baseline clone inlines them) does not apply anywhere in this file.
#pragma GCC diagnostic ignored "-Wpsabi"
#define MOE_LANES inline __attribute__((always_inline))

template <class F>
MOE_LANES F splat(float c) {
  return F{} + c;
}

// e^x, Cephes' expf: x = n·ln2 + f with n = round(x/ln2) (the 1.5·2^23 rounding trick), a degree-6
// polynomial in f, times 2^n built in the exponent bits. Relative error below 1e-7 on [-87, 88],
// where x is clamped (so e^x stays a normal float; -inf/+inf give e^-87/e^88); NaN stays NaN.
// F is float (I int32_t) or F16 (I I16): the same arithmetic per lane.
template <class F, class I>
MOE_LANES F exp_lanes(F x) {
  x = x < splat<F>(-87.0f) ? splat<F>(-87.0f) : x;
  x = x > splat<F>(88.0f) ? splat<F>(88.0f) : x;
  const F r = x * 1.44269504088896341f + 12582912.0f;
  const F n = r - 12582912.0f;
  const F two_n = __builtin_bit_cast(F, (__builtin_bit_cast(I, r) - 0x4B400000 + 127) << 23);
  const F f = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = splat<F>(1.9875691500e-4f);
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  return (p * (f * f) + f + 1.0f) * two_n;
}

template <class F, class I>
MOE_LANES F sigmoid_lanes(F z) {
  return 1.0f / (exp_lanes<F, I>(-z) + 1.0f);
}

MOE_LANES F16 load16(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
MOE_LANES void store16(float* p, F16 v) { std::memcpy(p, &v, sizeof v); }

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

MOE_CPU_CLONES void swiglu_forward_cpu(float* h, const float* g, const float* u, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    store16(h + i, swiglu_lanes<F16, I16>(load16(g + i), load16(u + i)));
  for (; i < n; ++i) h[i] = swiglu_lanes<float, int32_t>(g[i], u[i]);
}

MOE_CPU_CLONES void swiglu_backward_cpu(float* dg, float* du, const float* dh, const float* g,
                                        const float* u, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    F16 dgv = load16(dg + i), duv = load16(du + i);
    swiglu_backward_lanes<F16, I16>(dgv, duv, load16(dh + i), load16(g + i), load16(u + i));
    store16(dg + i, dgv);
    store16(du + i, duv);
  }
  for (; i < n; ++i) swiglu_backward_lanes<float, int32_t>(dg[i], du[i], dh[i], g[i], u[i]);
}

MOE_CPU_CLONES void swiglu_backward_inplace_cpu(float* dg, float* du, const float* g,
                                                const float* u, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    F16 dgv{}, duv{};
    swiglu_backward_lanes<F16, I16>(dgv, duv, load16(dg + i), load16(g + i), load16(u + i));
    store16(dg + i, dgv);
    store16(du + i, duv);
  }
  for (; i < n; ++i) {
    const float dh = dg[i];
    dg[i] = 0.0f;
    du[i] = 0.0f;
    swiglu_backward_lanes<float, int32_t>(dg[i], du[i], dh, g[i], u[i]);
  }
}

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
