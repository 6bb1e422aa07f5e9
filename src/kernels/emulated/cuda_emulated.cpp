// An emulated CUDA device for CI machines without a GPU (-DMOETRAIN_EMULATE_CUDA=ON): every
// kernels::cuda:: function runs the CPU kernel, while "device" buffers are host pages that are
// inaccessible (PROT_NONE) except inside an emulated kernel or a device_copy (core/device.cpp).
// Host code that reads or writes device memory directly then crashes at once (SIGSEGV), so the
// GPU wiring of the model, the MoE layer, the optimizer and the trainer (every device buffer
// reached only through kernels and device_copy) is tested on every CI run. Kernels whose CUDA
// contract differs from the CPU's are adapted here: bf16 GEMM rounds its inputs to bf16 like
// cuBLAS's bf16 path (so bf16 bounds are exercised). Attention is flash-style with the same
// saved state on both devices, so it runs the CPU kernel as is.
// Not a performance model and not a test of the .cu kernels (scripts/gpu_check.sh is).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "kernels/cuda/context.h"
#include "kernels/device_select.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/peak_rate.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/router_ops.h"

namespace moe::kernels {
namespace {

// While alive: device pages are accessible and the active device reads as the CPU, so the CPU
// kernel runs (instead of forwarding back here).
struct KernelScope {
  KernelScope() {
    emulated_kernel_enter();
    emulated_device_access(true);
  }
  ~KernelScope() {
    emulated_device_access(false);
    emulated_kernel_exit();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
};

// A copy of a row-major rows × cols matrix with row stride ld, rounded to bf16.
std::vector<float> rounded(const float* a, int rows, int cols, int ld) {
  std::vector<float> r(static_cast<size_t>(rows) * ld);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) r[static_cast<size_t>(i) * ld + j] = round_to_bf16(a[static_cast<size_t>(i) * ld + j]);
  return r;
}

}  // namespace

namespace cuda {

void init_context() {}
void synchronize(const char*) {}

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  KernelScope scope;
  if (!gemm_bf16() || M == 0 || N == 0 || K == 0) {
    moe::kernels::sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int ra = trans_a ? K : M, ca = trans_a ? M : K, rb = trans_b ? N : K, cb = trans_b ? K : N;
  if (lda == 0) lda = ca;
  if (ldb == 0) ldb = cb;
  const std::vector<float> a = rounded(A, ra, ca, lda), b = rounded(B, rb, cb, ldb);
  moe::kernels::sgemm(trans_a, trans_b, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

double measure_gemm_gflops(int n, int repeats, bool bf16) {
  (void)bf16;
  // The emulated GPU is this CPU: its rate is the CPU's, measured at the CPU's size (a 4096^3
  // GEMM would take a minute here and tell nothing more).
  return moe::kernels::measure_peak_gflops("fp32", {std::min(n, 1024)}, repeats);
}

// The CUDA contract keeps no T×T probabilities (att is sized for the row statistics and a copy of
// out): the emulation recomputes them in backward from q and k.
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim) {
  KernelScope scope;
  moe::kernels::attention_forward(out, att, q, k, v, B, T, n_head, head_dim);
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch) {
  KernelScope scope;
  moe::kernels::attention_backward(dq, dk, dv, dout, q, k, v, att, B, T, n_head, head_dim, scratch);
}

void adamw_update(float* p, const float* g, float* m, float* v, size_t n, const AdamWParams& hp,
                  int step, float grad_scale) {
  KernelScope scope;
  moe::kernels::adamw_update(p, g, m, v, n, hp, step, grad_scale);
}

double sum_squares(const float* x, size_t n) {
  KernelScope scope;
  return moe::kernels::sum_squares(x, n);
}

double cross_entropy_forward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V) {
  KernelScope scope;
  return moe::kernels::cross_entropy_forward(losses, probs, logits, targets, N, V);
}

void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets, int N,
                            int V, float scale) {
  KernelScope scope;
  moe::kernels::cross_entropy_backward(dlogits, probs, targets, N, V, scale);
}

void swiglu_forward(float* h, const float* g, const float* u, size_t n) {
  KernelScope scope;
  moe::kernels::swiglu_forward(h, g, u, n);
}

void swiglu_backward(float* dg, float* du, const float* dh, const float* g, const float* u,
                     size_t n) {
  KernelScope scope;
  moe::kernels::swiglu_backward(dg, du, dh, g, u, n);
}

void swiglu_backward_inplace(float* dg, float* du, const float* g, const float* u, size_t n) {
  KernelScope scope;
  moe::kernels::swiglu_backward_inplace(dg, du, g, u, n);
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int n_tokens, int dim) {
  KernelScope scope;
  moe::kernels::embedding_forward(out, tokens, wte, n_tokens, dim);
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int n_tokens,
                        int dim) {
  KernelScope scope;
  moe::kernels::embedding_backward(dwte, dout, tokens, n_tokens, dim);
}

void add_inplace(float* y, const float* x, size_t n) {
  KernelScope scope;
  moe::kernels::add_inplace(y, x, n);
}

void copy(float* dst, const float* src, size_t n) {
  KernelScope scope;
  moe::kernels::copy(dst, src, n);
}

void fill_zero(float* x, size_t n) {
  KernelScope scope;
  moe::kernels::fill_zero(x, n);
}

void count_pairs_per_expert(int32_t* count_E, const int32_t* topk_idx_TK, size_t P, int E) {
  KernelScope scope;
  moe::kernels::count_pairs_per_expert(count_E, topk_idx_TK, P, E);
}

void place_pairs(int32_t* slot_of_row_R, int32_t* row_of_slot_TK, const int32_t* topk_idx_TK,
                 const int32_t* offsets_E1, size_t P, int E) {
  KernelScope scope;
  moe::kernels::place_pairs(slot_of_row_R, row_of_slot_TK, topk_idx_TK, offsets_E1, P, E);
}

void gather_rows(float* rows_NH, const float* x_TH, const int32_t* slot_of_row_N, size_t N, int k,
                 int H) {
  KernelScope scope;
  moe::kernels::gather_rows(rows_NH, x_TH, slot_of_row_N, N, k, H);
}

void gather_rows_backward(float* dx_TH, const float* drows_NH, const int32_t* row_of_slot_TK, int T,
                          int k, int H) {
  KernelScope scope;
  moe::kernels::gather_rows_backward(dx_TH, drows_NH, row_of_slot_TK, T, k, H);
}

void combine_rows(float* out_TH, const float* y_NH, const float* weight_TK,
                  const int32_t* row_of_slot_TK, int T, int k, int H, bool accumulate) {
  KernelScope scope;
  moe::kernels::combine_rows(out_TH, y_NH, weight_TK, row_of_slot_TK, T, k, H, accumulate);
}

void combine_rows_backward(float* dy_NH, float* dweight_TK, const float* dout_TH, const float* y_NH,
                           const float* weight_TK, const int32_t* row_of_slot_TK, int T, int k,
                           int H) {
  KernelScope scope;
  moe::kernels::combine_rows_backward(dy_NH, dweight_TK, dout_TH, y_NH, weight_TK, row_of_slot_TK, T, k, H);
}

void scatter_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n, int H) {
  KernelScope scope;
  moe::kernels::scatter_rows(dst_NH, src_NH, row_of_i, n, H);
}

void gather_rows_by_index(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n,
                          int H) {
  KernelScope scope;
  moe::kernels::gather_rows_by_index(dst_NH, src_NH, row_of_i, n, H);
}

void gather_scaled_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i,
                        const float* value_n, size_t n, int H) {
  KernelScope scope;
  moe::kernels::gather_scaled_rows(dst_NH, src_NH, row_of_i, value_n, n, H);
}

void gather_scaled_rows_backward(float* dsrc_NH, float* dvalue_n, const float* d_NH,
                                 const float* src_NH, const int32_t* row_of_i, const float* value_n,
                                 size_t n, int H) {
  KernelScope scope;
  moe::kernels::gather_scaled_rows_backward(dsrc_NH, dvalue_n, d_NH, src_NH, row_of_i, value_n, n, H);
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int n_rows, int dim,
                     float eps) {
  KernelScope scope;
  moe::kernels::rmsnorm_forward(out, rstd, x, w, n_rows, dim, eps);
}

void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int n_rows, int dim) {
  KernelScope scope;
  moe::kernels::rmsnorm_backward(dx, dw, dout, x, w, rstd, n_rows, dim);
}

void rope_forward(float* x, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  KernelScope scope;
  moe::kernels::rope_forward(x, table, B, T, n_head, head_dim);
}

void rope_backward(float* dx, const RopeTable& table, int B, int T, int n_head, int head_dim) {
  KernelScope scope;
  moe::kernels::rope_backward(dx, table, B, T, n_head, head_dim);
}

void router_topk(float* scores_TE, int32_t* topk_idx_TK, float* topk_weight_TK, int T, int E, int k,
                 bool renorm, const math::RouterScoring& scoring) {
  KernelScope scope;
  moe::kernels::router_topk(scores_TE, topk_idx_TK, topk_weight_TK, T, E, k, renorm, scoring);
}

void router_topk_backward(float* dlogits_TE, const float* scores_TE, const int32_t* topk_idx_TK,
                          const float* dtopk_weight_TK, int T, int E, int k, bool renorm,
                          const float* aux_coef_BE, int S, float aux_scale,
                          const math::RouterScoring& scoring) {
  KernelScope scope;
  moe::kernels::router_topk_backward(dlogits_TE, scores_TE, topk_idx_TK, dtopk_weight_TK, T, E, k, renorm, aux_coef_BE, S, aux_scale, scoring);
}

void router_aux_stats(double* count_BE, double* score_sum_BE, const int32_t* topk_idx_TK,
                      const float* scores_TE, int T, int E, int k, int B, bool normalise) {
  KernelScope scope;
  moe::kernels::router_aux_stats(count_BE, score_sum_BE, topk_idx_TK, scores_TE, T, E, k, B, normalise);
}

}  // namespace cuda
}  // namespace moe::kernels
