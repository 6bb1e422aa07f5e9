// The router's per-token loops as leaf kernels (one row per token; the math is
// math::router_row_forward / router_row_backward of element_math.h), and the statistics the aux
// loss needs. The MoE router (moe/router.cpp) is the only caller.
// Legend: T tokens, E experts, k slots, B sequences of S tokens (B = 1 without seq_aux).
#pragma once
#include <cstdint>

#include "kernels/element_math.h"  // math::RouterScoring

namespace moe::kernels {

// scores_TE holds the gate logits on entry and the scores (softmax, or sigmoid) on exit;
// idx/weight [T,k]. `scoring` (math::router_row_forward): sigmoid, the selection bias, the scale.
void router_topk(float* scores_TE, int32_t* topk_idx_TK, float* topk_weight_TK, int T, int E, int k,
                 bool renorm, const math::RouterScoring& scoring = {});
// dlogits_TE is overwritten. aux_coef_BE may be null (no aux term); token t uses row t / S.
void router_topk_backward(float* dlogits_TE, const float* scores_TE, const int32_t* topk_idx_TK,
                          const float* dtopk_weight_TK, int T, int E, int k, bool renorm,
                          const float* aux_coef_BE, int S, float aux_scale,
                          const math::RouterScoring& scoring = {});
// Host outputs: count_BE[b,e] = pairs of sequence b choosing e; score_sum_BE[b,e] = sum over the
// tokens of b of scores[t,e] (in double, tokens ascending); with normalise (sigmoid scoring), of
// scores[t,e] / math::row_sum(scores[t]). Inputs are on the active device.
void router_aux_stats(double* count_BE, double* score_sum_BE, const int32_t* topk_idx_TK,
                      const float* scores_TE, int T, int E, int k, int B,
                      bool normalise = false);

namespace cuda {
void router_topk(float* scores_TE, int32_t* topk_idx_TK, float* topk_weight_TK, int T, int E, int k,
                 bool renorm, const math::RouterScoring& scoring = {});
void router_topk_backward(float* dlogits_TE, const float* scores_TE, const int32_t* topk_idx_TK,
                          const float* dtopk_weight_TK, int T, int E, int k, bool renorm,
                          const float* aux_coef_BE, int S, float aux_scale,
                          const math::RouterScoring& scoring = {});
void router_aux_stats(double* count_BE, double* score_sum_BE, const int32_t* topk_idx_TK,
                      const float* scores_TE, int T, int E, int k, int B,
                      bool normalise = false);
}  // namespace cuda

}  // namespace moe::kernels
