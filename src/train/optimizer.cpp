#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/device_select.h"

namespace moe::train {

double learning_rate(const OptimConfig& o, int s) {
  if (o.warmup_steps > 0 && s < o.warmup_steps)
    return static_cast<double>(o.lr) * (s + 1) / o.warmup_steps;
  double p = static_cast<double>(s - o.warmup_steps) / std::max(1, o.total_steps - o.warmup_steps);
  p = std::clamp(p, 0.0, 1.0);
  return o.min_lr + 0.5 * (static_cast<double>(o.lr) - o.min_lr) * (1.0 + std::cos(M_PI * p));
}

AdamW::AdamW(const model::ParamLayout& layout, OptimConfig cfg, MemTracker* mem)
    : layout_(layout), cfg_(cfg) {
  // Moments on the active kernel device, beside the parameters they update.
  m_.resize(layout.total(), mem, kernels::active_device());
  v_.resize(layout.total(), mem, kernels::active_device());
}

double AdamW::step(float* params, const float* grads, int s) {
  // Global norm over all gradients: replicated tensors and routed experts summed apart, each per
  // tensor in layout order (a fixed order); the experts' part over the whole EP group.
  double sq_replicated = 0.0, sq_experts = 0.0;
  for (const model::ParamSpec& p : layout_.specs())
    (p.is_expert ? sq_experts : sq_replicated) += kernels::sum_squares(grads + p.offset, p.numel);
  const double norm = std::sqrt(reduce_sq_ ? reduce_sq_(sq_replicated, sq_experts)
                                           : sq_replicated + sq_experts);
  if (!std::isfinite(norm)) return norm;  // a non-finite gradient: no update (the caller counts it)
  float scale = 1.0f;
  if (cfg_.grad_clip > 0.0f) {
    // torch: clip_coef = max_norm / (total_norm + 1e-6), applied when < 1, in float32.
    float coef = static_cast<float>(cfg_.grad_clip / (norm + 1e-6));
    if (coef < 1.0f) scale = coef;
  }
  kernels::AdamWParams hp;
  hp.lr = static_cast<float>(learning_rate(cfg_, s));
  hp.beta1 = cfg_.beta1;
  hp.beta2 = cfg_.beta2;
  hp.eps = cfg_.eps;
  for (const model::ParamSpec& p : layout_.specs()) {
    hp.weight_decay = p.decay ? cfg_.weight_decay : 0.0f;
    kernels::adamw_update(params + p.offset, grads + p.offset, m_.data() + p.offset,
                          v_.data() + p.offset, p.numel, hp, s + 1, scale);
  }
  return norm;
}

}  // namespace moe::train
