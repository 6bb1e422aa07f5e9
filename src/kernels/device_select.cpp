// The active kernel device of this process. See device_select.h.
#include "kernels/device_select.h"

#ifdef MOETRAIN_HAVE_CUDA
#include "kernels/cuda/context.h"
#endif

namespace moe::kernels {
namespace {
Device g_device = Device::kCpu;
bool g_gemm_bf16 = false;
}  // namespace

void set_active_device(Device d) {
  require_device(d, "--device");
#ifdef MOETRAIN_HAVE_CUDA
  if (d == Device::kCuda) cuda::init_context();
#endif
  g_device = d;
}

Device active_device() { return g_device; }

void device_synchronize() {
#ifdef MOETRAIN_HAVE_CUDA
  if (g_device == Device::kCuda) cuda::synchronize("device_synchronize");
#endif
}

MemTracker& cuda_scratch_memory() {
  static auto* t = new MemTracker;  // never destroyed: the Scratch buffers release at exit
  return *t;
}

void set_gemm_bf16(bool on) { g_gemm_bf16 = on; }
bool gemm_bf16() { return g_gemm_bf16; }

}  // namespace moe::kernels
