// The attention block's projections for every family (model/family.h): q, k, v from the normed
// input, plus the q/k/v biases (qwen2_moe), the per-head RMSNorm of q and k (QK-norm, qwen3_moe)
// and RoPE; and grouped-query attention's repetition of each key/value head to the nh/nkv query
// heads it serves (HF repeat_kv), so that the attention kernels see nh heads of each.
// All of it is a composition of existing kernels (GEMM, rmsnorm, rope, gather_rows and its
// backward), so it runs wherever they do (CPU, CUDA): the repetition is gather_rows with k = nh/nkv
// over an identity row map, its backward gather_rows_backward (a fixed-order sum over the group).
// For DeepSeek (multi-head, no bias, no QK-norm) qkv_forward / qkv_backward run exactly the three
// linears and two rotations the model ran before, in the same order: the same bits.
// Legend: N = B·T tokens, nh / nkv this rank's query / key-value heads, hd head_dim,
// A = nh·hd, Akv = nkv·hd, rep = nh/nkv. Backward adds into dx and the gradients (gemm.h).
#pragma once
#include <cstdint>

#include "core/buffer.h"
#include "kernels/rope.h"

namespace moe::model {

struct QkvDims {
  int B = 0, T = 0, H = 0;
  int nh = 0, nkv = 0, hd = 0;
  int N() const { return B * T; }
  int A() const { return nh * hd; }
  int Akv() const { return nkv * hd; }
};

struct QkvWeights {
  const float* q = nullptr;       // [A,H]
  const float* k = nullptr;       // [Akv,H]
  const float* v = nullptr;       // [Akv,H]
  const float* q_bias = nullptr;  // [A] or null
  const float* k_bias = nullptr;  // [Akv]
  const float* v_bias = nullptr;  // [Akv]
  const float* q_norm = nullptr;  // [hd] or null (no QK-norm)
  const float* k_norm = nullptr;  // [hd]
};
struct QkvGrads {
  float *q = nullptr, *k = nullptr, *v = nullptr;
  float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
  float *q_norm = nullptr, *k_norm = nullptr;
};

// What QK-norm's backward needs (empty without QK-norm).
struct QkvKept {
  Buffer<float> q_raw, k_raw;    // [N,A], [N,Akv] before the norm (after the bias)
  Buffer<float> q_rstd, k_rstd;  // [N·nh], [N·nkv]
};

// The identity row map and a vector of ones on the active device, grown when a call needs more
// (the repetition's row map; the biases' rank-1 GEMMs). Charged to `tracker`.
class QkvScratch {
 public:
  explicit QkvScratch(MemTracker* tracker = nullptr) : tracker_(tracker) {}
  const int32_t* iota(size_t n);  // [0, 1, ..., n-1]
  const float* ones(size_t n);

 private:
  MemTracker* tracker_;
  Buffer<int32_t> iota_;
  Buffer<float> ones_;
};

// q [N,A] and k, v [N,Akv], ready for attention (k, v before the repetition). kept: null when
// nothing is kept (inference); QK-norm then takes its temporaries from `work`.
void qkv_forward(float* q, float* k, float* v, QkvKept* kept, const float* x_NH, const QkvWeights& w,
                 const QkvDims& d, const kernels::RopeTable& rope, float eps, QkvScratch& s,
                 MemTracker* kept_mem, MemTracker* work);
// full [N,A] = each key/value head of small [N,Akv] repeated rep times (head h reads h / rep).
void repeat_kv(float* full, const float* small, const QkvDims& d, QkvScratch& s);
// small [N,Akv] += the sum over each group of rep heads of full [N,A] (repeat_kv's backward).
void repeat_kv_backward(float* small, const float* full, const QkvDims& d, QkvScratch& s);
// dq [N,A], dk, dv [N,Akv]: the gradients at qkv_forward's outputs (dk, dv summed over the
// groups already); dq and dk are rotated back in place. dx_NH += ..., grads += ...
void qkv_backward(float* dx_NH, const QkvGrads& g, float* dq, float* dk, float* dv, const QkvKept& kept,
                  const float* x_NH, const QkvWeights& w, const QkvDims& d, const kernels::RopeTable& rope,
                  QkvScratch& s, MemTracker* work);

}  // namespace moe::model
