// Rotary position embedding on the GPU: one thread per rotated pair (b, t, h, i). The table's
// cos/sin are uploaded to the device on first use and kept in the table. See rope.h.
#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/rope.h"

namespace moe::kernels::cuda {
namespace {

// x [B·T, n_head, 2·half]; pair i of head h at token row bt (position t = bt mod T).
__global__ void rope_kernel(float* x, const float* cos_t, const float* sin_t, size_t n_pairs, int T,
                            int n_head, int half, float sign) {
  MOE_GRID_STRIDE(idx, n_pairs) {
    const int i = static_cast<int>(idx % half);
    const size_t rest = idx / half;  // bt·n_head + h
    const size_t bt = rest / n_head;
    const int t = static_cast<int>(bt % T);
    float* x1 = x + rest * (2 * static_cast<size_t>(half)) + i;
    const size_t k = static_cast<size_t>(t) * half + i;
    float a = x1[0], b = x1[half];
    math::rope_rotate(a, b, cos_t[k], sign * sin_t[k]);
    x1[0] = a;
    x1[half] = b;
  }
}

void rotate(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim, float sign,
            const char* who) {
  check_rope_args(table, B, T, n_head, head_dim, who);
  const size_t n_pairs = static_cast<size_t>(B) * T * n_head * table.half;
  if (n_pairs == 0) return;
  upload_rope_table(table);
  MOE_LAUNCH(rope_kernel, elem_blocks(n_pairs), kThreads, 0, stream())(
      x, table.dev_cos.data(), table.dev_sin.data(), n_pairs, T, n_head, table.half, sign);
  MOE_CUDA_LAUNCHED(who);
}

}  // namespace

void upload_rope_table(const RopeTable& table) {
  if (table.dev_cos.size() == table.cos.size() && table.dev_sin.size() == table.sin.size()) return;
  table.dev_cos.resize(table.cos.size(), nullptr, Device::kCuda);
  table.dev_sin.resize(table.sin.size(), nullptr, Device::kCuda);
  device_copy(Device::kCuda, table.dev_cos.data(), Device::kCpu, table.cos.data(),
              table.cos.size() * sizeof(float));
  device_copy(Device::kCuda, table.dev_sin.data(), Device::kCpu, table.sin.data(),
              table.sin.size() * sizeof(float));
}

void rope_forward(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  rotate(x, table, B, T, n_head, head_dim, 1.0f, "rope_forward");
}

void rope_backward(float* dx, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  rotate(dx, table, B, T, n_head, head_dim, -1.0f, "rope_backward");
}

}  // namespace moe::kernels::cuda
