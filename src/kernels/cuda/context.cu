// The CUDA state of an execution context: its stream, cuBLAS handle and workspaces. See
// context.h and kernels/exec_context.h.
#include <array>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/exec_context.h"

namespace moe::kernels::cuda {

class DeviceState {
 public:
  explicit DeviceState(MemTracker* scratch) {
    for (Scratch& w : workspaces_) w = Scratch(scratch);
    // The legacy default stream: core/device's cudaMemcpy / cudaMemset are ordered with every
    // kernel and GEMM without events (v1; overlap with communication needs streams and events).
    stream_ = nullptr;
    MOE_CUBLAS_CHECK(cublasCreate(&blas_));
    MOE_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    // fp32 GEMMs stay fp32 (no TF32), so the CUDA backend matches the CPU to fp32 round-off.
    MOE_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
  }
  ~DeviceState() {
    // The workspaces go first (their memory is freed while the device is still in use); a
    // failing destroy cannot be reported from a destructor, and the process is ending the run.
    for (Scratch& w : workspaces_) w = Scratch();
    if (blas_) cublasDestroy(blas_);
  }
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t blas() const { return blas_; }
  Scratch& workspace(Workspace w) { return workspaces_[static_cast<size_t>(w)]; }

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::array<Scratch, static_cast<size_t>(Workspace::kCount)> workspaces_;
};

DeviceState* make_device_state(MemTracker* scratch) { return new DeviceState(scratch); }
void DeviceStateDeleter::operator()(DeviceState* s) const { delete s; }

namespace {
// The current context's CUDA state; a direct call of a CUDA twin (kernels::cuda::fn) outside any
// CUDA context, as the device tests and the GPU's peak measurement make, runs on a CUDA context
// of the calling thread's own. It is never destroyed: its workspaces and handle would otherwise be
// freed while the CUDA runtime shuts down at exit.
DeviceState& state() {
  ExecContext& ctx = current_context();
  if (ctx.device() == Device::kCuda) return ctx.cuda();
  thread_local ExecContext* const own = new ExecContext(Device::kCuda);
  return own->cuda();
}
}  // namespace

cudaStream_t stream() { return state().stream(); }
cublasHandle_t blas() { return state().blas(); }
Scratch& workspace(Workspace w) { return state().workspace(w); }

void synchronize(const char* where) {
  cudaError_t e = cudaStreamSynchronize(stream());
  if (e != cudaSuccess) throw Error(str_cat(where, ": CUDA error: ", cudaGetErrorString(e)));
}

}  // namespace moe::kernels::cuda
