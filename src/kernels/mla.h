// Multi-head latent attention (DeepSeek-V2/V3): the head assembly between the projections and the
// attention kernel. The projections give, per token row n of N = B·T and head h of nh,
//   q  [N, nh, dn + dr]   the query: dn "nope" columns, then dr rotary columns
//   kv [N, nh, dn + dv]   kv_b's output: the key's dn nope columns, then the value's dv
//   kpe [N, dr]           the rotary key, one per token, shared by every head
// and the attention kernel (kernels/attention.h) takes Q, K, V of one head width D = max(dn + dr,
// dv) with scale 1/sqrt(D). mla_heads_forward builds them:
//   Q[n,h] = q_scale · [q_nope | rope(q_pe) | 0…]   K[n,h] = [k_nope | rope(kpe) | 0…]
//   V[n,h] = [v | 0…]
// zero-padded to D (zeros add nothing to q·k or to the output's first dv columns). q_scale turns
// the kernel's 1/sqrt(D) into the model's softmax scale: q_scale = softmax_scale · sqrt(D).
// The rotary columns follow Hugging Face's DeepSeek-V2/V3 modeling code, which de-interleaves a
// head's dr columns before its rotate_half rotation: pair i is (x[2i], x[2i+1]), rotated by angle
// i of the table, written to columns i and i + dr/2 of the rotary part.
// The table is rope.h's, [T, dr/2] (a YaRN table carries its cos/sin scaling).
#pragma once
#include <cstddef>

#include "kernels/rope.h"

namespace moe::kernels {

struct MlaShape {
  int B = 0, T = 0;  // N = B·T rows; row n is position n mod T
  int nh = 0;        // heads (this rank's, under tensor parallelism)
  int dn = 0, dr = 0, dv = 0;
  int D = 0;  // the attention head width: max(dn + dr, dv)
};

// Q, K, V [N, nh, D] are overwritten. Throws naming the dimension when D is too small or dr odd.
void mla_heads_forward(float* Q, float* K, float* V, const float* q, const float* kv,
                       const float* kpe, const RopeTable& rope, const MlaShape& s, float q_scale);
// The adjoint: dq [N, nh, dn + dr], dkv [N, nh, dn + dv] and dkpe [N, dr] are OVERWRITTEN from dQ,
// dK, dV [N, nh, D] (the padding's gradient is dropped). dkpe sums the heads in order 0..nh-1.
void mla_heads_backward(float* dq, float* dkv, float* dkpe, const float* dQ, const float* dK,
                        const float* dV, const RopeTable& rope, const MlaShape& s, float q_scale);

// dst [rows, dst_cols] = src [rows, src_cols], cut or zero-padded to dst_cols columns (the
// attention output's first dv columns of D, and back).
void copy_cols(float* dst, int dst_cols, const float* src, int src_cols, size_t rows);

namespace cuda {
void mla_heads_forward(float* Q, float* K, float* V, const float* q, const float* kv,
                       const float* kpe, const RopeTable& rope, const MlaShape& s, float q_scale);
void mla_heads_backward(float* dq, float* dkv, float* dkpe, const float* dQ, const float* dK,
                        const float* dV, const RopeTable& rope, const MlaShape& s, float q_scale);
void copy_cols(float* dst, int dst_cols, const float* src, int src_cols, size_t rows);
}  // namespace cuda

// Shape checks shared by both devices (throws naming `who` and the value).
void check_mla_shape(const RopeTable& rope, const MlaShape& s, const char* who);

}  // namespace moe::kernels
