#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
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
    : AdamW(layout, cfg, {{0, layout.total()}}, mem) {}

AdamW::AdamW(const model::ParamLayout& layout, OptimConfig cfg,
             std::vector<std::pair<size_t, size_t>> owned, MemTracker* mem)
    : layout_(layout), cfg_(cfg), owned_(std::move(owned)) {
  size_t n = 0, last = 0;
  for (const auto& [b, e] : owned_) {
    MOE_CHECK(b >= last && b <= e && e <= layout.total(), "AdamW: owned range [", b, ", ", e,
              ") is not in layout order inside [0, ", layout.total(), ")");
    n += e - b;
    last = e;
  }
  // Moments on the active kernel device, beside the parameters they update.
  m_.resize(n, mem, kernels::active_device());
  v_.resize(n, mem, kernels::active_device());
}

namespace {

// Calls f(lo, hi, local, spec) for every piece of a tensor that lies in an owned range, in layout
// order; local = where the piece starts in m and v.
template <class F>
void for_each_owned(const model::ParamLayout& layout, const std::vector<std::pair<size_t, size_t>>& owned,
                    F&& f) {
  size_t r = 0, local = 0;  // owned[r]: the first range ending after this tensor's start, at `local`
  for (const model::ParamSpec& p : layout.specs()) {
    const size_t pb = p.offset, pe = p.offset + p.numel;
    while (r < owned.size() && owned[r].second <= pb) {
      local += owned[r].second - owned[r].first;
      ++r;
    }
    size_t at = local;
    for (size_t q = r; q < owned.size() && owned[q].first < pe; ++q) {
      const size_t lo = std::max(pb, owned[q].first), hi = std::min(pe, owned[q].second);
      if (lo < hi) f(lo, hi, at + (lo - owned[q].first), p);
      at += owned[q].second - owned[q].first;
    }
  }
}

}  // namespace

double AdamW::step(float* params, const float* grads, int s) {
  // Global norm over all gradients: replicated tensors and routed experts summed apart, each per
  // tensor in layout order (a fixed order); the experts' part over the whole EP group.
  double sq_replicated = 0.0, sq_experts = 0.0, sq_split = 0.0;
  for_each_owned(layout_, owned_, [&](size_t lo, size_t hi, size_t, const model::ParamSpec& p) {
    if (p.tied_copy) return;  // the first stage counts it
    (p.is_expert ? sq_experts : (p.tp_dim >= 0 ? sq_split : sq_replicated)) +=
        kernels::sum_squares(grads + lo, hi - lo);
  });
  const double norm = std::sqrt(reduce_sq_ ? reduce_sq_(sq_replicated, sq_experts, sq_split)
                                           : sq_replicated + sq_experts + sq_split);
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
  for_each_owned(layout_, owned_, [&](size_t lo, size_t hi, size_t local, const model::ParamSpec& p) {
    hp.weight_decay = p.decay ? cfg_.weight_decay : 0.0f;
    kernels::adamw_update(params + lo, grads + lo, m_.data() + local, v_.data() + local, hi - lo, hp,
                          s + 1, scale);
  });
  return norm;
}

}  // namespace moe::train
