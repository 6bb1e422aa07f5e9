// What the SIMT shim refuses, each in a child process (a kernel fault is sticky for the rest of a
// CUDA context, as on a GPU): a launch the driver would refuse, a divergent __syncthreads, a
// shuffle whose mask leaves out a lane that never arrives, dynamic shared memory past the default
// limit, an invalid cuBLAS argument, a write past a dynamic shared-memory size, and host code
// touching device memory. Each must end with one line naming the kernel or call (or, for the two
// memory faults, a SIGSEGV), never a hang. Emulated builds only.
#ifdef MOETRAIN_EMULATED_CUDA
#include <cublas_v2.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace {

__global__ void big_block_kernel(float* x) { x[threadIdx.x] = 1.0f; }

__global__ void divergent_barrier_kernel(float* x) {
  if (threadIdx.x < 10) return;  // these threads never reach the barrier
  __syncthreads();
  x[threadIdx.x] = 1.0f;
}

__global__ void partial_shuffle_kernel(float* x) {
  if (threadIdx.x < 16) x[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 3);  // lanes 16-31 absent
}

__global__ void shared_kernel(float* x, int n) {
  MOE_DYNAMIC_SHARED(float, sm);
  for (int i = threadIdx.x; i < n; i += blockDim.x) sm[i] = 1.0f;  // n past the launch's size
  __syncthreads();
  if (threadIdx.x == 0) x[0] = sm[0];
}

struct Outcome {
  int signal = 0;       // the child died of this signal
  int exit_code = 0;    // or exited with this code (AddressSanitizer reports a SEGV and exits 1)
  std::string message;  // the line it printed, if it got that far
};

// Runs `body` in a child; its result line comes back through a pipe.
Outcome in_child(const std::function<std::string()>& body) {
  int fd[2];
  if (pipe(fd) != 0) return {0, 0, "pipe failed"};
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    std::string line;
    try {
      line = body();
    } catch (const std::exception& e) {
      line = e.what();
    }
    if (write(fd[1], line.data(), line.size()) < 0) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return {WTERMSIG(status), 0, got};
  return {0, WEXITSTATUS(status), got};
}

float* device_floats(size_t n) {
  void* p = nullptr;
  MOE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  return static_cast<float*>(p);
}

// An 8x8x8 cublasGemmEx on one device buffer with inputs of type `ab` and leading dimension `lda`
// and an output of type `c`: "accepted" if the fake cuBLAS takes it, else its error line.
std::string gemm_8x8x8(cudaDataType_t ab, int lda, cudaDataType_t c) {
  cublasHandle_t h = nullptr;
  MOE_CUBLAS_CHECK(cublasCreate(&h));
  float* a = device_floats(64);
  const float one = 1.0f, zero = 0.0f;
  MOE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, a, ab, lda, a, ab, 8,
                                &zero, a, c, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return "accepted";
}

}  // namespace

// One line per case; returns (cases, failed).
std::pair<int, int> run_simt_refusals() {
  struct Case {
    const char* name;
    std::function<std::string()> body;
    std::vector<const char*> must_say;  // substrings of the one line (empty: a SIGSEGV is expected)
  };
  const std::vector<Case> cases = {
      {"launch of 2048 threads per block refused",
       [] {
         float* x = device_floats(2048);
         MOE_LAUNCH(big_block_kernel, 1, 2048, 0, nullptr)(x);
         MOE_CUDA_LAUNCHED("big_block_kernel");
         return std::string("launched");
       },
       {"big_block_kernel", "invalid configuration argument", "2048 threads", "1024"}},
      {"empty grid refused",
       [] {
         float* x = device_floats(1);
         MOE_LAUNCH(big_block_kernel, 0, 32, 0, nullptr)(x);
         MOE_CUDA_LAUNCHED("big_block_kernel");
         return std::string("launched");
       },
       {"big_block_kernel", "empty launch"}},
      {"64 KiB of dynamic shared memory without the opt-in refused",
       [] {
         float* x = device_floats(1);
         MOE_LAUNCH(shared_kernel, 1, 32, 64 << 10, nullptr)(x, 16);
         MOE_CUDA_LAUNCHED("shared_kernel");
         return std::string("launched");
       },
       {"shared_kernel", "65536 bytes of dynamic shared memory", "cudaFuncSetAttribute"}},
      {"divergent __syncthreads is an error, not a hang",
       [] {
         float* x = device_floats(64);
         MOE_LAUNCH(divergent_barrier_kernel, 1, 64, 0, nullptr)(x);
         MOE_CUDA_LAUNCHED("divergent_barrier_kernel");
         moe::kernels::cuda::synchronize("divergent test");
         return std::string("completed");
       },
       {"divergent_barrier_kernel", "divergent __syncthreads", "54 of 64 threads arrived", "10 exited"}},
      {"a shuffle missing half its lanes is an error, not a hang",
       [] {
         float* x = device_floats(32);
         MOE_LAUNCH(partial_shuffle_kernel, 1, 32, 0, nullptr)(x);
         moe::kernels::cuda::synchronize("shuffle test");
         return std::string("completed");
       },
       {"partial_shuffle_kernel", "__shfl_sync", "mask 0xffffffff", "lanes 0xffff0000 exited"}},
      {"cublasGemmEx with lda below the rows of A refused",
       [] { return gemm_8x8x8(CUDA_R_32F, 4, CUDA_R_32F); },
       {"cublasGemmEx", "CUBLAS_STATUS_INVALID_VALUE", "lda=4 < max(1, 8)"}},
      {"cublasGemmEx with bf16 inputs and an fp64 output refused",
       [] { return gemm_8x8x8(CUDA_R_16BF, 8, CUDA_R_64F); },
       {"cublasGemmEx", "CUBLAS_STATUS_NOT_SUPPORTED"}},
      {"a write past the dynamic shared memory faults",
       [] {
         float* x = device_floats(1);
         MOE_LAUNCH(shared_kernel, 1, 32, 16 * sizeof(float), nullptr)(x, 1024 + 16);
         moe::kernels::cuda::synchronize("shared test");
         return std::string("completed");
       },
       {}},
      {"host code reading device memory faults (the PROT_NONE rule)",
       [] {
         float* x = device_floats(16);
         volatile float v = x[3];
         (void)v;
         return std::string("read");
       },
       {}},
  };
  int failed = 0;
  for (const Case& c : cases) {
    const Outcome o = in_child(c.body);
    bool ok;
    if (c.must_say.empty()) {
      // the fault kills the child, or (under ASan) is reported naming the source line
      ok = o.signal == SIGSEGV || (o.exit_code != 0 && o.message.empty());
    } else {
      ok = o.signal == 0 && o.message.find('\n') == std::string::npos;
      for (const char* s : c.must_say) ok = ok && o.message.find(s) != std::string::npos;
    }
    if (!ok) ++failed;
    const std::string what = o.signal            ? std::string(strsignal(o.signal))
                             : o.message.empty() ? "exit " + std::to_string(o.exit_code)
                                                 : o.message;
    std::printf("%-62s %s: %s\n", c.name, ok ? "PASS" : "FAIL", what.c_str());
  }
  return {static_cast<int>(cases.size()), failed};
}
#endif
