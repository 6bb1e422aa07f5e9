// Causal multi-head scaled dot-product attention on [B, T, n_head·head_dim] buffers (the layout the
// q/k/v projections produce). Probabilities att [B, n_head, T, T] are kept for backward; the s²
// term of the memory model is exactly this buffer.
#pragma once
#include <cstddef>

namespace moe::kernels {

// Floats of the `att` buffer forward keeps for backward, and of backward's scratch, on the active
// device: the CPU keeps the probabilities [B,nh,T,T] and needs T·T scratch; the CUDA kernels are
// flash-style (no T×T buffer) and keep the row log-sum-exp [B,nh,T] and a copy of out [B,T,nh·hd].
size_t attention_saved_floats(int B, int T, int n_head, int head_dim);
size_t attention_scratch_floats(int T);
// out[b,t,h,:] = sum_{s<=t} softmax_s(q·k / sqrt(hd)) v[b,s,h,:]
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim);
// dq, dk, dv += ... ; scratch needs T·T floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch);
}  // namespace cuda

}  // namespace moe::kernels
