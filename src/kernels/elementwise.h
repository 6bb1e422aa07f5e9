// Small memory-bound kernels: SwiGLU activation, embedding lookup, residual add, copy, zero fill.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe::kernels {

// h = silu(g) · u, silu(z) = z / (1 + e^-z)
void swiglu_forward(float* h, const float* g, const float* u, size_t n);
// dg += dh · u · silu'(g) ; du += dh · silu(g)
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n);

// In place, for the MLP's backward scratch: on entry dg holds dh; on exit dg = dh·u·silu'(g) and
// du = dh·silu(g) (overwritten, not added).
void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n);
// out[n,:] = wte[tokens[n],:]
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim);
// dwte[tokens[n],:] += dout[n,:] (rows in token order, so the sum order is fixed)
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim);

// y += x
void add_inplace(float* y, const float* x, size_t n);
// dst = src ; x = 0 (the model's buffer copies, named so each device has its own)
void copy(float* dst, const float* src, size_t n);
void fill_zero(float* x, size_t n);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void swiglu_forward(float* h, const float* g, const float* u, size_t n);
void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n);
void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n);
void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim);
void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim);
void add_inplace(float* y, const float* x, size_t n);
void copy(float* dst, const float* src, size_t n);
void fill_zero(float* x, size_t n);
}  // namespace cuda

}  // namespace moe::kernels
