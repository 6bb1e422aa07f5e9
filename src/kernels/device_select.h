// Which device the kernels of this thread run on: the current execution context's
// (kernels/exec_context.h; a rank's model and its step run on the model's context, on the device
// --device chose). Every leaf kernel in kernels/ forwards to its CUDA implementation (namespace
// moe::kernels::cuda, src/kernels/cuda/) when that device is CUDA, so the model, the MoE layer and
// the optimizer call one function per op and never branch on the device. Composite kernels
// (linear, SwiGLU MLP, grouped experts) are built from leaf kernels and need no dispatch.
#pragma once
#include "core/buffer.h"
#include "core/device.h"
#include "kernels/exec_context.h"

namespace moe::kernels {

inline Device active_device() { return current_context().device(); }
inline bool cuda_active() { return active_device() == Device::kCuda; }

// Waits for the kernels queued on the current context (no-op on the CPU): timers call it so that
// a wall-clock interval covers the GPU work it names.
void device_synchronize();

// GEMM input precision of the current context: fp32, or bf16 inputs with fp32 accumulation and
// fp32 outputs (cuBLAS on CUDA, oneDNN on the CPU: kernels/gemm_bf16_cpu.h; callers check
// bf16_cpu_available() first).
inline bool gemm_bf16() { return current_context().gemm_bf16(); }

// Reuses `buf` when it already holds n elements on the active device (a caller that rewrites
// every element, like the MoE layer's activations across steps, then pays no allocation or page
// faults after the first step; a reused buffer stays charged to the tracker it was allocated
// with); reallocates on the active device, charged to `tracker`, otherwise. Either way the
// contents are undefined (Buffer::resize_for_overwrite): the caller writes every element.
template <class T>
void ensure_buffer(Buffer<T>& buf, size_t n, MemTracker* tracker) {
  if (buf.size() != n || buf.device() != active_device())
    buf.resize_for_overwrite(n, tracker, active_device());
}

}  // namespace moe::kernels

// First line of a leaf kernel: forwards the call to kernels::cuda::fn when the active device is
// CUDA. Compiles to nothing without the CUDA backend.
#ifdef MOETRAIN_HAVE_CUDA
#define MOE_CUDA_DISPATCH(fn, ...)                                                   \
  do {                                                                               \
    if (::moe::kernels::cuda_active()) return ::moe::kernels::cuda::fn(__VA_ARGS__); \
  } while (0)
#else
#define MOE_CUDA_DISPATCH(fn, ...) \
  do {                             \
  } while (0)
#endif
