// Router row kernels, CPU implementation. See router_ops.h.
#include "kernels/router_ops.h"

#include <cstddef>

#include "kernels/device_select.h"
#include "kernels/element_math.h"

namespace moe::kernels {

void router_topk(float* scores_TE, int32_t* topk_idx_TK, float* topk_weight_TK, int T, int E, int k,
                 bool renorm, const math::RouterScoring& scoring) {
  MOE_CUDA_DISPATCH(router_topk, scores_TE, topk_idx_TK, topk_weight_TK, T, E, k, renorm, scoring);
  for (int t = 0; t < T; ++t)
    math::router_row_forward(scores_TE + static_cast<size_t>(t) * E,
                             topk_idx_TK + static_cast<size_t>(t) * k,
                             topk_weight_TK + static_cast<size_t>(t) * k, E, k, renorm, scoring);
}

void router_topk_backward(float* dlogits_TE, const float* scores_TE, const int32_t* topk_idx_TK,
                          const float* dtopk_weight_TK, int T, int E, int k, bool renorm,
                          const float* aux_coef_BE, int S, float aux_scale,
                          const math::RouterScoring& scoring) {
  MOE_CUDA_DISPATCH(router_topk_backward, dlogits_TE, scores_TE, topk_idx_TK, dtopk_weight_TK, T, E,
                    k, renorm, aux_coef_BE, S, aux_scale, scoring);
  for (int t = 0; t < T; ++t) {
    float* ds = dlogits_TE + static_cast<size_t>(t) * E;
    for (int e = 0; e < E; ++e) ds[e] = 0.0f;
    math::router_row_backward(ds, scores_TE + static_cast<size_t>(t) * E,
                              topk_idx_TK + static_cast<size_t>(t) * k,
                              dtopk_weight_TK + static_cast<size_t>(t) * k, E, k, renorm,
                              aux_coef_BE ? aux_coef_BE + static_cast<size_t>(t / S) * E : nullptr,
                              aux_scale, scoring);
  }
}

void router_aux_stats(double* count_BE, double* score_sum_BE, const int32_t* topk_idx_TK,
                      const float* scores_TE, int T, int E, int k, int B, bool normalise) {
  MOE_CUDA_DISPATCH(router_aux_stats, count_BE, score_sum_BE, topk_idx_TK, scores_TE, T, E, k, B,
                    normalise);
  const int S = T / B;
  for (size_t i = 0; i < static_cast<size_t>(B) * E; ++i) count_BE[i] = score_sum_BE[i] = 0.0;
  for (int t = 0; t < T; ++t) {
    double* c = count_BE + static_cast<size_t>(t / S) * E;
    double* m = score_sum_BE + static_cast<size_t>(t / S) * E;
    const int32_t* idx = topk_idx_TK + static_cast<size_t>(t) * k;
    for (int j = 0; j < k; ++j) c[idx[j]] += 1.0;
    const float* s = scores_TE + static_cast<size_t>(t) * E;
    const float z = normalise ? math::row_sum(s, E) : 1.0f;
    for (int e = 0; e < E; ++e) m[e] += normalise ? s[e] / z : s[e];
  }
}

}  // namespace moe::kernels
