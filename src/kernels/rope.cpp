// Rotary position embedding (Hugging Face rotate_half convention). See rope.h.
#include "kernels/rope.h"
#include "kernels/element_math.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "core/error.h"
#include "kernels/device_select.h"

namespace moe::kernels {

RopeTable make_rope_table(int max_pos, int head_dim, double theta) {
  MOE_CHECK(max_pos >= 0, "make_rope_table: max_pos=", max_pos);
  MOE_CHECK(head_dim > 0 && head_dim % 2 == 0, "make_rope_table: head_dim must be even, got ",
            head_dim);
  MOE_CHECK(theta > 0.0, "make_rope_table: theta must be positive, got ", theta);
  RopeTable t;
  t.max_pos = max_pos;
  t.half = head_dim / 2;
  t.cos.resize(static_cast<size_t>(max_pos) * t.half);
  t.sin.resize(static_cast<size_t>(max_pos) * t.half);
  for (int i = 0; i < t.half; ++i) {
    double inv_freq = std::pow(theta, -2.0 * i / head_dim);  // theta^(-2i/d)
    for (int p = 0; p < max_pos; ++p) {
      double angle = p * inv_freq;
      size_t k = static_cast<size_t>(p) * t.half + i;
      t.cos[k] = static_cast<float>(std::cos(angle));
      t.sin[k] = static_cast<float>(std::sin(angle));
    }
  }
  return t;
}

RopeTable make_yarn_rope_table(int max_pos, int head_dim, double theta, const YarnParams& y) {
  RopeTable t = make_rope_table(0, head_dim, theta);  // checks the arguments
  MOE_CHECK(max_pos >= 0 && y.factor >= 1.0 && y.original_max_pos > 0 && y.beta_fast > y.beta_slow &&
                y.beta_slow > 0.0,
            "make_yarn_rope_table: factor ", y.factor, ", original_max_pos ", y.original_max_pos,
            ", beta_fast ", y.beta_fast, ", beta_slow ", y.beta_slow);
  const double d = head_dim, pi = 3.14159265358979323846;
  // The dimension whose wavelength makes `rotations` turns over the original context.
  auto correction_dim = [&](double rotations) {
    return d * std::log(y.original_max_pos / (rotations * 2 * pi)) / (2 * std::log(theta));
  };
  const double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), d - 1);
  if (high == low) high += 0.001;
  auto mscale = [&](double m) { return y.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(y.factor) + 1.0; };
  const double amp = mscale(y.mscale) / mscale(y.mscale_all_dim);
  t.max_pos = max_pos;
  t.cos.resize(static_cast<size_t>(max_pos) * t.half);
  t.sin.resize(static_cast<size_t>(max_pos) * t.half);
  for (int i = 0; i < t.half; ++i) {
    const double extra = std::pow(theta, -2.0 * i / head_dim), inter = extra / y.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // the share of the unscaled (extrapolated) frequency
    const double inv_freq = inter * (1.0 - keep) + extra * keep;
    for (int p = 0; p < max_pos; ++p) {
      const double angle = p * inv_freq;
      const size_t k = static_cast<size_t>(p) * t.half + i;
      t.cos[k] = static_cast<float>(std::cos(angle) * amp);
      t.sin[k] = static_cast<float>(std::sin(angle) * amp);
    }
  }
  return t;
}

// Sizes of a rotation against its table (shared by the CPU and CUDA rotations).
void check_rope_args(const RopeTable& table, int B, int T, int n_head, int head_dim, const char* who) {
  MOE_CHECK(B >= 0 && T >= 0 && n_head >= 0, who, ": B=", B, " T=", T, " n_head=", n_head);
  MOE_CHECK(head_dim == 2 * table.half, who, ": head_dim ", head_dim, " does not match the table (",
            2 * table.half, ")");
  MOE_CHECK(T <= table.max_pos, who, ": T=", T, " exceeds the table's max_pos ", table.max_pos);
}

namespace {

// Rotates every head vector of x by +angle (sign = 1) or -angle (sign = -1):
//   out_i = x_i·cos - x_{i+half}·sin·sign ; out_{i+half} = x_{i+half}·cos + x_i·sin·sign
void rotate(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim, float sign,
            const char* who) {
  check_rope_args(table, B, T, n_head, head_dim, who);
  int half = table.half;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const float* c = table.cos.data() + static_cast<size_t>(t) * half;
      const float* s = table.sin.data() + static_cast<size_t>(t) * half;
      float* row = x + (static_cast<size_t>(b) * T + t) * n_head * head_dim;
      for (int h = 0; h < n_head; ++h) {
        float* x1 = row + static_cast<size_t>(h) * head_dim;
        float* x2 = x1 + half;
        for (int i = 0; i < half; ++i) math::rope_rotate(x1[i], x2[i], c[i], sign * s[i]);
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  MOE_CUDA_DISPATCH(rope_forward, x, table, B, T, n_head, head_dim);
  rotate(x, table, B, T, n_head, head_dim, 1.0f, "rope_forward");
}

void rope_backward(float* dx, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  MOE_CUDA_DISPATCH(rope_backward, dx, table, B, T, n_head, head_dim);
  rotate(dx, table, B, T, n_head, head_dim, -1.0f, "rope_backward");
}

}  // namespace moe::kernels
