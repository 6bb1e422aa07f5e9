// Softmax cross-entropy over a vocabulary, numerically stable (max subtracted).
#pragma once
#include <cstdint>

namespace moe::kernels {

// losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]; probs [N,V] = softmax(logits)
// is kept for backward. Returns the mean loss (accumulated in double).
double cross_entropy_forward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V);
// dlogits += scale · (probs - onehot(targets)), scale is usually 1/N for a mean loss.
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int N,
                            int V, float scale);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
double cross_entropy_forward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V);
void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int N,
                            int V, float scale);
}  // namespace cuda

}  // namespace moe::kernels
