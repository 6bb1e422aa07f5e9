// bf16 GEMM on the CPU (--precision bf16 with --device cpu): inputs rounded to bf16 (nearest,
// ties to even), fp32 accumulation and fp32 output, through oneDNN's matmul (the AVX-512 BF16 /
// AMX kernels; Debian's OpenBLAS 0.3.21 has no cblas_sbgemm). kernels::gemm forwards here where
// the execution context's GEMMs run in bf16 on the CPU (kernels/exec_context.h), so the model and
// the MoE layer call one GEMM as in fp32.
//
// Weights: converting a weight matrix on every GEMM is memory-bound work repeated per micro-batch
// and per pass. A Bf16WeightScope holds a bf16 copy of fp32 blocks (the model's parameters),
// converted once when it opens; GEMM operands inside the block read the copy while the scope is
// open. The caller opens it where the weights cannot change (one step's forward and backward) and
// closes it before the optimizer; adamw_update on a pointer inside an open block also drops the
// copy, so a stale copy can never be read (the GEMM then converts the operand itself).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe::kernels {

class Bf16CpuState;  // an execution context's bf16 state (gemm_bf16_cpu.cpp)

// Empty when bf16 GEMMs run here; otherwise one line saying why not (a build without oneDNN, or
// a CPU without AVX-512 BF16, as this CPU or oneDNN's DNNL_MAX_CPU_ISA reports it).
std::string bf16_cpu_unavailable_reason();
inline bool bf16_cpu_available() { return bf16_cpu_unavailable_reason().empty(); }

// Same contract as kernels::gemm (row-major, row strides, 0 = dense), bf16 inputs.
void gemm_bf16_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                   int lda, const float* B, int ldb, float beta, float* C, int ldc);

// One n×n×n product on inputs already in bf16 (no conversion: the bf16 roofline that
// kernels::measure_peak_gflops(Precision::kBf16) times); its buffers are kept for the next call.
void bf16_roofline_product(int n);

// oneDNN's OpenMP threads (one rank, one thread by default: never more than --threads).
void set_bf16_cpu_threads(int n);

// x rounded to the nearest bf16 (ties to even), kept as a float: what a bf16 GEMM input holds.
float round_to_bf16(float x);

// See the file comment. Not copyable; one open scope at a time per execution context.
class Bf16WeightScope {
 public:
  explicit Bf16WeightScope(const std::vector<std::pair<const float*, size_t>>& blocks);
  Bf16WeightScope(const float* block, size_t n);
  ~Bf16WeightScope();
  Bf16WeightScope(const Bf16WeightScope&) = delete;
  Bf16WeightScope& operator=(const Bf16WeightScope&) = delete;

 private:
  Bf16CpuState* open_ = nullptr;  // the context whose weight copy this scope opened, or null
};
// An input read by several GEMMs (q, k and v read the same normed rows; linear backward reads dy
// twice): while the scope is open, GEMM operands that lie inside [p, p + n) read one bf16 copy of
// the block, converted on the first such read, instead of converting it per GEMM. The caller
// promises the block does not change while the scope is open; a bf16 GEMM that writes into it
// is an error. Scopes nest (at most kMaxInputScopes open); a no-op where GEMMs do not run in bf16
// on the CPU.
class Bf16InputScope {
 public:
  static constexpr int kMaxInputScopes = 4;
  Bf16InputScope(const float* p, size_t n);
  ~Bf16InputScope();
  Bf16InputScope(const Bf16InputScope&) = delete;
  Bf16InputScope& operator=(const Bf16InputScope&) = delete;

 private:
  Bf16CpuState* state_ = nullptr;  // the context whose input stack this scope is on, or null
};
// How many activation blocks the open input scopes have converted so far (tests).
int64_t bf16_input_conversions();

// Drops the open scope's copy when p lies inside its block (the weights are about to change).
void invalidate_bf16_weights(const float* p);
// How many GEMM operands read the weight copy so far (tests: the copy is used, then not).
int64_t bf16_weight_copy_reads();

}  // namespace moe::kernels
