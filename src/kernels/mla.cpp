// Multi-head latent attention's head assembly on the CPU. See mla.h.
#include "kernels/mla.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/element_math.h"

namespace moe::kernels {

void check_mla_shape(const RopeTable& rope, const MlaShape& s, const char* who) {
  MOE_CHECK(s.B >= 0 && s.T >= 0 && s.nh >= 1 && s.dn >= 0 && s.dv >= 1, who, ": B=", s.B, " T=",
            s.T, " heads=", s.nh, " qk_nope_head_dim=", s.dn, " v_head_dim=", s.dv);
  MOE_CHECK(s.dr >= 2 && s.dr % 2 == 0, who, ": qk_rope_head_dim must be even and positive, got ", s.dr);
  MOE_CHECK(s.D >= s.dn + s.dr && s.D >= s.dv, who, ": head width ", s.D, " is below qk_nope_head_dim + ",
            "qk_rope_head_dim (", s.dn + s.dr, ") or v_head_dim (", s.dv, ")");
  check_rope_args(rope, s.B, s.T, 1, s.dr, who);
}

namespace {

// Head h of row n as both directions index it: the row's rotary angles (position n mod T, dr / 2
// of each), and the head's offsets in the assembled heads [N, nh, D], in q [N, nh, dn + dr] and
// in kv [N, nh, dn + dv].
struct HeadAt {
  size_t n;
  const float *cos, *sin;
  size_t heads, q, kv;
};

// f(HeadAt) for every row n in order and, within it, every head h in order.
template <class F>
void for_each_head(const RopeTable& rope, const MlaShape& s, F f) {
  const size_t N = static_cast<size_t>(s.B) * s.T, half = s.dr / 2;
  for (size_t n = 0; n < N; ++n) {
    const size_t t = n % s.T;
    for (int h = 0; h < s.nh; ++h) {
      const size_t row = n * s.nh + h;
      f(HeadAt{n, rope.cos.data() + t * half, rope.sin.data() + t * half, row * s.D, row * (s.dn + s.dr),
               row * (s.dn + s.dv)});
    }
  }
}

}  // namespace

void mla_heads_forward(float* Q, float* K, float* V, const float* q, const float* kv,
                       const float* kpe, const RopeTable& rope, const MlaShape& s, float q_scale) {
  MOE_CUDA_DISPATCH(mla_heads_forward, Q, K, V, q, kv, kpe, rope, s, q_scale);
  check_mla_shape(rope, s, "mla_heads_forward");
  const int half = s.dr / 2, D = s.D;
  for_each_head(rope, s, [&](const HeadAt& at) {
    const float *c = at.cos, *sn = at.sin, *kp = kpe + at.n * s.dr;
    const float *qh = q + at.q, *kvh = kv + at.kv;
    float *Qh = Q + at.heads, *Kh = K + at.heads, *Vh = V + at.heads;
    std::memset(Qh, 0, D * sizeof(float));
    std::memset(Kh, 0, D * sizeof(float));
    std::memset(Vh, 0, D * sizeof(float));
    for (int j = 0; j < s.dn; ++j) {
      Qh[j] = qh[j] * q_scale;
      Kh[j] = kvh[j];
    }
    for (int i = 0; i < half; ++i) {
      float a = qh[s.dn + 2 * i], b = qh[s.dn + 2 * i + 1];
      math::rope_rotate(a, b, c[i], sn[i]);
      Qh[s.dn + i] = a * q_scale;
      Qh[s.dn + half + i] = b * q_scale;
      float ka = kp[2 * i], kb = kp[2 * i + 1];
      math::rope_rotate(ka, kb, c[i], sn[i]);
      Kh[s.dn + i] = ka;
      Kh[s.dn + half + i] = kb;
    }
    for (int j = 0; j < s.dv; ++j) Vh[j] = kvh[s.dn + j];
  });
}

void mla_heads_backward(float* dq, float* dkv, float* dkpe, const float* dQ, const float* dK,
                        const float* dV, const RopeTable& rope, const MlaShape& s, float q_scale) {
  MOE_CUDA_DISPATCH(mla_heads_backward, dq, dkv, dkpe, dQ, dK, dV, rope, s, q_scale);
  check_mla_shape(rope, s, "mla_heads_backward");
  const int half = s.dr / 2;
  std::fill_n(dkpe, static_cast<size_t>(s.B) * s.T * s.dr, 0.0f);  // summed over the heads below
  for_each_head(rope, s, [&](const HeadAt& at) {
    const float *c = at.cos, *sn = at.sin;
    const float *gQ = dQ + at.heads, *gK = dK + at.heads, *gV = dV + at.heads;
    float *qh = dq + at.q, *kvh = dkv + at.kv, *kp = dkpe + at.n * s.dr;
    for (int j = 0; j < s.dn; ++j) {
      qh[j] = gQ[j] * q_scale;
      kvh[j] = gK[j];
    }
    for (int i = 0; i < half; ++i) {
      // The rotation's transpose: the opposite angle.
      float a = gQ[s.dn + i] * q_scale, b = gQ[s.dn + half + i] * q_scale;
      math::rope_rotate(a, b, c[i], -sn[i]);
      qh[s.dn + 2 * i] = a;
      qh[s.dn + 2 * i + 1] = b;
      float ka = gK[s.dn + i], kb = gK[s.dn + half + i];
      math::rope_rotate(ka, kb, c[i], -sn[i]);
      kp[2 * i] += ka;
      kp[2 * i + 1] += kb;
    }
    for (int j = 0; j < s.dv; ++j) kvh[s.dn + j] = gV[j];
  });
}

void copy_cols(float* dst, int dst_cols, const float* src, int src_cols, size_t rows) {
  MOE_CUDA_DISPATCH(copy_cols, dst, dst_cols, src, src_cols, rows);
  MOE_CHECK(dst_cols >= 0 && src_cols >= 0, "copy_cols: columns ", dst_cols, " and ", src_cols);
  const int keep = dst_cols < src_cols ? dst_cols : src_cols;
  for (size_t r = 0; r < rows; ++r) {
    float* d = dst + r * dst_cols;
    const float* x = src + r * src_cols;
    for (int j = 0; j < keep; ++j) d[j] = x[j];
    for (int j = keep; j < dst_cols; ++j) d[j] = 0.0f;
  }
}

}  // namespace moe::kernels
