// Causal multi-head attention on the CPU, flash-style (see attention.h), one (b, h) pair at a time
// on strided views (row stride C = n_head·head_dim, so no transposes are materialised).
// Queries and keys go in blocks of kBlock rows; the products of a block pair are BLAS GEMMs on
// kBlock×kBlock tiles kept on the stack, and key blocks above the diagonal are skipped (the
// causal half is never computed). The per-element math is element_math.h's, as on the GPU.
// Forward, query block i, online softmax over key blocks j <= i (running max m, sum l per row):
//   S = scale·Q_i K_j^T;  m' = max(m, rowmax S);  P = exp(S - m');  l = l·e^(m-m') + rowsum P;
//   O_i = O_i·e^(m-m') + P V_j;   finally O_i /= l, lse = m + log l.
// Backward, with P = exp(S - lse) recomputed and D_i = rowsum(dO_i ∘ O_i):
//   dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = scale·P ∘ (dP - D_i);
//   dQ_i += dS K_j;   dK_j += dS^T Q_i.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/cpu_clones.h"
#include "kernels/device_select.h"
#include "kernels/element_math.h"
#include "kernels/gemm.h"

// The row loops (exp over a row of scores) run as CPU-feature clones (kernels/cpu_clones.h).

namespace moe::kernels {

namespace {

constexpr int kBlock = 64;  // rows per query block and per key block (tiles kBlock×kBlock)
constexpr int kLanes = 16;  // partial maxima / sums per row: a vector's worth, fixed order

// One (b, h): the views of its rows in the [B, T, C] buffers and in [B, nh, T].
struct HeadView {
  size_t off;      // element offset of row 0 in a [B, T, C] buffer
  size_t row_off;  // offset of row 0 in a [B, nh, T] buffer
  int T, C, hd;
  float scale;
};

HeadView head_view(int b, int h, int T, int n_head, int head_dim) {
  const int C = n_head * head_dim;
  return {static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * head_dim,
          (static_cast<size_t>(b) * n_head + h) * T, T, C, head_dim,
          1.0f / std::sqrt(static_cast<float>(head_dim))};
}

// Merges one row of scores s[0, n) (the first `valid` unmasked) into the running max m and sum
// l, and overwrites s with the block's probabilities relative to the new max (masked ones 0).
// Returns the factor the row's previous output is rescaled by.
MOE_CPU_CLONES float online_softmax_row(float* s, int valid, int n, float& m, float& l) {
  if (valid <= 0) {
    std::fill(s, s + n, 0.0f);
    return 1.0f;
  }
  float mx[kLanes];
  std::fill(mx, mx + kLanes, -INFINITY);
  int j = 0;
  for (; j + kLanes <= valid; j += kLanes)
    for (int i = 0; i < kLanes; ++i) mx[i] = s[j + i] > mx[i] ? s[j + i] : mx[i];
  float row_max = m;
  for (int i = 0; i < kLanes; ++i) row_max = mx[i] > row_max ? mx[i] : row_max;
  for (; j < valid; ++j) row_max = s[j] > row_max ? s[j] : row_max;
  for (j = 0; j < valid; ++j) s[j] = math::exp_poly(s[j] - row_max);
  float sum[kLanes] = {};
  for (j = 0; j + kLanes <= valid; j += kLanes)
    for (int i = 0; i < kLanes; ++i) sum[i] += s[j + i];
  float total = 0.0f;
  for (; j < valid; ++j) total += s[j];
  for (int i = 0; i < kLanes; ++i) total += sum[i];
  std::fill(s + valid, s + n, 0.0f);
  const float corr = math::online_softmax_rescale(m, row_max);
  l = l * corr + total;
  m = row_max;
  return corr;
}

// Backward's row: p = exp(s - lse) into s, dscore into dp (both 0 past `valid`).
MOE_CPU_CLONES void dscore_row(float* s, float* dp, int valid, int n, float lse, float D,
                               float scale) {
  for (int j = 0; j < valid; ++j) {
    const float p = math::exp_poly(s[j] - lse);
    s[j] = p;
    dp[j] = math::attention_dscore(p, dp[j], D, scale);
  }
  std::fill(s + std::max(valid, 0), s + n, 0.0f);
  std::fill(dp + std::max(valid, 0), dp + n, 0.0f);
}

// The tile products run in fp32 whatever --precision says (sgemm): the scores and the softmax stay
// fp32 (DESIGN.md, Numbers), as in the CUDA kernel.

// Unmasked keys of row t within the key block starting at s0 (clamped to [0, nk]).
int valid_keys(int t, int s0, int nk) { return std::clamp(t - s0 + 1, 0, nk); }

// Forward of the query rows [t0, t0 + nq) of one head.
void forward_query_block(float* out, float* lse, float* out_copy, const float* q, const float* k,
                         const float* v, const HeadView& g, int t0, int nq) {
  float S[kBlock * kBlock], m[kBlock], l[kBlock];
  std::fill(m, m + nq, -INFINITY);
  std::fill(l, l + nq, 0.0f);
  float* O = out + g.off + static_cast<size_t>(t0) * g.C;
  for (int i = 0; i < nq; ++i) std::fill(O + static_cast<size_t>(i) * g.C, O + static_cast<size_t>(i) * g.C + g.hd, 0.0f);
  const float* Q = q + g.off + static_cast<size_t>(t0) * g.C;
  for (int s0 = 0; s0 < t0 + nq; s0 += kBlock) {
    const int nk = std::min(kBlock, t0 + nq - s0);  // keys past the block's last query: masked
    const size_t ks = g.off + static_cast<size_t>(s0) * g.C;
    sgemm(false, true, nq, nk, g.hd, g.scale, Q, g.C, k + ks, g.C, 0.0f, S, kBlock);
    for (int i = 0; i < nq; ++i) {
      const float corr = online_softmax_row(S + i * kBlock, valid_keys(t0 + i, s0, nk), nk, m[i], l[i]);
      if (corr != 1.0f)
        for (float *o = O + static_cast<size_t>(i) * g.C, *e = o + g.hd; o < e; ++o) *o *= corr;
    }
    sgemm(false, false, nq, g.hd, nk, 1.0f, S, kBlock, v + ks, g.C, 1.0f, O, g.C);
  }
  for (int i = 0; i < nq; ++i) {
    const float inv = 1.0f / l[i];
    float* o = O + static_cast<size_t>(i) * g.C;
    float* c = out_copy + g.off + static_cast<size_t>(t0 + i) * g.C;
    for (int j = 0; j < g.hd; ++j) c[j] = o[j] = o[j] * inv;
    lse[g.row_off + t0 + i] = m[i] + std::log(l[i]);
  }
}

// Backward of the query rows [t0, t0 + nq) of one head: its dq rows and every dk, dv row s < t0+nq.
void backward_query_block(float* dq, float* dk, float* dv, const float* dout, const float* q,
                          const float* k, const float* v, const float* lse, const float* out,
                          const HeadView& g, int t0, int nq) {
  float S[kBlock * kBlock], dP[kBlock * kBlock], D[kBlock];
  const size_t qs = g.off + static_cast<size_t>(t0) * g.C;
  for (int i = 0; i < nq; ++i) {
    const size_t r = qs + static_cast<size_t>(i) * g.C;
    D[i] = math::row_dot(dout + r, out + r, g.hd);
  }
  for (int s0 = 0; s0 < t0 + nq; s0 += kBlock) {
    const int nk = std::min(kBlock, t0 + nq - s0);
    const size_t ks = g.off + static_cast<size_t>(s0) * g.C;
    sgemm(false, true, nq, nk, g.hd, g.scale, q + qs, g.C, k + ks, g.C, 0.0f, S, kBlock);
    sgemm(false, true, nq, nk, g.hd, 1.0f, dout + qs, g.C, v + ks, g.C, 0.0f, dP, kBlock);
    for (int i = 0; i < nq; ++i)
      dscore_row(S + i * kBlock, dP + i * kBlock, valid_keys(t0 + i, s0, nk), nk,
                 lse[g.row_off + t0 + i], D[i], g.scale);
    sgemm(true, false, nk, g.hd, nq, 1.0f, S, kBlock, dout + qs, g.C, 1.0f, dv + ks, g.C);
    sgemm(false, false, nq, g.hd, nk, 1.0f, dP, kBlock, k + ks, g.C, 1.0f, dq + qs, g.C);
    sgemm(true, false, nk, g.hd, nq, 1.0f, dP, kBlock, q + qs, g.C, 1.0f, dk + ks, g.C);
  }
}

void check_sizes(const char* who, int B, int T, int n_head, int head_dim) {
  MOE_CHECK(B >= 0 && T >= 0 && n_head > 0 && head_dim > 0, who, ": B=", B, " T=", T,
            " n_head=", n_head, " head_dim=", head_dim);
}

}  // namespace

size_t attention_saved_floats(int B, int T, int n_head, int head_dim) {
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  return rows + rows * head_dim;
}

size_t attention_scratch_floats(int /*T*/) { return 0; }

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim) {
  MOE_CUDA_DISPATCH(attention_forward, out, att, q, k, v, B, T, n_head, head_dim);
  check_sizes("attention_forward", B, T, n_head, head_dim);
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < n_head; ++h) {
      const HeadView g = head_view(b, h, T, n_head, head_dim);
      for (int t0 = 0; t0 < T; t0 += kBlock)
        forward_query_block(out, att, att + rows, q, k, v, g, t0, std::min(kBlock, T - t0));
    }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch) {
  MOE_CUDA_DISPATCH(attention_backward, dq, dk, dv, dout, q, k, v, att, B, T, n_head, head_dim,
                    scratch);
  check_sizes("attention_backward", B, T, n_head, head_dim);
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < n_head; ++h) {
      const HeadView g = head_view(b, h, T, n_head, head_dim);
      for (int t0 = 0; t0 < T; t0 += kBlock)
        backward_query_block(dq, dk, dv, dout, q, k, v, att, att + rows, g, t0,
                             std::min(kBlock, T - t0));
    }
}

}  // namespace moe::kernels
