// The MoE router (HF MoEGate semantics). See router.h.
// Legend: T tokens, H hidden, E experts, k slots per token, B sequences of S = T/B tokens.
#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "kernels/element_math.h"
#include "kernels/gemm.h"

namespace moe::mixture {
namespace {

constexpr float kNormEps = 1e-20f;  // HF: denominator = sum(topk_weight) + 1e-20

bool renormalises(const RouterConfig& cfg) { return cfg.top_k > 1 && cfg.norm_topk_prob; }

void check_config(const RouterConfig& cfg, int T, int H) {
  MOE_CHECK(cfg.num_experts > 0, "router: num_experts must be > 0, got ", cfg.num_experts);
  MOE_CHECK(cfg.top_k >= 1 && cfg.top_k <= cfg.num_experts, "router: top_k=", cfg.top_k,
            " must be in [1, num_experts=", cfg.num_experts, "]");
  MOE_CHECK(T >= 0 && H > 0, "router: bad sizes T=", T, " H=", H);
  MOE_CHECK(cfg.aux_loss_alpha >= 0.0f, "router: aux_loss_alpha must be >= 0, got ",
            cfg.aux_loss_alpha);
}


template <class B>
void ensure(B& buf, size_t n, MemTracker* tracker) {
  if (buf.size() != n) buf.resize(n, tracker);
}

}  // namespace

void router_forward(Routing& r, const float* x_TH, const float* gate_EH, int T, int H,
                    const RouterConfig& cfg, int num_seqs, MemTracker* tracker) {
  check_config(cfg, T, H);
  const int E = cfg.num_experts, k = cfg.top_k;
  const bool aux = cfg.aux_loss_alpha > 0.0f;
  const int B = !aux ? 0 : cfg.seq_aux ? num_seqs : 1;
  if (aux && cfg.seq_aux) {
    MOE_CHECK(num_seqs > 0 && T % num_seqs == 0, "router: seq_aux needs T=", T,
              " to split into num_seqs=", num_seqs, " equal sequences");
  }
  r.T = T;
  r.E = E;
  r.k = k;
  r.num_aux_seqs = B;
  r.aux_loss = 0.0;
  ensure(r.scores_TE, static_cast<size_t>(T) * E, tracker);
  ensure(r.topk_idx_TK, static_cast<size_t>(T) * k, tracker);
  ensure(r.topk_weight_TK, static_cast<size_t>(T) * k, tracker);
  ensure(r.aux_coef_BE, static_cast<size_t>(B) * E, tracker);
  if (T == 0) return;

  // logits[T,E] = x · W_gate^T, then softmax in place: scores.
  float* scores = r.scores_TE.data();
  kernels::linear_forward(scores, x_TH, gate_EH, T, H, E);
  for (int t = 0; t < T; ++t) {
    float* s = scores + static_cast<size_t>(t) * E;
    kernels::math::softmax_row(s, s, E);  // the loss's softmax row: max-subtracted, sum in double
    int32_t* idx = r.topk_idx_TK.data() + static_cast<size_t>(t) * k;
    float* w = r.topk_weight_TK.data() + static_cast<size_t>(t) * k;
    kernels::math::topk_row(idx, w, s, E, k);
    if (renormalises(cfg)) {
      float denom = kNormEps;
      for (int j = 0; j < k; ++j) denom += w[j];
      for (int j = 0; j < k; ++j) w[j] /= denom;
    }
  }

  if (!aux) return;
  // c[b,e] = count(b,e) · E / (S·k); aux = alpha / B · sum_b sum_e c[b,e] · mean_{t in b} s[t,e].
  const int S = T / B;
  float* coef = r.aux_coef_BE.data();
  std::vector<double> mean_score(E);
  double total = 0.0;
  if (!cfg.seq_aux && cfg.reduce_stats) {
    // Global batch: counts and score sums summed over the data-parallel ranks, in double.
    std::vector<double> stats(2 * E + 1, 0.0);
    for (int t = 0; t < T; ++t) {
      const int32_t* idx = r.topk_idx_TK.data() + static_cast<size_t>(t) * k;
      for (int j = 0; j < k; ++j) stats[idx[j]] += 1.0;
      const float* s = scores + static_cast<size_t>(t) * E;
      for (int e = 0; e < E; ++e) stats[E + e] += s[e];
    }
    stats[2 * E] = T;
    cfg.reduce_stats(stats);
    const double Tg = stats[2 * E];
    const float scale = static_cast<float>(E) / (static_cast<float>(Tg) * k);
    for (int e = 0; e < E; ++e) {
      coef[e] = static_cast<float>(stats[e]) * scale;
      total += static_cast<double>(coef[e]) * (stats[E + e] / Tg);
    }
    r.aux_loss = cfg.aux_loss_alpha * total;
    return;
  }
  for (int b = 0; b < B; ++b) {
    float* c = coef + static_cast<size_t>(b) * E;
    for (int e = 0; e < E; ++e) c[e] = 0.0f;
    std::fill(mean_score.begin(), mean_score.end(), 0.0);
    for (int t = b * S; t < (b + 1) * S; ++t) {
      const int32_t* idx = r.topk_idx_TK.data() + static_cast<size_t>(t) * k;
      for (int j = 0; j < k; ++j) c[idx[j]] += 1.0f;
      const float* s = scores + static_cast<size_t>(t) * E;
      for (int e = 0; e < E; ++e) mean_score[e] += s[e];
    }
    const float scale = static_cast<float>(E) / (static_cast<float>(S) * k);
    double sum_b = 0.0;
    for (int e = 0; e < E; ++e) {
      c[e] *= scale;
      sum_b += static_cast<double>(c[e]) * (mean_score[e] / S);
    }
    total += sum_b;
  }
  r.aux_loss = cfg.aux_loss_alpha * total / B;
}

void router_backward(float* dx_TH, float* dgate_EH, const float* dtopk_weight_TK, float aux_grad,
                     const Routing& r, const float* x_TH, const float* gate_EH, int H,
                     const RouterConfig& cfg) {
  const int T = r.T, E = r.E, k = r.k;
  MOE_CHECK(E == cfg.num_experts && k == cfg.top_k, "router_backward: routing was built for E=",
            E, " k=", k, " but config has E=", cfg.num_experts, " k=", cfg.top_k);
  if (T == 0 || (!dx_TH && !dgate_EH)) return;
  const float* scores = r.scores_TE.data();
  // dlogits[T,E]: built up as d scores, then turned into d logits row by row.
  std::vector<float> dlogits(static_cast<size_t>(T) * E, 0.0f);
  const bool aux = r.num_aux_seqs > 0 && aux_grad != 0.0f;
  const int S = r.num_aux_seqs > 0 ? T / r.num_aux_seqs : T;
  const float aux_scale = aux ? aux_grad * cfg.aux_loss_alpha / static_cast<float>(T) : 0.0f;

  for (int t = 0; t < T; ++t) {
    const float* s = scores + static_cast<size_t>(t) * E;
    float* ds = dlogits.data() + static_cast<size_t>(t) * E;
    const int32_t* idx = r.topk_idx_TK.data() + static_cast<size_t>(t) * k;
    const float* dw = dtopk_weight_TK + static_cast<size_t>(t) * k;
    if (renormalises(cfg)) {
      // w_j = s_j / D, D = sum_i s_i + eps:  ds_j = (dw_j - sum_i dw_i · w_i) / D
      float denom = kNormEps;
      for (int j = 0; j < k; ++j) denom += s[idx[j]];
      float dot = 0.0f;
      for (int j = 0; j < k; ++j) dot += dw[j] * (s[idx[j]] / denom);
      for (int j = 0; j < k; ++j) ds[idx[j]] += (dw[j] - dot) / denom;
    } else {
      for (int j = 0; j < k; ++j) ds[idx[j]] += dw[j];  // top-k: gradient to selected scores only
    }
    if (aux) {
      const float* c = r.aux_coef_BE.data() + static_cast<size_t>(t / S) * E;
      for (int e = 0; e < E; ++e) ds[e] += aux_scale * c[e];
    }
    // softmax: dlogit_e = s_e · (ds_e - sum_i ds_i · s_i)
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += ds[e] * s[e];
    for (int e = 0; e < E; ++e) ds[e] = s[e] * (ds[e] - dot);
  }
  // gate linear: dx += dlogits · W_gate ; dW_gate += dlogits^T · x
  kernels::linear_backward(dx_TH, dgate_EH, dlogits.data(), x_TH, gate_EH, T, H, E);
}

}  // namespace moe::mixture
