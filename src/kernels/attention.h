// Causal multi-head scaled dot-product attention on [B, T, n_head·head_dim] buffers (the layout the
// q/k/v projections produce), flash-style on both devices: no T×T probabilities are kept, backward
// recomputes them block by block from the row log-sum-exp that forward saves.
#pragma once
#include <cstddef>

namespace moe::kernels {

// Floats of the `att` buffer forward keeps for backward, the same on every device:
//   att = [ lse (B, nh, T) | out (B, T, nh·hd) ]   (row log-sum-exp, a copy of out)
// and of backward's scratch: none (the CPU kernel's block tiles are its own workspace per call,
// (2·hd + 6·hdp + 128)·64 floats with hdp = hd rounded up to 32: 96 KiB at hd 32; the CUDA
// kernel's row dots live in its own scratch), so this is 0 on both devices.
size_t attention_saved_floats(int B, int T, int n_head, int head_dim);
size_t attention_scratch_floats(int T);
// out[b,t,h,:] = sum_{s<=t} softmax_s(q·k / sqrt(hd)) v[b,s,h,:]
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim);
// dq, dk, dv += ... ; att is forward's; scratch (attention_scratch_floats, 0) may be null.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch);

// The CPU kernel's instruction set: 2 AVX-512 + FMA, 1 AVX2 + FMA, 0 baseline (std::fma per lane),
// by CPU feature. Every one gives the same bits. force_attention_cpu_isa(n) runs a narrower one
// (tests compare them); -1 goes back to the CPU's; a set the CPU lacks is an error.
int attention_cpu_isa();
void force_attention_cpu_isa(int isa);

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
