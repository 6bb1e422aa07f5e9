// Router row kernels on the GPU: one thread per token running math::router_row_forward /
// router_row_backward on its global row (rows are E floats, short). The aux statistics run one
// thread per (sequence, expert) summing its tokens in order in double, then go to the host.
// See router_ops.h.
#include <vector>

#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/router_ops.h"

namespace moe::kernels::cuda {
namespace {

__global__ void router_topk_kernel(float* scores, int32_t* idx, float* weight, size_t T, int E,
                                   int k, bool renorm, math::RouterScoring scoring) {
  MOE_GRID_STRIDE(t, T)
    math::router_row_forward(scores + t * E, idx + t * k, weight + t * k, E, k, renorm, scoring);
}

__global__ void router_topk_backward_kernel(float* dlogits, const float* scores, const int32_t* idx,
                                            const float* dweight, size_t T, int E, int k,
                                            bool renorm, const float* aux_coef, int S,
                                            float aux_scale, math::RouterScoring scoring) {
  MOE_GRID_STRIDE(t, T) {
    float* ds = dlogits + t * E;
    for (int e = 0; e < E; ++e) ds[e] = 0.0f;
    math::router_row_backward(ds, scores + t * E, idx + t * k, dweight + t * k, E, k, renorm,
                              aux_coef ? aux_coef + (t / S) * E : nullptr, aux_scale, scoring);
  }
}

// count[b, e] and score_sum[b, e] over the S tokens of sequence b, tokens ascending (normalise:
// of scores[t,e] / row_sum(scores[t]), as on the CPU).
__global__ void router_aux_stats_kernel(double* count, double* score_sum, const int32_t* idx,
                                        const float* scores, int S, int E, int k, size_t BE,
                                        bool normalise) {
  MOE_GRID_STRIDE(be, BE) {
    const size_t b = be / E;
    const int e = static_cast<int>(be - b * E);
    double c = 0.0, m = 0.0;
    for (size_t t = b * S; t < (b + 1) * S; ++t) {
      for (int j = 0; j < k; ++j) c += idx[t * k + j] == e ? 1.0 : 0.0;
      if (normalise) {
        m += scores[t * E + e] / math::row_sum(scores + t * E, E);
      } else {
        m += scores[t * E + e];
      }
    }
    count[be] = c;
    score_sum[be] = m;
  }
}


}  // namespace

void router_topk(float* scores_TE, int32_t* topk_idx_TK, float* topk_weight_TK, int T, int E, int k,
                 bool renorm, const math::RouterScoring& scoring) {
  MOE_CHECK(T >= 0 && E > 0 && k >= 1 && k <= E, "router_topk: T=", T, " E=", E, " k=", k);
  if (T == 0) return;
  MOE_LAUNCH(router_topk_kernel, elem_blocks(T), kThreads, 0, stream())(scores_TE, topk_idx_TK,
                                                                        topk_weight_TK, T, E, k, renorm,
                                                                        scoring);
  MOE_CUDA_LAUNCHED("router_topk");
}

void router_topk_backward(float* dlogits_TE, const float* scores_TE, const int32_t* topk_idx_TK,
                          const float* dtopk_weight_TK, int T, int E, int k, bool renorm,
                          const float* aux_coef_BE, int S, float aux_scale,
                          const math::RouterScoring& scoring) {
  MOE_CHECK(T >= 0 && E > 0 && k >= 1 && k <= E, "router_topk_backward: T=", T, " E=", E, " k=", k);
  MOE_CHECK(!aux_coef_BE || S > 0, "router_topk_backward: sequence length S=", S);
  if (T == 0) return;
  MOE_LAUNCH(router_topk_backward_kernel, elem_blocks(T), kThreads, 0, stream())(
      dlogits_TE, scores_TE, topk_idx_TK, dtopk_weight_TK, T, E, k, renorm, aux_coef_BE, S,
      aux_scale, scoring);
  MOE_CUDA_LAUNCHED("router_topk_backward");
}

void router_aux_stats(double* count_BE, double* score_sum_BE, const int32_t* topk_idx_TK,
                      const float* scores_TE, int T, int E, int k, int B, bool normalise) {
  MOE_CHECK(T >= 0 && E > 0 && k >= 1 && B >= 1 && T % B == 0, "router_aux_stats: T=", T, " E=", E,
            " k=", k, " B=", B, " (T must be a multiple of B)");
  const size_t BE = static_cast<size_t>(B) * E;
  double* dev = workspace(Workspace::kRouterStats).as<double>(2 * BE);
  MOE_LAUNCH(router_aux_stats_kernel, elem_blocks(BE), kThreads, 0, stream())(dev, dev + BE, topk_idx_TK,
                                                                              scores_TE, T / B, E, k, BE,
                                                                              normalise);
  MOE_CUDA_LAUNCHED("router_aux_stats");
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(count_BE, dev, sizeof(double) * BE, cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaMemcpyAsync(score_sum_BE, dev + BE, sizeof(double) * BE,
                                 cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

}  // namespace moe::kernels::cuda
