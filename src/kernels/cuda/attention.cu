// Causal attention on the GPU, flash-style: no T×T buffer. A block holds kRows consecutive rows
// of one (b, h), one warp per row, and walks the other side in tiles of kTile rows staged in
// shared memory. Within a tile, lane l owns row l of the tile for the dot products, and lane
// j + 32c owns output column j + 32c for the accumulation (so head_dim <= 32·kCols = 128).
// Forward keeps the online-softmax row log-sum-exp and a copy of out in `att`:
//   att = [ lse (B, nh, T) | out (B, T, nh·hd) ]
// The softmax pieces (exp_poly, online_softmax_rescale, attention_dscore) are element_math.h's,
// shared with the CPU kernel (kernels/attention.cpp).
// Backward (deterministic, no atomics), with p = exp(scale·q_t·k_s - lse_t), D_t = dout_t·out_t:
//   dq_t += Σ_{s<=t} ds_ts k_s ,  dk_s += Σ_{t>=s} ds_ts q_t ,  dv_s += Σ_{t>=s} p_ts dout_t ,
//   ds_ts = scale · p_ts · (dout_t·v_s - D_t)
// one kernel per query row for dq and one per key row for dk, dv. See attention.h.
#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kRows = 8;   // rows (warps) per block
constexpr int kTile = 32;  // rows of the other side per shared-memory tile (one per lane)
constexpr int kCols = 4;   // output columns per lane: head_dim <= 32·kCols
constexpr int kMaxHeadDim = 32 * kCols;

struct Geom {
  int T, n_head, hd;
  float scale;
  // Element offset of row t of the current (b, h) in a [B, T, nh·hd] buffer.
  __device__ size_t at(int t) const {
    return (static_cast<size_t>(blockIdx.z) * T + t) * (static_cast<size_t>(n_head) * hd) +
           static_cast<size_t>(blockIdx.y) * hd;
  }
  // Offset of row t of the current (b, h) in a [B, nh, T] buffer.
  __device__ size_t row(int t) const {
    return (static_cast<size_t>(blockIdx.z) * n_head + blockIdx.y) * T + t;
  }
};

// Stages rows r0 .. r0+n-1 of src (current b, h) into dst with row stride ld.
__device__ void load_rows(float* dst, int ld, const float* src, const Geom& g, int r0, int n) {
  for (int i = threadIdx.x; i < n * g.hd; i += blockDim.x) {
    const int r = i / g.hd, j = i - r * g.hd;
    dst[r * ld + j] = src[g.at(r0 + r) + j];
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float d = 0.0f;
  for (int j = 0; j < n; ++j) d += a[j] * b[j];
  return d;
}

// acc[c] += Σ_{i in [i0, i1)} coef_i · rows[i·ld + lane + 32c], coef_i held by lane i.
__device__ __forceinline__ void accumulate(float (&acc)[kCols], float coef, const float* rows,
                                           int ld, int i0, int i1, int hd, int lane) {
  for (int i = i0; i < i1; ++i) {
    const float ci = __shfl_sync(kFullMask, coef, i);
    const float* r = rows + i * ld;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int j = lane + 32 * c;
      if (j < hd) acc[c] += ci * r[j];
    }
  }
}

// The row this warp owns (one warp per row, kRows rows per block along T), this thread's lane,
// the block's first row and whether the row is inside T.
struct WarpRow {
  int warp, lane, first, row;
  bool active;
};
__device__ __forceinline__ WarpRow warp_row(const Geom& g) {
  const int warp = threadIdx.x / 32, first = blockIdx.x * kRows;
  return {warp, static_cast<int>(threadIdx.x % 32), first, first + warp, first + warp < g.T};
}

// Keys and values s0 .. s0+n-1 of the current (b, h) staged in Ks and Vs (row strides ldk, ldv)
// for the whole block, once every warp is done with the previous tile.
__device__ __forceinline__ void stage_key_tile(float* Ks, int ldk, float* Vs, int ldv, const float* k,
                                               const float* v, const Geom& g, int s0) {
  __syncthreads();
  const int n = min(kTile, g.T - s0);
  load_rows(Ks, ldk, k, g, s0, n);
  load_rows(Vs, ldv, v, g, s0, n);
  __syncthreads();
}

__global__ void attention_forward_kernel(float* out, float* lse, float* out_copy, const float* q,
                                         const float* k, const float* v, Geom g) {
  MOE_DYNAMIC_SHARED(float, sm);
  const int hd = g.hd, ldk = hd + 1;  // odd stride: lane l reading row l hits distinct banks
  float* Ks = sm;
  float* Vs = Ks + kTile * ldk;
  float* Qs = Vs + kTile * hd;
  const auto [warp, lane, t0, t, active] = warp_row(g);
  float* qw = Qs + warp * hd;
  if (active)
    for (int j = lane; j < hd; j += 32) qw[j] = q[g.at(t) + j];
  const int t_last = min(t0 + kRows, g.T) - 1;

  float m = -INFINITY, l = 0.0f, acc[kCols] = {};
  for (int s0 = 0; s0 <= t_last; s0 += kTile) {
    stage_key_tile(Ks, ldk, Vs, hd, k, v, g, s0);  // (its first barrier also orders qw's writes)
    if (!active || s0 > t) continue;
    const bool valid = s0 + lane <= t;
    const float x = valid ? g.scale * dot(qw, Ks + lane * ldk, hd) : -INFINITY;
    // online softmax: lane 0 is always valid, so m_new is finite
    const float m_new = fmaxf(m, warp_max(x));
    const float p = valid ? math::exp_poly(x - m_new) : 0.0f;
    const float corr = math::online_softmax_rescale(m, m_new);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] *= corr;
    m = m_new;
    accumulate(acc, p, Vs, hd, 0, min(kTile, t - s0 + 1), hd, lane);
  }
  if (!active) return;
  const float inv = 1.0f / l;
  const size_t o = g.at(t);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int j = lane + 32 * c;
    if (j < hd) out[o + j] = out_copy[o + j] = acc[c] * inv;
  }
  if (lane == 0) lse[g.row(t)] = m + logf(l);
}

// D[b, h, t] = dout_t · out_t, one warp per row (rows of all (b, h) flattened).
__global__ void attention_rowdot_kernel(float* D, const float* dout, const float* out,
                                        size_t n_rows, int T, int n_head, int hd) {
  const int lane = threadIdx.x % 32;
  for (size_t r = (blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x) / 32; r < n_rows;
       r += static_cast<size_t>(gridDim.x) * blockDim.x / 32) {
    const size_t t = r % T, bh = r / T, b = bh / n_head, h = bh % n_head;
    const size_t o = (b * T + t) * (static_cast<size_t>(n_head) * hd) + h * hd;
    float d = 0.0f;
    for (int j = lane; j < hd; j += 32) d += dout[o + j] * out[o + j];
    d = warp_sum(d);
    if (lane == 0) D[r] = d;
  }
}

// dq, one warp per query row t, key tiles s <= t.
__global__ void attention_dq_kernel(float* dq, const float* dout, const float* q, const float* k,
                                    const float* v, const float* lse, const float* D, Geom g) {
  MOE_DYNAMIC_SHARED(float, sm);
  const int hd = g.hd, ldk = hd + 1;
  float* Ks = sm;
  float* Vs = Ks + kTile * ldk;
  float* Qs = Vs + kTile * ldk;
  float* Os = Qs + kRows * hd;
  const auto [warp, lane, t0, t, active] = warp_row(g);
  float* qw = Qs + warp * hd;
  float* ow = Os + warp * hd;
  float lse_t = 0.0f, D_t = 0.0f;
  if (active) {
    for (int j = lane; j < hd; j += 32) {
      qw[j] = q[g.at(t) + j];
      ow[j] = dout[g.at(t) + j];
    }
    lse_t = lse[g.row(t)];
    D_t = D[g.row(t)];
  }
  const int t_last = min(t0 + kRows, g.T) - 1;

  float acc[kCols] = {};
  for (int s0 = 0; s0 <= t_last; s0 += kTile) {
    stage_key_tile(Ks, ldk, Vs, ldk, k, v, g, s0);
    if (!active || s0 > t) continue;
    float ds = 0.0f;
    if (s0 + lane <= t) {
      const float p = math::exp_poly(g.scale * dot(qw, Ks + lane * ldk, hd) - lse_t);
      ds = math::attention_dscore(p, dot(ow, Vs + lane * ldk, hd), D_t, g.scale);
    }
    accumulate(acc, ds, Ks, ldk, 0, min(kTile, t - s0 + 1), hd, lane);
  }
  if (!active) return;
  const size_t o = g.at(t);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int j = lane + 32 * c;
    if (j < hd) dq[o + j] += acc[c];
  }
}

// dk, dv, one warp per key row s, query tiles t >= s.
__global__ void attention_dkv_kernel(float* dk, float* dv, const float* dout, const float* q,
                                     const float* k, const float* v, const float* lse,
                                     const float* D, Geom g) {
  MOE_DYNAMIC_SHARED(float, sm);
  const int hd = g.hd, ldq = hd + 1;
  float* Qs = sm;
  float* Os = Qs + kTile * ldq;
  float* Ls = Os + kTile * ldq;
  float* Ds = Ls + kTile;
  float* Kw = Ds + kTile;
  float* Vw = Kw + kRows * hd;
  const auto [warp, lane, s_first, s, active] = warp_row(g);
  float* kw = Kw + warp * hd;
  float* vw = Vw + warp * hd;
  if (active)
    for (int j = lane; j < hd; j += 32) {
      kw[j] = k[g.at(s) + j];
      vw[j] = v[g.at(s) + j];
    }

  float acc_k[kCols] = {}, acc_v[kCols] = {};
  for (int t0 = s_first; t0 < g.T; t0 += kTile) {
    __syncthreads();
    const int n = min(kTile, g.T - t0);
    load_rows(Qs, ldq, q, g, t0, n);
    load_rows(Os, ldq, dout, g, t0, n);
    if (threadIdx.x < n) {
      Ls[threadIdx.x] = lse[g.row(t0 + threadIdx.x)];
      Ds[threadIdx.x] = D[g.row(t0 + threadIdx.x)];
    }
    __syncthreads();
    if (!active) continue;
    const int i0 = max(0, s - t0);  // first query t >= s of the tile
    if (i0 >= n) continue;
    float p = 0.0f, ds = 0.0f;
    if (lane >= i0 && lane < n) {
      p = math::exp_poly(g.scale * dot(Qs + lane * ldq, kw, hd) - Ls[lane]);
      ds = math::attention_dscore(p, dot(Os + lane * ldq, vw, hd), Ds[lane], g.scale);
    }
    accumulate(acc_v, p, Os, ldq, i0, n, hd, lane);
    accumulate(acc_k, ds, Qs, ldq, i0, n, hd, lane);
  }
  if (!active) return;
  const size_t o = g.at(s);
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int j = lane + 32 * c;
    if (j < hd) {
      dk[o + j] += acc_k[c];
      dv[o + j] += acc_v[c];
    }
  }
}


void check_sizes(const char* who, int B, int T, int n_head, int head_dim) {
  MOE_CHECK(B >= 0 && T >= 0 && n_head > 0 && head_dim > 0, who, ": B=", B, " T=", T,
            " n_head=", n_head, " head_dim=", head_dim);
  MOE_CHECK(head_dim <= kMaxHeadDim, who, ": head_dim ", head_dim,
            " exceeds the CUDA kernel's limit of ", kMaxHeadDim);
  MOE_CHECK(B <= 65535 && n_head <= 65535, who, ": B=", B, " or n_head=", n_head,
            " exceeds the CUDA grid limit 65535");
}

dim3 grid_of(int B, int T, int n_head) {
  return dim3(static_cast<unsigned>((T + kRows - 1) / kRows), static_cast<unsigned>(n_head),
              static_cast<unsigned>(B));
}

}  // namespace

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim) {
  check_sizes("attention_forward", B, T, n_head, head_dim);
  if (B == 0 || T == 0) return;
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  const Geom g{T, n_head, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  const size_t smem =
      sizeof(float) * (kTile * (head_dim + 1) + kTile * head_dim + kRows * head_dim);
  MOE_LAUNCH(attention_forward_kernel, grid_of(B, T, n_head), kRows * 32, smem, stream())(
      out, att, att + rows, q, k, v, g);
  MOE_CUDA_LAUNCHED("attention_forward");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* /*scratch: unused on CUDA*/) {
  check_sizes("attention_backward", B, T, n_head, head_dim);
  if (B == 0 || T == 0) return;
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  const Geom g{T, n_head, head_dim, 1.0f / std::sqrt(static_cast<float>(head_dim))};
  const float* lse = att;
  const float* out = att + rows;
  float* D = workspace(Workspace::kAttentionRowdot).as<float>(rows);
  const unsigned rowdot_blocks = static_cast<unsigned>(std::min<size_t>((rows + 7) / 8, 65536));
  MOE_LAUNCH(attention_rowdot_kernel, rowdot_blocks, 256, 0, stream())(D, dout, out, rows, T, n_head,
                                                                       head_dim);
  MOE_CUDA_LAUNCHED("attention_backward D");
  const size_t smem_dq = sizeof(float) * (2 * kTile * (head_dim + 1) + 2 * kRows * head_dim);
  MOE_LAUNCH(attention_dq_kernel, grid_of(B, T, n_head), kRows * 32, smem_dq, stream())(dq, dout, q, k, v,
                                                                                        lse, D, g);
  MOE_CUDA_LAUNCHED("attention_backward dq");
  const size_t smem_dkv =
      sizeof(float) * (2 * kTile * (head_dim + 1) + 2 * kTile + 2 * kRows * head_dim);
  MOE_LAUNCH(attention_dkv_kernel, grid_of(B, T, n_head), kRows * 32, smem_dkv, stream())(dk, dv, dout, q,
                                                                                          k, v, lse, D, g);
  MOE_CUDA_LAUNCHED("attention_backward dk dv");
}

}  // namespace moe::kernels::cuda
