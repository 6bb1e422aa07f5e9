// One description per CPU kernel op (ggml's test-backend-ops is the model): an op's entry says
// its shape, how to fill its inputs, its FLOP count, the kernel's forward and backward, a naive
// reference and its error bounds. The same entry runs as the correctness test against the naive
// reference, as the gradient test against finite differences and the += contract
// (tests/test_kernels.cpp), and as a Google Benchmark with its FLOP count as a counter
// (bench/bench_ops.cpp), and, for the ops with a CUDA twin, as the device check of the CUDA kernel
// against the CPU one (tests/cuda/test_cuda_ops.cpp). Adding an op means adding one factory and
// one line in each of test_ops(), bench_ops() and device_ops(). The factories live in three
// files: op_table.cpp (the model's layers), op_table_dense.cpp (GEMM, copies, MLA's head
// assembly, the optimizer), op_table_moe.cpp (the MoE layout and permutation kernels) and
// op_table_router.cpp (the router kernels).
//
// Errors are normalised mean squared errors, nmse = Σ (a - ref)² / Σ ref², bound per op.
// Integer inputs (tokens, targets, offsets, expert ids, row maps) are fixed in the entry; every
// float input of an op with a backward is differentiated. Backward ADDS into the gradients (sized
// like the inputs) given dL/dout; a kernel whose backward overwrites is called on zeroed scratch
// and added. Integer outputs (counts, ids, rows) end the forward's output as floats (exact below
// 2^24) and must equal the reference's exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "test_inputs.h"

namespace moe::ops {

using Vec = std::vector<float>;
using Tensors = std::vector<Vec>;

struct Checker;  // op_device.h
// One check of the device mode: runs the CPU kernel and its kernels::cuda twin on device copies
// of the same inputs and hands every output pair to the Checker (NMSE <= bound; index outputs
// and refusals exact). Gradient outputs start nonzero on both sides: the += contract is checked.
struct DeviceCheck {
  std::string name;  // "rmsnorm_backward dw=null"
  double bound;      // NMSE bound of the float outputs
  std::function<void(Checker&)> run;
};

struct Op {
  std::string name;   // "linear"
  std::string shape;  // "T=5 in=7 out=6"
  // FLOPs of one forward call and of one backward call as written below (where the kernel's
  // backward needs forward's saved state, the backward call reruns the forward: counted in).
  // Exp, log and sqrt count as one FLOP. bytes: the tensors read and written by one forward
  // (for ops that move data rather than compute: embedding).
  double fwd_flops = 0.0, bwd_flops = 0.0, fwd_bytes = 0.0;
  std::function<Tensors(Rng&)> make_inputs;
  std::function<Vec(const Tensors&)> forward;    // the kernel
  std::function<Vec(const Tensors&)> reference;  // naive loops in double
  // Empty for an op without a backward kernel (gemm, the copies, the optimizer, the counting
  // sort, the aux statistics): its gradient tests are not instantiated, its bwd benchmark not
  // registered.
  std::function<void(Tensors& grads, const Tensors& in, const Vec& dout)> backward;
  size_t exact_tail = 0;    // the forward's last exact_tail outputs are integers: compared exactly
  double fwd_nmse = 1e-12;  // nmse(kernel, reference)
  double grad_nmse = 4e-6;  // nmse(analytic, central differences); measured 1e-12 .. 1e-7
  double fd_h = 1e-2;       // central-difference step
  // The device mode at this entry's shape. Filled only where op_table.cpp is compiled with
  // MOETRAIN_OP_DEVICE (moetrain_cuda_tests, tests/cuda/test_cuda_ops.cpp runs device_ops());
  // empty for an op without a CUDA twin (swiglu_mlp: on the device it is the grouped kernel's).
  std::vector<DeviceCheck> device;
};

// Σ (a - ref)² / Σ ref² (Σ (a - ref)² where ref is all zero).
double nmse(const Vec& a, const Vec& ref);
using test_util::randn;  // tests/test_inputs.h

// ---- the ops ----
Op linear_op(int T, int in, int out);
Op rmsnorm_op(int rows, int dim);
// The forward's table is longer than T on purpose (rows past T unused).
Op rope_op(int B, int T, int n_head, int head_dim);
Op attention_op(int B, int T, int n_head, int head_dim);
Op swiglu_op(size_t n);
Op embedding_op(int vocab, int dim, std::vector<int32_t> tokens);
Op cross_entropy_op(int V, std::vector<int32_t> targets);
Op swiglu_mlp_op(int N, int H, int F);
// offsets_E1: exclusive prefix sums of the rows per expert (E + 1 entries).
Op grouped_swiglu_op(int H, int F, std::vector<int32_t> offsets_E1);

// op_table_dense.cpp. gemm: C = alpha·op(A)·op(B) + beta·C0 with row strides padded by `pad`
// (0: dense); bf16 only changes the device check (CUDA bf16 inputs against the CPU's fp32).
Op gemm_op(bool trans_a, bool trans_b, int M, int N, int K, float alpha, float beta, int pad,
           bool bf16 = false);
// One problem per entry of M_P (M = 0 included), sharing N, K and the transposes.
Op gemm_grouped_op(bool trans_a, bool trans_b, std::vector<int> M_P, int N, int K);
Op add_inplace_op(size_t n);
Op copy_fill_op(size_t n);  // copy of n, fill_zero of the first n - 1
Op copy_cols_op(size_t rows, int from, int to);
// MLA's head assembly (kernels/mla.h); yarn: a YaRN-scaled rotary table.
Op mla_heads_op(int B, int T, int nh, int dn, int dr, int dv, bool yarn);
Op adamw_op(size_t n, int step);
Op sum_squares_op(size_t n);

// op_table_moe.cpp (op_table_router.cpp for the router). The layout's ids: T tokens × k distinct experts of E, expert `skip` never
// chosen (-1: none); `bad_id` puts expert id E at pair 3 (the device check is the refusal).
Op count_pairs_op(int T, int k, int E, int skip, bool bad_id = false);
// The offsets: all kept, capacity drops, padded E·C.
enum class Offsets {
  kFull,
  kCapacity,
  kPadded
};
Op place_pairs_op(int T, int k, int E, int skip, Offsets kind);
// The row kernels on a padded layout with capacity drops (rows of -1 and slots of -1).
Op gather_rows_op(int T, int k, int E, int H);
Op combine_rows_op(int T, int k, int E, int H, bool accumulate);
// The expert-parallel regroup: row_of_i a permutation of n rows into n + 5.
Op scatter_rows_op(int n, int H);
Op gather_rows_by_index_op(int n, int H);
Op gather_scaled_rows_op(int n, int H);
// The router: softmax, sigmoid with a selection bias and a scale (DeepSeek-V3), and group-limited
// selection (4 groups) of either; aux: the output adds the aux term Σ_t Σ_e c[t/S, e]·s'[t, e]
// (s' the score, normalised over the row for sigmoid) with fixed c, over B = 2 sequences when T
// is even.
enum class Scoring {
  kSoftmax,
  kSigmoidBias,
  kGroupsSoftmax,
  kGroupsSigmoidBias
};
Op router_topk_op(int T, int E, int k, bool renorm, Scoring scoring, bool aux);
Op router_aux_stats_op(int T, int E, int k, bool renorm, bool normalise);

// The table at the test shapes (small: every input element is finite-differenced), at the
// benchmark shapes (the model's sizes) and at the device shapes (the CUDA kernels' block and
// warp edges, empty inputs, refusals).
const std::vector<Op>& test_ops();
std::vector<Op> bench_ops();
#ifdef MOETRAIN_OP_DEVICE
std::vector<Op> device_ops();
#endif

// ---- the factories' helpers ----
// d += x elementwise: a kernel that overwrites its gradient, added per the table's contract.
void add_into(Vec& d, const Vec& x);
// Integer (or double) outputs appended as floats.
template <class T>
void append(Vec& out, const std::vector<T>& v) {
  for (T x : v) out.push_back(static_cast<float>(x));
}
// Expert ids of T tokens × k distinct slots in [0, E), expert `skip` never chosen (-1: none).
std::vector<int32_t> topk_ids(Rng& rng, int T, int k, int E, int skip);

// ---- naive references (plain loops in double, no BLAS, independent of src/kernels) ----
namespace ref {
// y[T,out] = x[T,in] · w[out,in]^T
Vec linear(const Vec& x, const Vec& w, int T, int in, int out);
Vec rmsnorm(const Vec& x, const Vec& w, int rows, int dim, double eps);
}  // namespace ref

}  // namespace moe::ops
