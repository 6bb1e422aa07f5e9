// AdamW with decoupled weight decay (Loshchilov & Hutter):
//   g' = g · grad_scale (global-norm clipping folds in here)
//   m = b1·m + (1-b1)·g' ; v = b2·v + (1-b2)·g'²
//   p -= lr · ( m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd · p )
// step t counts from 1. Same arithmetic as torch.optim.AdamW (decay applied before the update).
#pragma once
#include <cstddef>

#include "kernels/element_math.h"

namespace moe::kernels {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// The float scalars of step t (computed in double from the decimal hyperparameters, as torch does);
// the CPU and CUDA updates both apply them with math::adamw_element.
math::AdamWScalars adamw_scalars(const AdamWParams& hp, int step);
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale);

// sum of squares in double (for the global gradient norm)
double sum_squares(const float* x, size_t n);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale);
double sum_squares(const float* x, size_t n);
}  // namespace cuda

}  // namespace moe::kernels
