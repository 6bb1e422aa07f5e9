// Multi-head latent attention's head assembly on the GPU: one thread per (row, head, pair) for
// the rotary columns and per element for the rest; the rotary key's gradient sums the heads in a
// thread of its own, in order (no atomics: the same bits every run). See mla.h.
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/mla.h"

namespace moe::kernels::cuda {
namespace {

struct Dims {
  int T, nh, dn, dr, dv, D;
};

// Rotary pair i at flat index idx over [rows, dr / 2], where a row holds one token's heads_per_row
// heads: the row, its token n and the pair's angle in the rope tables (position n mod T). Both rope
// kernels index this way: the forward one row per head, the backward one row per token.
struct RopePairAt {
  int i;
  size_t row, n, angle;
};
__device__ __forceinline__ RopePairAt rope_pair_at(size_t idx, const Dims& d, int heads_per_row) {
  const int half = d.dr / 2;
  const int i = static_cast<int>(idx % half);
  const size_t row = idx / half, n = row / heads_per_row;
  return {i, row, n, (n % d.T) * half + i};
}

// Element j of head h of row n: nope / value columns (j < D) of Q, K, V.
__global__ void mla_plain_forward(float* Q, float* K, float* V, const float* q, const float* kv,
                                  size_t n_elems, Dims d, float q_scale) {
  MOE_GRID_STRIDE(idx, n_elems) {
    const int j = static_cast<int>(idx % d.D);
    const size_t nh_row = idx / d.D;  // n·nh + h
    const float* qh = q + nh_row * (d.dn + d.dr);
    const float* kvh = kv + nh_row * (d.dn + d.dv);
    if (j < d.dn) {
      Q[idx] = qh[j] * q_scale;
      K[idx] = kvh[j];
    } else if (j >= d.dn + d.dr) {
      Q[idx] = 0.0f;
      K[idx] = 0.0f;
    }
    V[idx] = j < d.dv ? kvh[d.dn + j] : 0.0f;
  }
}

// Pair i of head h of row n: the rotary columns of Q and K.
__global__ void mla_rope_forward(float* Q, float* K, const float* q, const float* kpe,
                                 const float* cos_t, const float* sin_t, size_t n_pairs, Dims d,
                                 float q_scale) {
  const int half = d.dr / 2;
  MOE_GRID_STRIDE(idx, n_pairs) {
    const RopePairAt p = rope_pair_at(idx, d, d.nh);  // a row per head
    const int i = p.i;
    const float c = cos_t[p.angle], s = sin_t[p.angle];
    const float* qh = q + p.row * (d.dn + d.dr) + d.dn;
    float a = qh[2 * i], b = qh[2 * i + 1];
    math::rope_rotate(a, b, c, s);
    float* Qh = Q + p.row * d.D + d.dn;
    Qh[i] = a * q_scale;
    Qh[half + i] = b * q_scale;
    const float* kp = kpe + p.n * d.dr;
    float ka = kp[2 * i], kb = kp[2 * i + 1];
    math::rope_rotate(ka, kb, c, s);
    float* Kh = K + p.row * d.D + d.dn;
    Kh[i] = ka;
    Kh[half + i] = kb;
  }
}

// dq's nope columns and dkv, element by element of [N, nh, max(dn + dr, dn + dv)].
__global__ void mla_plain_backward(float* dq, float* dkv, const float* dQ, const float* dK,
                                   const float* dV, size_t n_elems, int width, Dims d,
                                   float q_scale) {
  MOE_GRID_STRIDE(idx, n_elems) {
    const int j = static_cast<int>(idx % width);
    const size_t nh_row = idx / width;
    const float* gQ = dQ + nh_row * d.D;
    const float* gK = dK + nh_row * d.D;
    const float* gV = dV + nh_row * d.D;
    if (j < d.dn) {
      dq[nh_row * (d.dn + d.dr) + j] = gQ[j] * q_scale;
      dkv[nh_row * (d.dn + d.dv) + j] = gK[j];
    } else if (j < d.dn + d.dv) {
      dkv[nh_row * (d.dn + d.dv) + j] = gV[j - d.dn];
    }
  }
}

// Pair i of row n: dq's rotary columns for every head, and dkpe summed over the heads in order.
__global__ void mla_rope_backward(float* dq, float* dkpe, const float* dQ, const float* dK,
                                  const float* cos_t, const float* sin_t, size_t n_pairs, Dims d,
                                  float q_scale) {
  const int half = d.dr / 2;
  MOE_GRID_STRIDE(idx, n_pairs) {
    const RopePairAt p = rope_pair_at(idx, d, 1);  // a row per token
    const int i = p.i;
    const size_t n = p.n;
    const float c = cos_t[p.angle], s = -sin_t[p.angle];
    float sa = 0.0f, sb = 0.0f;
    for (int h = 0; h < d.nh; ++h) {
      const size_t nh_row = n * d.nh + h;
      const float* gQ = dQ + nh_row * d.D + d.dn;
      float a = gQ[i] * q_scale, b = gQ[half + i] * q_scale;
      math::rope_rotate(a, b, c, s);
      float* qh = dq + nh_row * (d.dn + d.dr) + d.dn;
      qh[2 * i] = a;
      qh[2 * i + 1] = b;
      const float* gK = dK + nh_row * d.D + d.dn;
      float ka = gK[i], kb = gK[half + i];
      math::rope_rotate(ka, kb, c, s);
      sa += ka;
      sb += kb;
    }
    dkpe[n * d.dr + 2 * i] = sa;
    dkpe[n * d.dr + 2 * i + 1] = sb;
  }
}

__global__ void copy_cols_kernel(float* dst, int dst_cols, const float* src, int src_cols,
                                 size_t n_elems) {
  MOE_GRID_STRIDE(idx, n_elems) {
    const int j = static_cast<int>(idx % dst_cols);
    const size_t r = idx / dst_cols;
    dst[idx] = j < src_cols ? src[r * src_cols + j] : 0.0f;
  }
}

Dims dims_of(const MlaShape& s) { return {s.T, s.nh, s.dn, s.dr, s.dv, s.D}; }

}  // namespace

void mla_heads_forward(float* Q, float* K, float* V, const float* q, const float* kv,
                       const float* kpe, const RopeTable& rope, const MlaShape& s, float q_scale) {
  check_mla_shape(rope, s, "mla_heads_forward");
  const size_t rows = static_cast<size_t>(s.B) * s.T * s.nh;
  if (rows == 0) return;
  upload_rope_table(rope);
  const Dims d = dims_of(s);
  const size_t n_elems = rows * s.D, n_pairs = rows * (s.dr / 2);
  MOE_LAUNCH(mla_plain_forward, elem_blocks(n_elems), kThreads, 0, stream())(Q, K, V, q, kv, n_elems,
                                                                             d, q_scale);
  MOE_CUDA_LAUNCHED("mla_heads_forward");
  MOE_LAUNCH(mla_rope_forward, elem_blocks(n_pairs), kThreads, 0, stream())(
      Q, K, q, kpe, rope.dev_cos.data(), rope.dev_sin.data(), n_pairs, d, q_scale);
  MOE_CUDA_LAUNCHED("mla_heads_forward");
}

void mla_heads_backward(float* dq, float* dkv, float* dkpe, const float* dQ, const float* dK,
                        const float* dV, const RopeTable& rope, const MlaShape& s, float q_scale) {
  check_mla_shape(rope, s, "mla_heads_backward");
  const size_t N = static_cast<size_t>(s.B) * s.T, rows = N * s.nh;
  if (rows == 0) return;
  upload_rope_table(rope);
  const Dims d = dims_of(s);
  const int width = s.dn + s.dv;  // dq's nope columns and all of dkv; the rotary ones below
  const size_t n_elems = rows * width, n_pairs = N * (s.dr / 2);
  MOE_LAUNCH(mla_plain_backward, elem_blocks(n_elems), kThreads, 0, stream())(
      dq, dkv, dQ, dK, dV, n_elems, width, d, q_scale);
  MOE_CUDA_LAUNCHED("mla_heads_backward");
  MOE_LAUNCH(mla_rope_backward, elem_blocks(n_pairs), kThreads, 0, stream())(
      dq, dkpe, dQ, dK, rope.dev_cos.data(), rope.dev_sin.data(), n_pairs, d, q_scale);
  MOE_CUDA_LAUNCHED("mla_heads_backward");
}

void copy_cols(float* dst, int dst_cols, const float* src, int src_cols, size_t rows) {
  MOE_CHECK(dst_cols >= 0 && src_cols >= 0, "copy_cols: columns ", dst_cols, " and ", src_cols);
  const size_t n = rows * dst_cols;
  if (n == 0) return;
  MOE_LAUNCH(copy_cols_kernel, elem_blocks(n), kThreads, 0, stream())(dst, dst_cols, src, src_cols, n);
  MOE_CUDA_LAUNCHED("copy_cols");
}

}  // namespace moe::kernels::cuda
