// The CUDA context of this process: one stream and one cuBLAS handle on the selected device,
// created once by set_active_device(Device::kCuda). Host-compilable (no CUDA types here).
#pragma once

namespace moe::kernels::cuda {

// Creates the stream and the cuBLAS handle on the current device (idempotent).
void init_context();
// Waits for every kernel queued so far; throws naming the first asynchronous error.
void synchronize(const char* where);

}  // namespace moe::kernels::cuda
