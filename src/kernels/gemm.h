// Row-major GEMM on top of CBLAS, and the linear layer in Hugging Face weight layout
// (w is [out, in], y = x · w^T). Every BLAS call of the project goes through here.
// Convention for every *_backward in kernels/: gradients are ADDED into (+=), never overwritten,
// so residual branches and micro-batch accumulation need no copies. Callers zero them.
#pragma once
#include <cstddef>
#include <string>

namespace moe::kernels {

// C[M,N] = alpha · op(A) · op(B) + beta · C, row-major; op(A) is [M,K], op(B) is [K,N].
// lda/ldb/ldc are row strides (elements); pass 0 for the dense default. Where the execution
// context's gemm_bf16() holds on the CPU, A and B are rounded to bf16 (kernels/gemm_bf16_cpu.h);
// sgemm is always fp32.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc);
// What every host GEMM does before its library call: checks the sizes, fills the dense strides
// (lda/ldb/ldc 0: A [M,K] or [K,M] when transposed, B [K,N] or [N,K], C [M,N]), and does the work
// itself when there is no product (M or N 0: nothing; K 0: C = beta · C, as BLAS would, without
// calling it with K = 0). Returns false when nothing is left for the library to do.
bool gemm_prologue(bool trans_a, bool trans_b, int M, int N, int K, int& lda, int& ldb, float beta,
                   float* C, int& ldc);

// One product of a grouped GEMM: C = op(A) · op(B) + beta · C with gemm()'s conventions
// (row-major, row strides, 0 for dense) and alpha 1.
struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int lda = 0;
  const float* B = nullptr;
  int ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int ldc = 0;
};
// Every product of `problems` (independent: no C overlaps another's A, B or C), as gemm() would
// run them one by one: on the CPU exactly that; on CUDA one cublasGemmGroupedBatchedEx call for
// fp32 (the experts of an MoE layer in one launch), per-problem calls for bf16 inputs (the grouped
// call gives bf16 inputs only bf16 outputs, and moetrain keeps fp32 outputs).
void gemm_grouped(const GemmProblem* problems, int count);

// y[T,out] = x[T,in] · w[out,in]^T   (beta = 0: overwrite; accumulate = true: y +=)
void linear_forward(float* y, const float* x, const float* w, int T, int in, int out,
                    bool accumulate = false);
// dx[T,in] += dy · w ; dw[out,in] += dy^T · x. Either output may be nullptr to skip it.
void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int T,
                     int in, int out);

// OpenBLAS picks its kernels from the CPU model at load time; a CPU whose model it does not know
// (a virtual machine reporting "Intel(R) Xeon(R) Processor", say) gets its generic x86-64 kernels
// (core "Prescott"), about 5x slower than the AVX-512 ones on the same core. Called first thing
// in main: when OPENBLAS_CORETYPE is unset, OpenBLAS chose a pre-AVX2 core and the CPU has AVX2
// (Haswell kernels) or AVX-512 (SkylakeX kernels), it sets OPENBLAS_CORETYPE and re-executes the
// program (same pid, same arguments; OpenBLAS reads the variable only when it loads). Returns
// normally otherwise. An explicit OPENBLAS_CORETYPE (scripts/golden.sh pins Prescott) is kept.
// An explicit OPENBLAS_CORETYPE whose kernels this CPU cannot run (SkylakeX without AVX-512, say:
// OpenBLAS would die of SIGILL at the first GEMM) is refused: one line naming it, exit status 2.
void ensure_blas_kernels(char** argv);
// Why this CPU cannot run the OpenBLAS core `core` (e.g. "SkylakeX" without AVX-512), or "" when
// it can (unknown names included: OpenBLAS falls back to a core it supports).
std::string blas_core_unsupported_reason(const char* core);
// The OpenBLAS core in use (e.g. "SkylakeX") and, when moetrain chose it, " (set by moetrain)";
// when the environment chose it, that, and whether this CPU has faster (AVX-512) kernels.
std::string blas_core_description();

// Sets the BLAS thread count (OpenBLAS); 1 is the project default (one thread per rank).
void set_blas_threads(int n);
int blas_threads();


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
// bf16 inputs (converted on the fly when gemm_bf16()) with fp32 accumulation and output.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);
void gemm_grouped(const GemmProblem* problems, int count);
// GFLOP/s of one n×n×n cuBLAS GEMM on the current GPU (fp32, or bf16 inputs with fp32 output;
// inputs already on the device and converted, so this is the GEMM roofline), best of `repeats`
// cudaEvent-timed runs after one warm-up.
double measure_gemm_gflops(int n, int repeats, bool bf16);
}  // namespace cuda

}  // namespace moe::kernels
