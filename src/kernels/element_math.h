// The per-element math of every kernel, written once as inline functions that compile for the
// host and (under nvcc) for the device. The CPU loops in kernels/*.cpp and the CUDA kernels in
// kernels/cuda/*.cu both call these, so every CPU CI run tests the math the GPU runs; only indexing
// and launch code are GPU-only. Serial row functions (softmax_row, topk_row, row_dot) are used by
// one thread per row on the GPU, where rows are short (router: E experts).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOE_HD __host__ __device__ __forceinline__
#else
#define MOE_HD inline
#endif

namespace moe::kernels::math {

// ---- SwiGLU: h = silu(g)·u, silu(z) = z·sigmoid(z) ----
MOE_HD float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
MOE_HD float swiglu(float g, float u) { return g * sigmoid(g) * u; }
// dg += dh·u·silu'(g), du += dh·silu(g), silu'(z) = s·(1 + z·(1 - s))
MOE_HD void swiglu_backward(float& dg, float& du, float dh, float g, float u) {
  const float s = sigmoid(g);
  dg += dh * u * (s * (1.0f + g * (1.0f - s)));
  du += dh * (g * s);
}

// ---- RoPE: rotate the pair (a, b) = (x_i, x_{i+d/2}) by the angle whose cos/sin are c, s ----
// (backward rotates by the opposite angle: pass -s)
MOE_HD void rope_rotate(float& a, float& b, float c, float s) {
  const float x1 = a, x2 = b;
  a = x1 * c - x2 * s;
  b = x2 * c + x1 * s;
}

// ---- RMSNorm: out_j = x_j·r·w_j, r = (mean(x²) + eps)^(-1/2) ----
MOE_HD float rmsnorm_rstd(double sum_squares, int dim, float eps) {
  return static_cast<float>(1.0 / sqrt(sum_squares / dim + static_cast<double>(eps)));
}
MOE_HD float rmsnorm_out(float x, float rstd, float w) { return x * rstd * w; }
// dx_j = r·w_j·dout_j - c·x_j with c = r³·(Σ_i dout_i·w_i·x_i)/dim (dot in double)
MOE_HD float rmsnorm_backward_coeff(double dot, float rstd, int dim) {
  return static_cast<float>(dot * rstd * rstd * rstd / dim);
}
MOE_HD float rmsnorm_dx(float x, float dout, float w, float rstd, float coeff) {
  return rstd * w * dout - coeff * x;
}

// ---- AdamW, torch.optim.AdamW's float32 operation order (scalars from adamw_scalars) ----
struct AdamWScalars {
  float decay;      // 1 - lr·wd
  float w1;         // 1 - beta1 (the lerp weight)
  float beta2, w2;  // beta2, 1 - beta2
  float bc2_sqrt;   // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};
MOE_HD void adamw_element(float& p, float g, float& m, float& v, const AdamWScalars& s,
                          float grad_scale) {
  const float gi = g * grad_scale;
  const float pi = p * s.decay;
  // torch's lerp: weight < 0.5 ? m + w·(g - m) : g - (g - m)·(1 - w)
  const float mi = s.w1 < 0.5f ? m + s.w1 * (gi - m) : gi - (gi - m) * (1.0f - s.w1);
  const float vi = v * s.beta2 + s.w2 * gi * gi;
  const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
  p = pi + s.neg_step_size * mi / denom;
  m = mi;
  v = vi;
}

// ---- Softmax over a row (max subtracted, sum in double): the router's scores and the loss ----
// p[j] = exp(x[j] - max) / Σ exp(x - max); returns log Σ exp(x - max) + max = logsumexp(x).
// p may equal x (in place).
MOE_HD double softmax_row(float* p, const float* x, int n) {
  float mx = x[0];
  for (int j = 1; j < n; ++j) mx = x[j] > mx ? x[j] : mx;
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    p[j] = expf(x[j] - mx);
    sum += p[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < n; ++j) p[j] *= inv;
  return log(sum) + static_cast<double>(mx);
}
// Cross-entropy gradient element: d += scale·(p - [j == target]) with one rounding at the target.
MOE_HD float cross_entropy_grad(float d, float p, bool is_target, float scale) {
  return is_target ? d + scale * (p - 1.0f) : d + scale * p;
}

// ---- Group-limited selection (DeepSeek-V2 group_limited_greedy, DeepSeek-V3 noaux_tc with
// n_group > 1): the E experts form n_group groups of G = E / n_group consecutive experts; a token
// keeps its topk_group best groups and chooses its k experts among theirs only (the others are
// out of the selection, as DeepSeek-V3's inference code masks them with -inf). A group's score is
// the max of its selection values (V2), or the sum of its two largest (V3: top2_sum, G >= 2).
// Groups rank as topk_row ranks experts: higher score first, ties to the lower group. ----
struct GroupLimit {
  int n_group = 1;  // 1 = no limit
  int topk_group = 1;
  bool top2_sum = false;
  MOE_HD bool active() const { return n_group > 1; }
};
MOE_HD float selection_value(const float* s, const float* bias, int e) {
  return bias ? s[e] + bias[e] : s[e];
}
MOE_HD float group_score(const float* s, const float* bias, int begin, int G, bool top2_sum) {
  float first = selection_value(s, bias, begin), second = -INFINITY;
  for (int e = begin + 1; e < begin + G; ++e) {
    const float v = selection_value(s, bias, e);
    if (v > first) {
      second = first;
      first = v;
    } else if (v > second) {
      second = v;
    }
  }
  return top2_sum ? first + second : first;
}
// Whether group g is among the topk_group best: fewer than topk_group groups rank before it.
// Recomputes the other groups' scores (O(E) per call) so that a GPU thread needs no per-group
// array whatever n_group is.
MOE_HD bool group_kept(const float* s, const float* bias, int E, const GroupLimit& gl, int g) {
  const int G = E / gl.n_group;
  const float mine = group_score(s, bias, g * G, G, gl.top2_sum);
  int ahead = 0;
  for (int h = 0; h < gl.n_group && ahead < gl.topk_group; ++h) {
    if (h == g) continue;
    const float other = group_score(s, bias, h * G, G, gl.top2_sum);
    if (other > mine || (other == mine && h < g)) ++ahead;
  }
  return ahead < gl.topk_group;
}

// ---- Top-k of a row: the k largest of s[0..E) in descending order; ties go to the lower index
// (an entry only displaces strictly smaller ones, and lower indices are seen first). O(E·k). ----
// bias (nullable, [E]): select on s[e] + bias[e] instead (DeepSeek-V3's e_score_correction_bias);
// val then holds the biased values. groups: only the experts of the kept groups compete (needs
// topk_group · E / n_group >= k, which the config checks, so that k experts remain).
MOE_HD void topk_row(int32_t* idx, float* val, const float* s, int E, int k,
                     const float* bias = nullptr, const GroupLimit& groups = GroupLimit{}) {
  const int G = groups.active() ? E / groups.n_group : E;
  bool kept = true;
  int n = 0;
  for (int e = 0; e < E; ++e) {
    if (groups.active() && e % G == 0) kept = group_kept(s, bias, E, groups, e / G);
    if (!kept) continue;
    const float v = selection_value(s, bias, e);
    if (n == k && !(v > val[k - 1])) continue;
    int pos = n < k ? n : k - 1;  // the slot freed for v (the last one is dropped when full)
    while (pos > 0 && v > val[pos - 1]) {
      val[pos] = val[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    val[pos] = v;
    idx[pos] = e;
    if (n < k) ++n;
  }
}

// ---- The router of one token (HF MoEGate) ----
// softmax (DeepSeek V1/V2): s = softmax(logits), top-k of s, w = the k scores.
// sigmoid (DeepSeek-V3, topk_method noaux_tc): s = sigmoid(logits), top-k of s + bias (the bias
// picks the experts and nothing else), w = the k unbiased scores.
// Then, both: w_j /= (sum_i w_i + 1e-20) if renorm, and w_j *= scale (routed_scaling_factor, or
// 1 for renormalised softmax weights: the router decides, as HF DeepSeek-V2/V3 do). groups limits
// the choice (GroupLimit above) and changes nothing else: the weights are the chosen experts'
// scores either way.
constexpr float kRouterNormEps = 1e-20f;
struct RouterScoring {
  bool sigmoid = false;
  const float* bias_E = nullptr;  // [E] on the kernel's device; sigmoid only; null = no bias
  float scale = 1.0f;
  GroupLimit groups;  // n_group 1 = every expert competes
};
MOE_HD void router_row_forward(float* s, int32_t* idx, float* w, int E, int k, bool renorm,
                               const RouterScoring& sc = RouterScoring{}) {
  if (sc.sigmoid) {
    for (int e = 0; e < E; ++e) s[e] = sigmoid(s[e]);
    topk_row(idx, w, s, E, k, sc.bias_E, sc.groups);
    for (int j = 0; j < k; ++j) w[j] = s[idx[j]];
  } else {
    softmax_row(s, s, E);
    topk_row(idx, w, s, E, k, nullptr, sc.groups);
  }
  if (renorm) {
    float denom = kRouterNormEps;
    for (int j = 0; j < k; ++j) denom += w[j];
    for (int j = 0; j < k; ++j) w[j] /= denom;
  }
  if (sc.scale != 1.0f)
    for (int j = 0; j < k; ++j) w[j] *= sc.scale;
}
// The score the aux loss averages: s_e itself (softmax), or s_e / sum_i s_i (sigmoid: DeepSeek-V3's
// s'_e, the scores normalised over all E experts). row_sum is that sum, in float, e ascending.
MOE_HD float row_sum(const float* s, int E) {
  float z = 0.0f;
  for (int e = 0; e < E; ++e) z += s[e];
  return z;
}
// Its backward: ds [E] zero on entry, d logits on exit. dw: dLoss/d(top-k weights) [k];
// aux_c [E] (nullable): the aux loss's constant factors for this token's sequence, scaled by
// aux_scale = aux_grad·alpha/T. The bias has no gradient (it only chose idx).
MOE_HD void router_row_backward(float* ds, const float* s, const int32_t* idx, const float* dw,
                                int E, int k, bool renorm, const float* aux_c, float aux_scale,
                                const RouterScoring& sc = RouterScoring{}) {
  const float scale = sc.scale;  // w = scale · w0: d w0 = scale · dw
  if (renorm) {
    // w_j = s_j / D, D = sum_i s_i + eps:  ds_j = (dw_j - sum_i dw_i · w_i) / D
    float denom = kRouterNormEps;
    for (int j = 0; j < k; ++j) denom += s[idx[j]];
    float dot = 0.0f;
    for (int j = 0; j < k; ++j) dot += (scale * dw[j]) * (s[idx[j]] / denom);
    for (int j = 0; j < k; ++j) ds[idx[j]] += (scale * dw[j] - dot) / denom;
  } else {
    // top-k: gradient to selected scores only
    for (int j = 0; j < k; ++j) ds[idx[j]] += scale * dw[j];
  }
  if (sc.sigmoid) {
    if (aux_c) {
      // s'_e = s_e / Z:  ds_e += a · (c_e - sum_i c_i · s'_i) / Z
      const float z = row_sum(s, E);
      float dot = 0.0f;
      for (int e = 0; e < E; ++e) dot += aux_c[e] * (s[e] / z);
      for (int e = 0; e < E; ++e) ds[e] += aux_scale * ((aux_c[e] - dot) / z);
    }
    // sigmoid: dlogit_e = ds_e · s_e · (1 - s_e)
    for (int e = 0; e < E; ++e) ds[e] = ds[e] * (s[e] * (1.0f - s[e]));
    return;
  }
  if (aux_c)
    for (int e = 0; e < E; ++e) ds[e] += aux_scale * aux_c[e];
  // softmax: dlogit_e = s_e · (ds_e - sum_i ds_i · s_i)
  float dot = 0.0f;
  for (int e = 0; e < E; ++e) dot += ds[e] * s[e];
  for (int e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - dot);
}

// ---- exp without a library call: Cephes' expf (x = n·ln2 + r, |r| <= ln2/2, a degree-5 polynomial
// for e^r, then the exponent bits), branch-free so that a CPU loop over a row of scores vectorises
// (std::exp does not). Relative error below 2.5e-7 on [-87, 88] (tests: ExpPoly); x is clamped
// there, so x < -87 gives e^-87 = 1.6e-38 rather than 0 (masked entries are zeroed explicitly). ----
MOE_HD float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float kRound = 12582912.0f;  // 1.5·2^23: (y + kRound) - kRound rounds y to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts (Cody-Waite)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
#if defined(__CUDA_ARCH__)
  return p * __int_as_float(bits);
#else
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
#endif
}

// ---- Flash attention's softmax pieces (CPU kernels/attention.cpp and CUDA cuda/attention.cu):
// probabilities p = exp_poly(score - shift) with shift the running row max (forward, online) or
// the row log-sum-exp (backward, recomputed). Merging a block into a row's running max m and sum
// l: m' = max(m, block max), and the old sum and output are multiplied by this factor (0 while no
// key has been seen: m = -inf). ----
MOE_HD float online_softmax_rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : exp_poly(m_old - m_new);
}
// dscore = scale · p · (dP - D), dP = dout_t · v_s, D = dout_t · out_t (softmax backward, row form)
MOE_HD float attention_dscore(float p, float dp, float D, float scale) {
  return scale * p * (dp - D);
}

// ---- Fixed-order dot product with 8 partial sums (vectorisable on the CPU, and the same result
// every run and on every device that follows this order) ----
MOE_HD float row_dot(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace moe::kernels::math
