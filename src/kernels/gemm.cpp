// Row-major GEMM and the linear layer on top of CBLAS (OpenBLAS). See gemm.h.
#include "kernels/gemm.h"

#include <cblas.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/gemm_bf16_cpu.h"
#include "core/timer.h"

namespace moe::kernels {
namespace {
// bf16 GEMM inputs on the CPU backend.
bool cpu_gemm_bf16() { return gemm_bf16(); }
}  // namespace

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  MOE_CUDA_DISPATCH(gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (cpu_gemm_bf16()) return gemm_bf16_cpu(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  sgemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool gemm_prologue(bool trans_a, bool trans_b, int M, int N, int K, int& lda, int& ldb, float beta,
                   float* C, int& ldc) {
  MOE_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=", M, " N=", N, " K=", K);
  if (M == 0 || N == 0) return false;
  if (lda == 0) lda = trans_a ? M : K;
  if (ldb == 0) ldb = trans_b ? K : N;
  if (ldc == 0) ldc = N;
  if (K == 0) {
    for (int i = 0; i < M; ++i) {
      float* c = C + static_cast<size_t>(i) * ldc;
      for (int j = 0; j < N; ++j) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
    }
    return false;
  }
  return true;
}

void sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
           const float* B, int ldb, float beta, float* C, int ldc) {
  if (!gemm_prologue(trans_a, trans_b, M, N, K, lda, ldb, beta, C, ldc)) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_grouped(const GemmProblem* problems, int count) {
  MOE_CHECK(count >= 0 && (count == 0 || problems), "gemm_grouped: ", count, " problems");
  MOE_CUDA_DISPATCH(gemm_grouped, problems, count);
  for (int i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    gemm(p.trans_a, p.trans_b, p.M, p.N, p.K, 1.0f, p.A, p.lda, p.B, p.ldb, p.beta, p.C, p.ldc);
  }
}

void linear_forward(float* y, const float* x, const float* w, int T, int in, int out,
                    bool accumulate) {
  // y[T,out] = x[T,in] · w[out,in]^T
  gemm(false, true, T, out, in, 1.0f, x, 0, w, 0, accumulate ? 1.0f : 0.0f, y, 0);
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, int T,
                     int in, int out) {
  const Bf16InputScope dy_once(dx && dw ? dy : nullptr, dx && dw ? static_cast<size_t>(T) * out : 0);
  // dx[T,in] += dy[T,out] · w[out,in]
  if (dx) gemm(false, false, T, in, out, 1.0f, dy, 0, w, 0, 1.0f, dx, 0);
  // dw[out,in] += dy^T[out,T] · x[T,in]
  if (dw) gemm(true, false, out, in, T, 1.0f, dy, 0, x, 0, 1.0f, dw, 0);
}

namespace {
// Set (to "1") in the environment of the re-executed program, so that it never loops.
constexpr const char* kReexecMark = "MOETRAIN_BLAS_CORE_SET";

// The OpenBLAS cores without AVX2 kernels: the generic fallback and older microarchitectures.
bool is_pre_avx2_core(const char* core) {
  static const char* const kOld[] = {"prescott", "core2", "penryn", "dunnington", "nehalem",
                                     "atom", "sandybridge", "katmai", "coppermine", "northwood",
                                     "banias", "opteron", "barcelona", "bobcat", "bulldozer",
                                     "piledriver", "steamroller", "excavator"};
  for (const char* old : kOld)
    if (strcasecmp(core, old) == 0) return true;
  return false;
}

bool cpu_has_avx512_blas() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// The OpenBLAS core whose kernels this CPU runs best, or nullptr (none beyond the baseline).
const char* best_blas_core() {
  if (cpu_has_avx512_blas()) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

// OpenBLAS cores with AVX-512 sgemm kernels (OpenBLAS 0.3.21's names).
bool is_avx512_core(const char* core) {
  return strcasecmp(core, "skylakex") == 0 || strcasecmp(core, "cooperlake") == 0 ||
         strcasecmp(core, "sapphirerapids") == 0;
}
// OpenBLAS cores whose kernels use AVX2 and FMA (0.3.21's names; the AVX-512 ones above too).
bool is_avx2_core(const char* core) {
  return strcasecmp(core, "haswell") == 0 || strcasecmp(core, "zen") == 0 || is_avx512_core(core);
}
}  // namespace

std::string blas_core_unsupported_reason(const char* core) {
  if (core == nullptr) return {};
  if (is_avx512_core(core) && !cpu_has_avx512_blas())
    return str_cat("its kernels need AVX-512 (F, BW, VL, DQ), which this CPU lacks; ",
                   best_blas_core() ? str_cat("use ", best_blas_core(), " or unset it")
                                    : std::string("use Prescott or unset it"));
  if (is_avx2_core(core) && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return "its kernels need AVX2 and FMA, which this CPU lacks; use Prescott or unset it";
  return {};
}

void ensure_blas_kernels(char** argv) {
  if (const char* env = std::getenv("OPENBLAS_CORETYPE"); env != nullptr) {
    // OpenBLAS loads the kernels it is told to and dies of SIGILL at the first GEMM when this CPU
    // cannot run them: refuse here, naming the variable, instead.
    const std::string why = blas_core_unsupported_reason(openblas_get_corename());
    if (!why.empty()) {
      std::fprintf(stderr, "moetrain: error: OPENBLAS_CORETYPE=%s: %s\n", env, why.c_str());
      std::exit(2);
    }
    return;
  }
  if (std::getenv(kReexecMark) != nullptr) return;
  const char* core = openblas_get_corename();
  if (core == nullptr || !is_pre_avx2_core(core)) return;
  const char* want = best_blas_core();
  if (want == nullptr) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  setenv(kReexecMark, "1", 1);
  execv("/proc/self/exe", argv);
  // No /proc (or no permission): run on with the slow kernels, and say so once.
  std::fprintf(stderr, "moetrain: warning: OpenBLAS chose its generic '%s' kernels for this CPU and "
                       "re-executing with OPENBLAS_CORETYPE=%s failed (%s); set it in the environment\n",
               core, want, std::strerror(errno));
  unsetenv("OPENBLAS_CORETYPE");
}

std::string blas_core_description() {
  const char* core = openblas_get_corename();
  std::string s = core != nullptr ? core : "unknown";
  if (std::getenv(kReexecMark) != nullptr) {
    s += " (set by moetrain)";
  } else if (const char* env = std::getenv("OPENBLAS_CORETYPE"); env != nullptr && core != nullptr) {
    // Kept as asked (golden runs pin Prescott), but said: a shell or image that exports an older
    // core halves fp32 GEMMs on an AVX-512 CPU (Haswell kernels on a Zen 5: 120 against 224
    // GFLOP/s a core, 2026-12-04).
    s += str_cat(" (OPENBLAS_CORETYPE=", env, " from the environment");
    if (cpu_has_avx512_blas() && !is_avx512_core(core)) s += "; this CPU runs the faster SkylakeX kernels";
    s += ")";
  }
  return s;
}

void set_blas_threads(int n) {
  MOE_CHECK(n >= 1, "set_blas_threads: thread count must be >= 1, got ", n);
  openblas_set_num_threads(n);
  set_bf16_cpu_threads(n);  // oneDNN's OpenMP threads (the bf16 GEMMs): the same count
}

int blas_threads() { return openblas_get_num_threads(); }


}  // namespace moe::kernels
