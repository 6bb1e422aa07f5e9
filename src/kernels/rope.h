// Rotary position embedding, Hugging Face "rotate_half" convention (as in modeling_deepseek.py):
// for pair (i, i + d/2) of a head vector at position p, angle = p · theta^(-2i/d);
// out_i = x_i cos - x_{i+d/2} sin ; out_{i+d/2} = x_{i+d/2} cos + x_i sin.
#pragma once
#include "core/buffer.h"
#include <vector>

namespace moe::kernels {

// cos/sin tables [max_pos, head_dim/2], computed in double then rounded once.
struct RopeTable {
  int max_pos = 0;
  int half = 0;
  std::vector<float> cos, sin;
  // Device copies of cos/sin, filled on first use by the CUDA kernels (empty on the CPU).
  mutable Buffer<float> dev_cos, dev_sin;
};
RopeTable make_rope_table(int max_pos, int head_dim, double theta);
// YaRN (DeepSeek-V3's rope_scaling "yarn", as in HF modeling_deepseek): inverse frequency i is
// theta^(-2i/d) blended with it divided by `factor` by a linear ramp over the dimensions between
// the correction range of beta_fast and beta_slow rotations at original_max_pos; cos and sin are
// multiplied by mscale(factor, mscale) / mscale(factor, mscale_all_dim), with
// mscale(f, m) = 0.1·m·ln(f) + 1 for f > 1, else 1.
struct YarnParams {
  double factor = 1.0, mscale = 1.0, mscale_all_dim = 0.0, beta_fast = 32.0, beta_slow = 1.0;
  int original_max_pos = 4096;
};
RopeTable make_yarn_rope_table(int max_pos, int head_dim, double theta, const YarnParams& y);

// Throws naming `who` when B, T, n_head or head_dim do not fit the table.
void check_rope_args(const RopeTable& table, int B, int T, int n_head, int head_dim, const char* who);
// x [B, T, n_head, head_dim] rotated in place; token t of every sequence has position t.
void rope_forward(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim);
// The rotation is orthogonal: its backward rotates dx in place by the opposite angle.
void rope_backward(float* dx, const RopeTable& table, int B, int T, int n_head, int head_dim);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void rope_forward(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim);
void rope_backward(float* dx, const RopeTable& table, int B, int T, int n_head, int head_dim);
// The table's cos/sin into its device copies, once (the kernels that rotate call it).
void upload_rope_table(const RopeTable& table);
}  // namespace cuda

}  // namespace moe::kernels
