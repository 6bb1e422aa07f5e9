// AdamW over a model's flat parameter block (decay only where ParamSpec::decay), the learning-rate
// schedule (linear warm-up then cosine decay to min_lr) and global-norm gradient clipping.
// The arithmetic matches torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ (the reference test
// checks the first 10 losses against PyTorch).
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "model/params.h"

namespace moe::train {

struct OptimConfig {
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  int warmup_steps = 20;
  int total_steps = 1000;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float grad_clip = 1.0f;  // 0 = no clipping
};

// Learning rate of 0-based step s: lr·(s+1)/warmup during warm-up, then
// min_lr + (lr − min_lr)·(1 + cos(π·p))/2 with p = (s − warmup)/(total − warmup) clipped to [0, 1].
double learning_rate(const OptimConfig& o, int step);

class AdamW {
 public:
  AdamW(const model::ParamLayout& layout, OptimConfig cfg, MemTracker* mem = nullptr);
  // ZeRO-1 (parallel/zero1.h): only the flat ranges [first, second) of `owned` (in layout order)
  // are updated, and m, v hold just those, back to back. The norm reducer then gets this rank's
  // partial sums over those ranges (the caller's reducer completes them over the groups).
  AdamW(const model::ParamLayout& layout, OptimConfig cfg, std::vector<std::pair<size_t, size_t>> owned,
        MemTracker* mem = nullptr);
  // One update of params from grads (grads are read, not zeroed). Returns the global gradient
  // norm before clipping; when it is not finite, nothing is updated. `step` is 0-based.
  double step(float* params, const float* grads, int step);
  const OptimConfig& config() const { return cfg_; }
  // --time-budget: the step count is chosen after the warm-up, whose learning rates do not
  // depend on it (learning_rate: steps 0..warmup_steps).
  void set_total_steps(int total) { cfg_.total_steps = total; }
  // Expert parallelism: each rank holds only its experts, with pipeline stages only its layers,
  // with tensor parallelism only its slices of the split matrices: the global gradient norm needs
  // a reduction. The reducer gets this rank's squared norms of the replicated tensors, of the
  // routed experts and of the TP-split tensors (ParamSpec::tp_dim >= 0), and returns the global
  // squared norm (the experts' part summed over the EP group, the split part over the TP group,
  // then everything over the stages). Unset: their sum.
  void set_norm_reducer(std::function<double(double, double, double)> f) { reduce_sq_ = std::move(f); }
  Buffer<float>& m() { return m_; }
  Buffer<float>& v() { return v_; }

 private:
  const model::ParamLayout& layout_;
  OptimConfig cfg_;
  Buffer<float> m_, v_;
  std::function<double(double, double, double)> reduce_sq_;
  std::vector<std::pair<size_t, size_t>> owned_;  // flat ranges this rank updates (all: [0, total))
};

}  // namespace moe::train
