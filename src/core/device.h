// Where a buffer lives and how its bytes are obtained: the device seam of the whole project.
// Every Buffer allocates through device_alloc, so host and CUDA memory are charged to the same
// MemTrackers and the model never branches on the device to allocate. The CUDA side is compiled
// in only when the build has the CUDA backend (MOETRAIN_HAVE_CUDA); otherwise asking for it is a
// clear error, never a crash.
#pragma once
#include <cstddef>
#include <string>

#include "core/modes.h"  // Device, name(Device), parse_device

namespace moe {

// True when this binary was built with the CUDA backend.
bool cuda_built();
// Number of visible CUDA devices; 0 without a CUDA build, a driver or a GPU. `why` (optional)
// receives the runtime's reason when there is none.
int cuda_device_count(std::string* why = nullptr);
// Throws a one-line moe::Error unless `d` can be used in this process: names the flag (`what`),
// and says whether the build or the machine lacks CUDA.
void require_device(Device d, const char* what);
// Selects the GPU of this rank: local_rank modulo the visible device count. No-op for kCpu.
// Returns the device index chosen (-1 for kCpu).
int select_device(Device d, int local_rank);
// Free and total bytes of the current CUDA device (0, 0 without one).
void cuda_mem_info(size_t* free_bytes, size_t* total_bytes);

// Zero-filled, 64-byte aligned allocation of `bytes` on `d`. Throws a moe::Error naming the bytes
// (and, on CUDA, the free bytes) when it cannot be had; never returns null for bytes > 0.
void* device_alloc_zeroed(Device d, size_t bytes);
// The same without zeroing, for buffers their first use writes whole (a β = 0 GEMM output, a
// copy). Sanitizer and debug builds fill host memory with 0xFF bytes (NaN floats) instead, so a
// buffer that is not wholly written shows in the results. CUDA memory is still zeroed (cheap
// there, and no build here checks the CUDA kernels' writes).
void* device_alloc_uninit(Device d, size_t bytes);
// Keeps freed host memory mapped for the next allocation instead of handing it back to the OS
// (glibc: no heap trimming, a fixed 32 MiB mmap threshold). A training step frees and allocates
// the same buffers every micro-batch; returned pages come back as page faults and kernel zeroing
// (about 3,300 faults a step of the tiny model, 4-8% of it). The process keeps its high-water
// heap. An explicit MALLOC_TRIM_THRESHOLD_ or MALLOC_MMAP_THRESHOLD_ in the environment is left as
// it is. Returns true when it changed the allocator's settings.
bool keep_host_heap();  // false (nothing done) in SMPI builds and off glibc
void device_free(Device d, void* p);
void device_memset_zero(Device d, void* p, size_t bytes);
// Copies between any two of host and device memory (synchronous with respect to the host).
void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes);
// Where the memory at `p` lives: kCuda for an address inside a device allocation of this process
// (what CUDA-aware MPI asks of a pointer), kCpu for anything else, null included. Costs nothing
// until the process has allocated device memory; then one runtime query (cudaPointerGetAttributes).
// The communication layer uses it to stage device buffers through the host.
Device device_of(const void* p);


}  // namespace moe
