// The emulated device behind the SIMT shim's fake CUDA runtime, cuBLAS and CUB: its memory (host
// pages that are PROT_NONE outside device work, so host code that touches device memory without a
// copy faults at once), its work queue (every stream's operations in issue order, run at the next
// synchronising call) and its error state (sticky execution errors, the last launch error).
// Host-compilable; the fakes (cuda_runtime_fake.cpp, cublas_fake.cpp, cub_fake.h) build on it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace moe::simt {

// ---- memory ----
// A device allocation of `bytes` (PROT_NONE until access is open); nullptr when out of memory.
void* device_alloc(size_t bytes);
// false when p is not the start of a device allocation.
bool device_release(void* p);
// The allocation holding [p, p + bytes) (bytes may be 0): true and its start when there is one.
bool device_range(const void* p, size_t bytes, const void** base = nullptr);
size_t device_bytes_in_use();

// While alive, device pages are readable and writable (nested scopes count).
class Access {
 public:
  Access();
  ~Access();
  Access(const Access&) = delete;
  Access& operator=(const Access&) = delete;
};

// ---- work queue ----
// Queues `op` (it runs with device access open, after everything queued before it). `what` names
// it in errors: "kernel count_kernel", "cudaMemcpyAsync", "cublasGemmEx".
void enqueue(const char* what, std::function<void()> op);
// Runs the queue. An operation that fails (throws) makes the error sticky, as a GPU fault does:
// the rest of the queue is dropped and every later call returns cudaErrorLaunchFailure, whose
// string names the operation and why.
cudaError_t flush();

// ---- errors ----
cudaError_t sticky_error();
// The launch error cudaGetLastError returns (and clears); `detail` is appended to its string.
void set_last_error(cudaError_t e, std::string detail);
cudaError_t take_last_error();
cudaError_t peek_last_error();
// The string of `e`, with the detail of the sticky or last error when `e` is that error.
const char* error_string(cudaError_t e);

}  // namespace moe::simt
