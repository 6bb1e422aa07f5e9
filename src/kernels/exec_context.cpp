// The execution context and the calling thread's current one. See exec_context.h.
#include "kernels/exec_context.h"

#include "core/error.h"

#ifdef MOETRAIN_HAVE_CUDA
#include "kernels/cuda/context.h"
#endif

namespace moe::kernels {
namespace {
thread_local ExecContext* t_current = nullptr;  // the innermost ContextScope's, or null
}  // namespace

// Built without CUDA, the deleter is never reached with a state (cuda() refuses first).
#ifndef MOETRAIN_HAVE_CUDA
void cuda::DeviceStateDeleter::operator()(cuda::DeviceState*) const {}
#endif

ExecContext::ExecContext(Device device, bool gemm_bf16) : device_(device), gemm_bf16_(gemm_bf16) {
  require_device(device, "--device");
}

ExecContext::~ExecContext() = default;

MlpStepTimes* ExecContext::set_mlp_step_times(MlpStepTimes* times) {
  MlpStepTimes* old = mlp_times_;
  mlp_times_ = times;
  return old;
}

cuda::DeviceState& ExecContext::cuda() {
  MOE_CHECK(device_ == Device::kCuda, "the CUDA state of a ", name(device_), " context was asked for");
#ifdef MOETRAIN_HAVE_CUDA
  if (!cuda_) cuda_.reset(cuda::make_device_state(&scratch_));
#endif
  return *cuda_;
}

ExecContext& ExecContext::worker() {
  MOE_CHECK(device_ == Device::kCpu, "a worker context beside a ", name(device_),
            " context: work beside the exchange runs on the CPU only");
  if (!worker_) {
    if (gemm_bf16_) bf16_cpu();  // on this thread: the worker reads its weight copy
    worker_ = std::make_unique<ExecContext>(device_, gemm_bf16_);
    worker_->parent_ = this;
  }
  return *worker_;
}

ExecContext& current_context() {
  thread_local ExecContext cpu_default;  // a thread's kernels before any scope: CPU, fp32
  return t_current ? *t_current : cpu_default;
}

ContextScope::ContextScope(ExecContext& ctx) : previous_(t_current) { t_current = &ctx; }
ContextScope::~ContextScope() { t_current = previous_; }

}  // namespace moe::kernels
