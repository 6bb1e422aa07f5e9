// AdamW, in torch.optim.AdamW's exact float32 operation order (single-tensor CPU path):
//   p.mul_(1 - lr·wd); m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, 1 - b2);
//   denom = v.sqrt() / sqrt(bc2) + eps; p.addcdiv_(m, denom, -lr/bc1)
// Torch holds lr, betas, eps and wd as Python floats (doubles), computes the scalars above in
// double and casts each to float when it meets a float tensor; so do we. See adamw.h.
#include "kernels/adamw.h"
#include "kernels/element_math.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kernels/cpu_clones.h"
#include "kernels/device_select.h"
#include "kernels/gemm_bf16_cpu.h"

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

// The element loop in CPU-feature clones (kernels/cpu_clones.h; this file is compiled with
// -ffp-contract=off and -fno-math-errno, so sqrtf vectorizes and every clone rounds alike).
MOE_CPU_CLONES void adamw_cpu(float* p, const float* g, float* m, float* v, size_t n,
                              const math::AdamWScalars s, float grad_scale) {
  for (size_t i = 0; i < n; ++i) math::adamw_element(p[i], g[i], m[i], v[i], s, grad_scale);
}

}  // namespace

math::AdamWScalars adamw_scalars(const AdamWParams& hp, int step) {
  MOE_CHECK(step >= 1, "adamw_update: step counts from 1, got ", step);
  const double lr = decimal_double(hp.lr), b1 = decimal_double(hp.beta1),
               b2 = decimal_double(hp.beta2), eps = decimal_double(hp.eps),
               wd = decimal_double(hp.weight_decay);
  const double bias_correction1 = 1.0 - std::pow(b1, step);
  const double bias_correction2 = 1.0 - std::pow(b2, step);
  math::AdamWScalars s;
  s.decay = static_cast<float>(1.0 - lr * wd);
  s.w1 = static_cast<float>(1.0 - b1);  // lerp weight
  s.beta2 = static_cast<float>(b2);
  s.w2 = static_cast<float>(1.0 - b2);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  return s;
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale) {
  MOE_CUDA_DISPATCH(adamw_update, p, g, m, v, n, hp, step, grad_scale);
  invalidate_bf16_weights(p);  // the weights change: a bf16 copy of them would be stale
  const math::AdamWScalars s = adamw_scalars(hp, step);
  adamw_cpu(p, g, m, v, n, s, grad_scale);
}

double sum_squares(const float* x, size_t n) {
  MOE_CUDA_DISPATCH(sum_squares, x, n);
  // Eight partial sums (element i into sum i mod 8) added pairwise at the end: one fixed order on
  // every CPU and vector width, and eight independent chains of adds. One serial chain waited a
  // whole add latency per element: 2.6% of the tiny model's bf16 step on the AMX Xeon.
  double acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

}  // namespace moe::kernels
