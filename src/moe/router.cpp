// The MoE router (HF MoEGate semantics). See router.h.
// Legend: T tokens, H hidden, E experts, k slots per token, B sequences of S = T/B tokens.
#include "moe/router.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"
#include "kernels/router_ops.h"

namespace moe::mixture {
namespace {

bool renormalises(const RouterConfig& cfg) { return cfg.top_k > 1 && cfg.norm_topk_prob; }

// The row kernels' scoring options. routed_scaling_factor as HF DeepSeek-V3 (sigmoid: always) and
// V2 (softmax: only weights that are not renormalised; V1 configs have no factor, i.e. 1.0).
kernels::math::RouterScoring scoring(const RouterConfig& cfg) {
  kernels::math::RouterScoring s;
  s.sigmoid = cfg.sigmoid;
  s.bias_E = cfg.sigmoid ? cfg.score_bias_E : nullptr;
  s.scale = cfg.sigmoid || !renormalises(cfg) ? cfg.routed_scaling_factor : 1.0f;
  s.groups = {cfg.n_group, cfg.topk_group, /*top2_sum=*/cfg.sigmoid};
  return s;
}

// The group limit must leave k experts to choose from; sigmoid's group score needs two per group.
void check_groups(const RouterConfig& cfg) {
  const int E = cfg.num_experts, n = cfg.n_group, g = cfg.topk_group;
  MOE_CHECK(n >= 1 && E % n == 0, "router: n_group=", n, " must divide num_experts=", E);
  MOE_CHECK(g >= 1 && g <= n, "router: topk_group=", g, " must be in [1, n_group=", n, "]");
  MOE_CHECK(n == 1 || static_cast<long long>(g) * (E / n) >= cfg.top_k, "router: topk_group=", g,
            " groups of ", E / n, " experts cannot hold top_k=", cfg.top_k);
  MOE_CHECK(n == 1 || !cfg.sigmoid || E / n >= 2, "router: sigmoid group scores sum the top 2 of ",
            "a group, but n_group=", n, " leaves ", E / n, " expert per group");
}

void check_config(const RouterConfig& cfg, int T, int H) {
  MOE_CHECK(cfg.num_experts > 0, "router: num_experts must be > 0, got ", cfg.num_experts);
  MOE_CHECK(cfg.top_k >= 1 && cfg.top_k <= cfg.num_experts, "router: top_k=", cfg.top_k,
            " must be in [1, num_experts=", cfg.num_experts, "]");
  MOE_CHECK(T >= 0 && H > 0, "router: bad sizes T=", T, " H=", H);
  MOE_CHECK(cfg.aux_loss_alpha >= 0.0f, "router: aux_loss_alpha must be >= 0, got ",
            cfg.aux_loss_alpha);
  MOE_CHECK(!cfg.score_bias_E || cfg.sigmoid,
            "router: a selection bias (e_score_correction_bias) needs sigmoid scoring");
  check_groups(cfg);
}


using kernels::ensure_buffer;

}  // namespace

void router_forward(Routing& r, const float* x_TH, const float* gate_EH, int T, int H,
                    const RouterConfig& cfg, int num_seqs, MemTracker* tracker) {
  check_config(cfg, T, H);
  const int E = cfg.num_experts, k = cfg.top_k;
  const bool aux = cfg.aux_loss_alpha > 0.0f;
  const int B = !aux ? 0 : (cfg.seq_aux ? num_seqs : 1);
  if (aux && cfg.seq_aux) {
    MOE_CHECK(num_seqs > 0 && T % num_seqs == 0, "router: seq_aux needs T=", T,
              " to split into num_seqs=", num_seqs, " equal sequences");
  }
  r.T = T;
  r.E = E;
  r.k = k;
  r.num_aux_seqs = B;
  r.aux_loss = 0.0;
  ensure_buffer(r.scores_TE, static_cast<size_t>(T) * E, tracker);
  ensure_buffer(r.topk_idx_TK, static_cast<size_t>(T) * k, tracker);
  ensure_buffer(r.topk_weight_TK, static_cast<size_t>(T) * k, tracker);
  ensure_buffer(r.aux_coef_BE, static_cast<size_t>(B) * E, tracker);
  if (T == 0) return;

  // logits[T,E] = x · W_gate^T, then softmax (or sigmoid) in place: scores.
  float* scores = r.scores_TE.data();
  kernels::linear_forward(scores, x_TH, gate_EH, T, H, E);
  kernels::router_topk(scores, r.topk_idx_TK.data(), r.topk_weight_TK.data(), T, E, k,
                       renormalises(cfg), scoring(cfg));

  if (!aux) return;
  // c[b,e] = count(b,e) · E / (S·k); aux = alpha / B · sum_b sum_e c[b,e] · mean_{t in b} s[t,e].
  // The counts and score sums come to the host (a small [B,E] copy on a GPU); c goes back to the
  // routing's device for backward.
  const int S = T / B;
  std::vector<double> count(static_cast<size_t>(B) * E), score_sum(static_cast<size_t>(B) * E);
  kernels::router_aux_stats(count.data(), score_sum.data(), r.topk_idx_TK.data(), scores, T, E, k,
                            B, /*normalise=*/cfg.sigmoid);
  std::vector<float> coef(static_cast<size_t>(B) * E);
  double total = 0.0;
  if (!cfg.seq_aux && cfg.reduce_stats) {
    // Global batch: counts and score sums summed over the data-parallel ranks, in double.
    std::vector<double> stats(2 * E + 1, 0.0);
    for (int e = 0; e < E; ++e) {
      stats[e] = count[e];
      stats[E + e] = score_sum[e];
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
  } else {
    const float scale = static_cast<float>(E) / (static_cast<float>(S) * k);
    for (int b = 0; b < B; ++b) {
      double sum_b = 0.0;
      for (int e = 0; e < E; ++e) {
        const size_t i = static_cast<size_t>(b) * E + e;
        coef[i] = static_cast<float>(count[i]) * scale;
        sum_b += static_cast<double>(coef[i]) * (score_sum[i] / S);
      }
      total += sum_b;
    }
    r.aux_loss = cfg.aux_loss_alpha * total / B;
  }
  device_copy(r.aux_coef_BE.device(), r.aux_coef_BE.data(), Device::kCpu, coef.data(),
              coef.size() * sizeof(float));
}

void router_backward(float* dx_TH, float* dgate_EH, const float* dtopk_weight_TK, float aux_grad,
                     const Routing& r, const float* x_TH, const float* gate_EH, int H,
                     const RouterConfig& cfg) {
  const int T = r.T, E = r.E, k = r.k;
  MOE_CHECK(E == cfg.num_experts && k == cfg.top_k, "router_backward: routing was built for E=",
            E, " k=", k, " but config has E=", cfg.num_experts, " k=", cfg.top_k);
  if (T == 0 || (!dx_TH && !dgate_EH)) return;
  // dlogits[T,E]: d scores through the top-k weights and the aux term, then through the softmax.
  Buffer<float> dlogits(static_cast<size_t>(T) * E, nullptr, r.scores_TE.device());
  const bool aux = r.num_aux_seqs > 0 && aux_grad != 0.0f;
  const int S = r.num_aux_seqs > 0 ? T / r.num_aux_seqs : T;
  const float aux_scale = aux ? aux_grad * cfg.aux_loss_alpha / static_cast<float>(T) : 0.0f;
  kernels::router_topk_backward(dlogits.data(), r.scores_TE.data(), r.topk_idx_TK.data(),
                                dtopk_weight_TK, T, E, k, renormalises(cfg),
                                aux ? r.aux_coef_BE.data() : nullptr, S, aux_scale, scoring(cfg));
  // gate linear: dx += dlogits · W_gate ; dW_gate += dlogits^T · x
  kernels::linear_backward(dx_TH, dgate_EH, dlogits.data(), x_TH, gate_EH, T, H, E);
}

void update_score_bias(float* bias_E, const int64_t* loads_E, int E, float rate) {
  int64_t total = 0;
  for (int e = 0; e < E; ++e) {
    MOE_CHECK(loads_E[e] >= 0, "update_score_bias: negative load ", loads_E[e], " for expert ", e);
    total += loads_E[e];
  }
  for (int e = 0; e < E; ++e) {
    const int64_t scaled = static_cast<int64_t>(E) * loads_E[e];  // E·c_e vs sum(c) = E·mean(c)
    if (scaled < total) bias_E[e] += rate;
    if (scaled > total) bias_E[e] -= rate;
  }
}

}  // namespace moe::mixture
