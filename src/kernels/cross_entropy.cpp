// Softmax cross-entropy, max-subtracted. See cross_entropy.h.
#include "kernels/cross_entropy.h"
#include "kernels/element_math.h"

#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/device_select.h"

namespace moe::kernels {

double cross_entropy_forward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V) {
  MOE_CUDA_DISPATCH(cross_entropy_forward, losses, probs, logits, targets, N, V);
  MOE_CHECK(N >= 0 && V > 0, "cross_entropy_forward: N=", N, " V=", V);
  double total = 0.0;
  for (int n = 0; n < N; ++n) {
    int32_t target = targets[n];
    MOE_CHECK(target >= 0 && target < V, "cross_entropy_forward: target ", target, " of row ", n,
              " is outside the vocabulary [0, ", V, ")");
    const float* x = logits + static_cast<size_t>(n) * V;
    float* p = probs + static_cast<size_t>(n) * V;
    // loss = logsumexp(x) - x[target]
    const double loss = math::softmax_row(p, x, V) - static_cast<double>(x[target]);
    losses[n] = static_cast<float>(loss);
    total += loss;
  }
  return N > 0 ? total / N : 0.0;
}

void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int N,
                            int V, float scale) {
  MOE_CUDA_DISPATCH(cross_entropy_backward, dlogits, probs, targets, N, V, scale);
  MOE_CHECK(N >= 0 && V > 0, "cross_entropy_backward: N=", N, " V=", V);
  for (int n = 0; n < N; ++n) {
    const float* p = probs + static_cast<size_t>(n) * V;
    float* d = dlogits + static_cast<size_t>(n) * V;
    int32_t t = targets[n];
    for (int j = 0; j < V; ++j) d[j] = math::cross_entropy_grad(d[j], p[j], j == t, scale);
  }
}

}  // namespace moe::kernels
