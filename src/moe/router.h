// The MoE router (gate) of a DeepSeek-MoE layer, exactly as Hugging Face modeling_deepseek.py MoEGate:
// softmax scores over experts, top-k selection, optional renormalisation of the k weights, and the
// optional auxiliary load-balancing loss (per batch or per sequence). DeepSeek-V3's variant
// (scoring_func sigmoid, topk_method noaux_tc): sigmoid scores, top-k of scores + a per-expert
// bias (e_score_correction_bias, selection only), weights = the chosen unbiased scores, renormalised
// if asked, times routed_scaling_factor. Group-limited routing (n_group > 1; DeepSeek-V2's
// group_limited_greedy with softmax, V3's noaux_tc with sigmoid): each token keeps its topk_group
// best groups of E/n_group consecutive experts (group score: the max score for softmax, the sum of
// the two largest biased scores for sigmoid) and picks its k experts inside them; the weights are
// unchanged otherwise. Local math only: no step here ever communicates.
// Legend: T tokens, H hidden, E routed experts, k experts per token, B sequences (for seq_aux).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/buffer.h"

namespace moe::mixture {

struct RouterConfig {
  int num_experts = 0;          // E
  int top_k = 0;                // k
  bool norm_topk_prob = false;  // divide the k weights by their sum (+1e-20) when k > 1
  float aux_loss_alpha = 0.0f;  // 0 = no aux loss
  bool seq_aux = false;         // aux loss per sequence, averaged over sequences
  bool sigmoid = false;         // DeepSeek-V3 scoring (noaux_tc); false = softmax
  // Sigmoid only: [E] on the active device, added to the scores for the top-k choice and nowhere
  // else (no gradient). Null = no bias. Owned by the caller (the model's balancing state).
  const float* score_bias_E = nullptr;
  // Multiplies the k weights: always with sigmoid (V3), without renormalisation with softmax (V2).
  float routed_scaling_factor = 1.0f;
  int n_group = 1;     // groups of E/n_group consecutive experts; 1 = no group limit
  int topk_group = 1;  // groups a token may use (n_group > 1)
  // Data parallelism: sums the batch-level aux statistics [count_e (E), score_sum_e (E), tokens]
  // over every rank that holds part of the global batch, so the aux loss is the global batch's
  // (as on one process). The one communicating hook of the router; empty = local batch only.
  // Unused with seq_aux (sequences never span ranks, so per-sequence terms are local).
  std::function<void(std::vector<double>&)> reduce_stats;
};

// What router_forward keeps for backward. Buffers are charged to the tracker given to forward.
struct Routing {
  int T = 0, E = 0, k = 0;
  int num_aux_seqs = 0;          // B of aux_coef_BE: num_seqs with seq_aux, 1 without, 0 = no aux
  Buffer<float> scores_TE;       // [T,E] softmax (or sigmoid) of x · W_gate^T, unbiased
  Buffer<int32_t> topk_idx_TK;   // [T,k] chosen experts, descending score, ties -> lower index
  Buffer<float> topk_weight_TK;  // [T,k] final combine weights (renormalised if norm_topk_prob)
  // [B,E] the constant factor of the aux loss, c[b,e] = count(b,e) · E / (S·k), where count(b,e) is
  // the number of (token, slot) pairs of sequence b (S tokens) choosing e. Without seq_aux, B = 1 and
  // S = T, which is HF's fi = ce · E. Empty when aux_loss_alpha == 0.
  Buffer<float> aux_coef_BE;
  double aux_loss = 0.0;  // alpha-scaled
};

// aux = alpha · (1/B) · sum_b sum_e c[b,e] · mean_{t in b} scores[t,e]
//   (B = 1: HF's alpha · sum_e Pi · fi;  B = num_seqs: HF's seq_aux form). With sigmoid scoring
//   scores[t,e] is DeepSeek-V3's s'[t,e] = s[t,e] / sum_i s[t,i] (its sequence-wise balance loss).
// c is a constant (no gradient); the gradient flows through scores only:
//   d aux / d scores[t,e] = alpha · c[b(t),e] / T.
// With reduce_stats (B = 1), c and the mean scores are over the global batch of T_g tokens and the
// local gradient is alpha · c_e / T (T local): averaging gradients over the D = T_g/T data ranks
// then gives exactly d aux_global / d scores.
// num_seqs splits the T tokens into equal sequences; only used when seq_aux.
void router_forward(Routing& r, const float* x_TH, const float* gate_EH, int T, int H,
                    const RouterConfig& cfg, int num_seqs, MemTracker* tracker);

// dx_TH += ..., dgate_EH += ... (either may be nullptr). dtopk_weight_TK is dLoss/d topk_weight
// (from combine; zeros for dropped pairs), aux_grad = dLoss/d aux_loss. Goes back through the
// renormalisation, the top-k selection (only selected scores get gradient), the aux term, the
// softmax and the gate linear.
void router_backward(float* dx_TH, float* dgate_EH, const float* dtopk_weight_TK, float aux_grad,
                     const Routing& r, const float* x_TH, const float* gate_EH, int H,
                     const RouterConfig& cfg);

// Aux-loss-free balancing (DeepSeek-V3 §2.1.2), after each step: b_e += rate · sign(mean(c) - c_e)
// over the step's global per-expert loads c [E] (pairs routed to e, all micro-batches and data
// ranks): an underloaded expert's bias rises, an overloaded one's falls, one at the mean stays.
// The sign is taken exactly (sum(c) vs E·c_e, integers); the add is one fp32 add, the same on
// every rank.
void update_score_bias(float* bias_E, const int64_t* loads_E, int E, float rate);

}  // namespace moe::mixture
