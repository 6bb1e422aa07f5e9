// AdamW, in torch.optim.AdamW's exact float32 operation order (single-tensor CPU path):
//   p.mul_(1 - lr·wd); m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2);
//   denom = v.sqrt() / sqrt(bc2) + eps; p.addcdiv_(m, denom, -lr/bc1)
// Torch holds lr, betas, eps and wd as Python floats (doubles), computes the scalars above in
// double and casts each to float when it meets a float tensor; so do we. See adamw.h.
#include "kernels/adamw.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace moe::kernels {
namespace {

// The double a config's decimal literal denotes: 0.9f -> "0.9" -> 0.9 (not 0.899999976...).
// Hyperparameters come from decimal text on both sides, and this makes the double scalars, hence
// the float ones, identical to the ones PyTorch derives from the same text.
double decimal_double(float x) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf) - 1, x);  // shortest round-trip form
  *res.ptr = '\0';
  return std::strtod(buf, nullptr);
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale) {
  MOE_CHECK(step >= 1, "adamw_update: step counts from 1, got ", step);
  const double lr = decimal_double(hp.lr), b1 = decimal_double(hp.beta1),
               b2 = decimal_double(hp.beta2), eps = decimal_double(hp.eps),
               wd = decimal_double(hp.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(b1, step);
  const double bias_correction2 = 1.0 - std::pow(b2, step);
  const float decay = static_cast<float>(1.0 - lr * wd);
  const float w1 = static_cast<float>(1.0 - b1);  // lerp weight
  const float beta2 = static_cast<float>(b2);
  const float w2 = static_cast<float>(1.0 - b2);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps_f = static_cast<float>(eps);
  const float neg_step_size = static_cast<float>(-(lr / bias_correction1));
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale;
    float pi = p[i] * decay;
    // torch's lerp: weight < 0.5 ? m + w·(g - m) : g - (g - m)·(1 - w)
    float mi = w1 < 0.5f ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * (1.0f - w1);
    float vi = v[i] * beta2 + w2 * gi * gi;
    float denom = std::sqrt(vi) / bc2_sqrt + eps_f;
    p[i] = pi + neg_step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double sum_squares(const float* x, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace moe::kernels
