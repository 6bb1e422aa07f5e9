// Causal multi-head attention on [B, T, n_head·head_dim] buffers, one (b, h) pair at a time with
// BLAS on strided views (row stride C = n_head·head_dim), so no transposes are materialised.
// The full T×T score product is computed and the upper triangle masked; the masked half is wasted
// flops but keeps every product a single GEMM. See attention.h.
#include "kernels/attention.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"

namespace moe::kernels {

size_t attention_saved_floats(int B, int T, int n_head, int head_dim) {
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  if (cuda_active()) return rows + rows * head_dim;
  return rows * T;
}

size_t attention_scratch_floats(int T) {
  return cuda_active() ? 0 : static_cast<size_t>(T) * T;
}

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim) {
  MOE_CUDA_DISPATCH(attention_forward, out, att, q, k, v, B, T, n_head, head_dim);
  MOE_CHECK(B >= 0 && T >= 0 && n_head > 0 && head_dim > 0, "attention_forward: B=", B, " T=", T,
            " n_head=", n_head, " head_dim=", head_dim);
  const int C = n_head * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_head; ++h) {
      size_t off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * head_dim;
      float* a = att + (static_cast<size_t>(b) * n_head + h) * T * T;  // [T,T]
      // scores = scale · q k^T
      gemm(false, true, T, T, head_dim, scale, q + off, C, k + off, C, 0.0f, a, T);
      // masked softmax per row: entries s > t are exactly 0
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<size_t>(t) * T;
        float mx = row[0];
        for (int s = 1; s <= t; ++s) mx = row[s] > mx ? row[s] : mx;
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) {
          row[s] = std::exp(row[s] - mx);
          sum += row[s];
        }
        float inv = static_cast<float>(1.0 / sum);
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      // out = att · v
      gemm(false, false, T, head_dim, T, 1.0f, a, T, v + off, C, 0.0f, out + off, C);
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch) {
  MOE_CUDA_DISPATCH(attention_backward, dq, dk, dv, dout, q, k, v, att, B, T, n_head, head_dim,
                    scratch);
  MOE_CHECK(B >= 0 && T >= 0 && n_head > 0 && head_dim > 0, "attention_backward: B=", B, " T=", T,
            " n_head=", n_head, " head_dim=", head_dim);
  MOE_CHECK(scratch != nullptr || T == 0, "attention_backward: scratch (T·T floats) is null");
  const int C = n_head * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < n_head; ++h) {
      size_t off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * head_dim;
      const float* a = att + (static_cast<size_t>(b) * n_head + h) * T * T;
      float* ds = scratch;  // [T,T]: datt, then dscores in place
      // dv += att^T · dout
      gemm(true, false, T, head_dim, T, 1.0f, a, T, dout + off, C, 1.0f, dv + off, C);
      // datt = dout · v^T
      gemm(false, true, T, T, head_dim, 1.0f, dout + off, C, v + off, C, 0.0f, ds, T);
      // dscores = scale · att ⊙ (datt - Σ_s att·datt), masked entries 0
      for (int t = 0; t < T; ++t) {
        const float* ar = a + static_cast<size_t>(t) * T;
        float* dr = ds + static_cast<size_t>(t) * T;
        double dot = 0.0;
        for (int s = 0; s <= t; ++s) dot += static_cast<double>(ar[s]) * dr[s];
        float d = static_cast<float>(dot);
        for (int s = 0; s <= t; ++s) dr[s] = scale * ar[s] * (dr[s] - d);
        for (int s = t + 1; s < T; ++s) dr[s] = 0.0f;
      }
      // dq += dscores · k ; dk += dscores^T · q
      gemm(false, false, T, head_dim, T, 1.0f, ds, T, k + off, C, 1.0f, dq + off, C);
      gemm(true, false, T, head_dim, T, 1.0f, ds, T, q + off, C, 1.0f, dk + off, C);
    }
  }
}

}  // namespace moe::kernels
