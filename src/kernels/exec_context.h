// Where and how the kernels run: the execution context. It holds what a kernel call needs beyond
// its arguments and used to be process state:
//   - the device (CPU or CUDA) and the GEMM precision (fp32, or bf16 inputs with fp32 outputs);
//   - on CUDA, the stream, the cuBLAS handle and the kernels' cached workspaces (kernels/cuda/
//     context.h), charged to the context's scratch tracker;
//   - on the CPU in bf16, oneDNN's stream, its matmul primitives, the open weight and input copies
//     and the operand scratch (kernels/gemm_bf16_cpu.cpp);
//   - the step recorder of the expert parts (kernels/swiglu_mlp.h's MlpStepTimes).
// A Model owns one (model/model.h); its entry points run on it, and the trainer runs each step on
// it. The kernels read the context of the calling thread: the innermost ContextScope, or a
// default CPU fp32 context of the thread's own when none is open. Passing the context through
// every kernel's arguments would change every call site of about a hundred kernels for no gain
// in what a reader can see: a scope says it once, where the work begins.
#pragma once
#include <memory>

#include "core/buffer.h"
#include "core/device.h"

namespace moe::kernels {

struct MlpStepTimes;  // kernels/swiglu_mlp.h
namespace cuda {
class DeviceState;  // kernels/cuda/context.h
struct DeviceStateDeleter {
  void operator()(DeviceState* s) const;
};
}  // namespace cuda
class Bf16CpuState;  // kernels/gemm_bf16_cpu.cpp
struct Bf16CpuStateDeleter {
  void operator()(Bf16CpuState* s) const;
};

class ExecContext {
 public:
  // Throws a one-line error when the device cannot be used (core/device.h's require_device).
  explicit ExecContext(Device device = Device::kCpu, bool gemm_bf16 = false);
  ~ExecContext();
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;

  Device device() const { return device_; }
  bool gemm_bf16() const { return gemm_bf16_; }
  // The device workspaces (CUDA) are charged here; an owner hangs it under its own tracker.
  MemTracker& scratch_memory() { return scratch_; }

  // The expert parts' recorder (null: none); returns the previous one.
  MlpStepTimes* set_mlp_step_times(MlpStepTimes* times);
  MlpStepTimes* mlp_step_times() const { return mlp_times_; }

  // The CUDA stream, handle and workspaces, created on first use (a CUDA context only).
  cuda::DeviceState& cuda();
  // The bf16 CPU GEMM's state, created on first use.
  Bf16CpuState& bf16_cpu();

  // A context for work on a second thread beside this one (the MoE layer's shared experts while
  // its exchange runs, CPU only): the same device and precision, workspaces of its own, no
  // recorder, and the bf16 weight copy of this context read through. Created on first use, and
  // owned by this context.
  ExecContext& worker();
  // The context this one is the worker of, or null.
  ExecContext* parent() const { return parent_; }

 private:
  Device device_;
  bool gemm_bf16_;
  ExecContext* parent_ = nullptr;
  MemTracker scratch_;
  MlpStepTimes* mlp_times_ = nullptr;
  std::unique_ptr<cuda::DeviceState, cuda::DeviceStateDeleter> cuda_;
  std::unique_ptr<Bf16CpuState, Bf16CpuStateDeleter> bf16_cpu_;
  std::unique_ptr<ExecContext> worker_;  // last: destroyed first
};

// The context of the calling thread's kernels.
ExecContext& current_context();

// Runs the kernels of this thread on `ctx` until the scope ends, then on the one before it.
// Scopes nest; each ends in the reverse order it began (a stack per thread).
class ContextScope {
 public:
  explicit ContextScope(ExecContext& ctx);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  ExecContext* previous_;
};

}  // namespace moe::kernels
