// The attention projections of every family. See attention_proj.h.
#include "model/attention_proj.h"

#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"

namespace moe::model {

namespace k = moe::kernels;

const int32_t* QkvScratch::iota(size_t n) {
  if (iota_.size() < n || iota_.device() != k::active_device()) {
    std::vector<int32_t> host(n);
    std::iota(host.begin(), host.end(), 0);
    iota_.resize_for_overwrite(n, tracker_, k::active_device());
    device_copy(iota_.device(), iota_.data(), Device::kCpu, host.data(), n * sizeof(int32_t));
  }
  return iota_.data();
}

const float* QkvScratch::ones(size_t n) {
  if (ones_.size() < n || ones_.device() != k::active_device()) {
    std::vector<float> host(n, 1.0f);
    ones_.resize_for_overwrite(n, tracker_, k::active_device());
    device_copy(ones_.device(), ones_.data(), Device::kCpu, host.data(), n * sizeof(float));
  }
  return ones_.data();
}

namespace {

// y[N,D] += 1_N · b^T: a rank-1 GEMM over a column of ones (the bias add of a linear).
void bias_forward(float* y, const float* b, int N, int D, QkvScratch& s) {
  k::gemm(false, false, N, D, 1, 1.0f, s.ones(N), 1, b, D, 1.0f, y, D);
}
// db[D] += 1_N^T · dy: the column sums of dy.
void bias_backward(float* db, const float* dy, int N, int D, QkvScratch& s) {
  k::gemm(true, false, 1, D, N, 1.0f, s.ones(N), 1, dy, D, 1.0f, db, D);
}

}  // namespace

void qkv_forward(float* q, float* k, float* v, QkvKept* kept, const float* x, const QkvWeights& w,
                 const QkvDims& d, const kernels::RopeTable& rope, float eps, QkvScratch& s,
                 MemTracker* kept_mem, MemTracker* work) {
  const int N = d.N(), H = d.H, A = d.A(), Akv = d.Akv();
  const bool qk_norm = w.q_norm != nullptr;
  // QK-norm: the projections land in q_raw / k_raw, normed from there into q / k.
  QkvKept local;
  QkvKept& kk = kept ? *kept : local;
  MemTracker* mem = kept ? kept_mem : work;
  float* q_lin = q;
  float* k_lin = k;
  if (qk_norm) {
    const Device dev = k::active_device();
    kk.q_raw.resize_for_overwrite(static_cast<size_t>(N) * A, mem, dev);
    kk.k_raw.resize_for_overwrite(static_cast<size_t>(N) * Akv, mem, dev);
    kk.q_rstd.resize_for_overwrite(static_cast<size_t>(N) * d.nh, mem, dev);
    kk.k_rstd.resize_for_overwrite(static_cast<size_t>(N) * d.nkv, mem, dev);
    q_lin = kk.q_raw.data();
    k_lin = kk.k_raw.data();
  }
  {
    const k::Bf16InputScope x_once(x, static_cast<size_t>(N) * H);  // q, k and v read the same rows
    k::linear_forward(q_lin, x, w.q, N, H, A);
    k::linear_forward(k_lin, x, w.k, N, H, Akv);
    k::linear_forward(v, x, w.v, N, H, Akv);
  }
  if (w.q_bias) {
    bias_forward(q_lin, w.q_bias, N, A, s);
    bias_forward(k_lin, w.k_bias, N, Akv, s);
    bias_forward(v, w.v_bias, N, Akv, s);
  }
  if (qk_norm) {  // HF Qwen3: q_norm(q_proj(x).view(..., head_dim)), before RoPE; rows are heads
    k::rmsnorm_forward(q, kk.q_rstd.data(), q_lin, w.q_norm, N * d.nh, d.hd, eps);
    k::rmsnorm_forward(k, kk.k_rstd.data(), k_lin, w.k_norm, N * d.nkv, d.hd, eps);
  }
  k::rope_forward(q, rope, d.B, d.T, d.nh, d.hd);
  k::rope_forward(k, rope, d.B, d.T, d.nkv, d.hd);
}

void repeat_kv(float* full, const float* small, const QkvDims& d, QkvScratch& s) {
  // Row i = (token, head h) of full reads row i / rep = (token, h / rep) of small.
  const size_t rows = static_cast<size_t>(d.N()) * d.nh;
  k::gather_rows(full, small, s.iota(rows), rows, d.nh / d.nkv, d.hd);
}

void repeat_kv_backward(float* small, const float* full, const QkvDims& d, QkvScratch& s) {
  // small row t += sum_{j < rep} full row t·rep + j: gather_rows' backward over the same map.
  const size_t rows = static_cast<size_t>(d.N()) * d.nh;
  k::gather_rows_backward(small, full, s.iota(rows), d.N() * d.nkv, d.nh / d.nkv, d.hd);
}

void qkv_backward(float* dx, const QkvGrads& g, float* dq, float* dk, float* dv, const QkvKept& kept,
                  const float* x, const QkvWeights& w, const QkvDims& d, const kernels::RopeTable& rope,
                  QkvScratch& s, MemTracker* work) {
  const int N = d.N(), H = d.H, A = d.A(), Akv = d.Akv();
  k::rope_backward(dq, rope, d.B, d.T, d.nh, d.hd);
  k::rope_backward(dk, rope, d.B, d.T, d.nkv, d.hd);
  Buffer<float> dq_raw, dk_raw;
  if (w.q_norm) {  // back through the per-head RMSNorm (rmsnorm_backward adds: zeroed buffers)
    const Device dev = k::active_device();
    dq_raw.resize(static_cast<size_t>(N) * A, work, dev);
    dk_raw.resize(static_cast<size_t>(N) * Akv, work, dev);
    k::rmsnorm_backward(dq_raw.data(), g.q_norm, dq, kept.q_raw.data(), w.q_norm, kept.q_rstd.data(),
                        N * d.nh, d.hd);
    k::rmsnorm_backward(dk_raw.data(), g.k_norm, dk, kept.k_raw.data(), w.k_norm, kept.k_rstd.data(),
                        N * d.nkv, d.hd);
    dq = dq_raw.data();
    dk = dk_raw.data();
  }
  if (w.q_bias) {
    bias_backward(g.q_bias, dq, N, A, s);
    bias_backward(g.k_bias, dk, N, Akv, s);
    bias_backward(g.v_bias, dv, N, Akv, s);
  }
  const k::Bf16InputScope x_once(x, static_cast<size_t>(N) * H);
  k::linear_backward(dx, g.q, dq, x, w.q, N, H, A);
  k::linear_backward(dx, g.k, dk, x, w.k, N, H, Akv);
  k::linear_backward(dx, g.v, dv, x, w.v, N, H, Akv);
}

}  // namespace moe::model
