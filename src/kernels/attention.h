// Causal multi-head scaled dot-product attention on [B, T, n_head·head_dim] buffers (the layout the
// q/k/v projections produce). Probabilities att [B, n_head, T, T] are kept for backward; the s²
// term of the memory model is exactly this buffer.
#pragma once

namespace moe::kernels {

// out[b,t,h,:] = sum_{s<=t} softmax_s(q·k / sqrt(hd)) v[b,s,h,:]
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim);
// dq, dk, dv += ... ; scratch needs T·T floats.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch);

}  // namespace moe::kernels
