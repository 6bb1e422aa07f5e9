// Host and CUDA allocation behind one seam. See device.h. The CUDA calls are the runtime API only
// (cuda_runtime_api.h compiles with the host compiler), so core/ needs no nvcc. On the emulated
// device (-DMOETRAIN_EMULATE_CUDA=ON) the same calls go to the SIMT shim's runtime
// (kernels/simt/simt_device.cpp), whose memory faults when host code touches it without a copy.
#include "core/device.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#if defined(__GLIBC__) && !defined(MOETRAIN_SMPI)  // SMPI's headers redefine malloc and friends
#include <malloc.h>
#define MOE_GLIBC_MALLOPT 1
#endif
#ifdef MOETRAIN_SMPI
#include <unordered_map>
#endif

#include "core/error.h"

#if defined(MOETRAIN_HAVE_CUDA)
#define MOE_REAL_CUDA 1
#include <cuda_runtime_api.h>
#endif

namespace moe {

namespace {
// Set by the first device allocation: before it, no pointer can be device memory.
std::atomic<bool> g_device_allocated{false};
#ifdef MOETRAIN_SMPI
// SMPI's shared malloc (smpi/auto-shared-malloc-thresh) maps one block's pages into every rank,
// so the raw pointer cannot live inside the block (the other ranks' would overwrite it): each
// rank keeps its own (SMPI privatises this per rank).
std::unordered_map<void*, void*>& smpi_raw_pointers() {
  static std::unordered_map<void*, void*> raw;
  return raw;
}
#endif
}  // namespace


bool cuda_built() {
#ifdef MOETRAIN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count(std::string* why) {
#if defined(MOE_REAL_CUDA)
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear the sticky error of a failed probe
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
#else
  if (why) *why = "this build has no CUDA backend";
  return 0;
#endif
}

void require_device(Device d, const char* what) {
  if (d == Device::kCpu) return;
  MOE_CHECK(cuda_built(), what, " cuda: this moetrain was built without the CUDA backend "
                                "(configure with -DMOETRAIN_CUDA=ON on a machine with nvcc)");
  std::string why;
  int n = cuda_device_count(&why);
  MOE_CHECK(n > 0, what, " cuda: no usable GPU (", why, ")");
}

int select_device(Device d, int local_rank) {
  if (d == Device::kCpu) return -1;
  require_device(d, "--device");
#ifdef MOE_REAL_CUDA
  int n = cuda_device_count();
  int dev = (local_rank < 0 ? 0 : local_rank) % n;
  cudaError_t e = cudaSetDevice(dev);
  MOE_CHECK(e == cudaSuccess, "cudaSetDevice(", dev, "): ", cudaGetErrorString(e));
  return dev;
#else
  return -1;
#endif
}

void cuda_mem_info(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = 0;
  *total_bytes = 0;
#ifdef MOE_REAL_CUDA
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    *free_bytes = *total_bytes = 0;
  }
#endif
}

namespace {

// Uninitialized host memory is filled with 0xFF bytes (a NaN in every float) in sanitizer and
// debug builds, so a buffer taken for overwrite that is not wholly written shows in the results.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kPoisonUninit = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kPoisonUninit = true;
#else
constexpr bool kPoisonUninit = false;
#endif
#else
constexpr bool kPoisonUninit = false;
#endif

void* device_alloc(Device d, size_t bytes, bool zeroed) {
  if (bytes == 0) return nullptr;
  MOE_CHECK(bytes <= SIZE_MAX - 63, "allocation of ", bytes, " bytes is too large");
  const size_t padded = (bytes + 63) / 64 * 64;
  if (d == Device::kCpu) {
    // calloc, aligned by hand (the original pointer sits just below the aligned one): large
    // blocks come from the OS already zeroed, so pages are touched only where they are written.
    void* raw = zeroed ? std::calloc(1, padded + 64) : std::malloc(padded + 64);
    MOE_CHECK(raw != nullptr, "out of host memory: could not allocate ", padded, " bytes");
    if (!zeroed && kPoisonUninit) std::memset(raw, 0xFF, padded + 64);
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + 64) & ~uintptr_t{63};
#ifdef MOETRAIN_SMPI
    smpi_raw_pointers()[reinterpret_cast<void*>(aligned)] = raw;
#else
    reinterpret_cast<void**>(aligned)[-1] = raw;
#endif
    return reinterpret_cast<void*>(aligned);
  }
#ifdef MOE_REAL_CUDA
  void* p = nullptr;
#ifdef MOETRAIN_EMULATED_CUDA
  // The emulated device ends each allocation at a guard page: ask for the bytes themselves, so
  // a kernel that runs past them faults instead of landing in padding.
  const size_t padded_dev = bytes;
#else
  const size_t padded_dev = padded;
#endif
  cudaError_t e = cudaMalloc(&p, padded_dev);  // 256-byte aligned (4 on the emulated device)
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cuda_mem_info(&free_b, &total_b);
    throw Error(str_cat("out of GPU memory: could not allocate ", padded_dev, " bytes (", free_b,
                        " of ", total_b, " bytes free): ", cudaGetErrorString(e)));
  }
  // Zeroed even when asked not to be: a memset at GPU bandwidth costs little, and the CUDA
  // kernels' writes are not checked by a poisoning build here (no GPU in CI).
  (void)zeroed;
  e = cudaMemset(p, 0, padded_dev);
  MOE_CHECK(e == cudaSuccess, "cudaMemset of ", padded_dev, " bytes: ", cudaGetErrorString(e));
  g_device_allocated.store(true, std::memory_order_relaxed);
  return p;
#else
  require_device(d, "allocation on");
  return nullptr;
#endif
}

}  // namespace

void* device_alloc_zeroed(Device d, size_t bytes) { return device_alloc(d, bytes, true); }
void* device_alloc_uninit(Device d, size_t bytes) { return device_alloc(d, bytes, false); }

bool keep_host_heap() {
#ifdef MOE_GLIBC_MALLOPT
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("MALLOC_MMAP_THRESHOLD_")) return false;
  // The largest threshold glibc accepts on 64-bit (its dynamic threshold stops there too); setting
  // it also turns the dynamic one off, so blocks up to it come from the heap from the start.
  constexpr int kMmapThreshold = 32 << 20;
  constexpr int kNoTrim = 0x7fffffff;  // 2 GiB - 1 of free heap top before it is trimmed
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kNoTrim) == 1;
#else
  return false;
#endif
}

void device_free(Device d, void* p) {
  if (!p) return;
  if (d == Device::kCpu) {
#ifdef MOETRAIN_SMPI
    auto it = smpi_raw_pointers().find(p);
    if (it == smpi_raw_pointers().end()) return;  // not from device_alloc_zeroed (a bug; never throw here)
    std::free(it->second);
    smpi_raw_pointers().erase(it);
#else
    std::free(static_cast<void**>(p)[-1]);
#endif
    return;
  }
#ifdef MOE_REAL_CUDA
  (void)cudaFree(p);
#endif
}

void device_memset_zero(Device d, void* p, size_t bytes) {
  if (!p || bytes == 0) return;
  if (d == Device::kCpu) {
    std::memset(p, 0, bytes);
    return;
  }
#ifdef MOE_REAL_CUDA
  cudaError_t e = cudaMemset(p, 0, bytes);
  MOE_CHECK(e == cudaSuccess, "cudaMemset of ", bytes, " bytes: ", cudaGetErrorString(e));
#endif
}

void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::kCpu && src_dev == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef MOE_REAL_CUDA
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);  // unified addressing
  MOE_CHECK(e == cudaSuccess, "cudaMemcpy of ", bytes, " bytes (", name(src_dev), " -> ",
            name(dst_dev), "): ", cudaGetErrorString(e));
#else
  require_device(Device::kCuda, "copy to/from");
#endif
}

Device device_of(const void* p) {
  if (!p || !g_device_allocated.load(std::memory_order_relaxed)) return Device::kCpu;
#ifdef MOE_REAL_CUDA
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unregistered host pointer is not an error worth keeping
    return Device::kCpu;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? Device::kCuda
                                                                           : Device::kCpu;
#else
  return Device::kCpu;
#endif
}

}  // namespace moe
