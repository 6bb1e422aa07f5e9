// The emulated device and the CUDA runtime API calls moetrain makes, implemented on it. See
// simt_device.h. Every call checks what the real runtime checks (pointer kinds, ranges inside one
// allocation, device ordinals) and returns its error codes; copies and memsets that the real
// runtime orders on a stream are queued (cudaMemcpyAsync from host memory takes its bytes at the
// call, as a pageable copy does; to host memory, at the stream's synchronisation).
#include "kernels/simt/simt_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "kernels/simt/simt_cpu.h"

namespace moe::simt {
namespace {

// ---- memory ----
// One mapping per allocation, keyed by the mapping's start: the allocation ends at the mapping's
// end, and a PROT_NONE guard page follows, so a kernel reading or writing one element past a
// buffer faults. Allocations are 8-byte aligned where cudaMalloc gives 256 (no kernel here loads
// vectors wider than a double); the up to 7 bytes between the end of an odd-sized buffer and the
// guard page hold 0xFF (NaN), so a read there shows in a sum.
struct Region {
  size_t mapped;     // bytes of the mapping before the guard page
  const char* user;  // what cudaMalloc returned
  size_t bytes;      // what it was asked for
};
std::map<const void*, Region>& regions() {
  static auto* r = new std::map<const void*, Region>;  // never destroyed: static destructors still free device memory
  return *r;
}
// The region whose mapping holds `p`, or nullptr.
const std::pair<const void* const, Region>* mapping_of(const void* p) {
  auto it = regions().upper_bound(p);
  if (it == regions().begin()) return nullptr;
  --it;
  const char* b = static_cast<const char*>(it->first);
  return static_cast<const char*>(p) < b + it->second.mapped ? &*it : nullptr;
}
size_t g_in_use = 0;
int g_access = 0;

// Device pages open only where device work touches them: while an Access is alive, a fault on a
// PROT_NONE device page opens that allocation (the handler below), and the last Access closes
// what was opened. Opening every allocation at every synchronisation walked the page tables of
// the whole model state each time (half of an emulated training step in the kernel's mprotect).
std::vector<std::pair<void*, size_t>>& opened() {
  static auto* v = new std::vector<std::pair<void*, size_t>>;  // never destroyed (see regions)
  return *v;
}
struct sigaction g_old_segv;

void on_segv(int sig, siginfo_t* info, void* uctx) {
  if (g_access > 0) {
    if (const auto* r = mapping_of(info->si_addr)) {
      void* base = const_cast<void*>(r->first);
      if (opened().size() < opened().capacity() &&
          mprotect(base, r->second.mapped, PROT_READ | PROT_WRITE) == 0) {
        opened().emplace_back(base, r->second.mapped);
        return;  // the access runs again, now allowed
      }
    }
  }
  // Not device work touching device memory: whatever handled SIGSEGV before (the default action:
  // a crash, or a sanitizer's report) handles it.
  if (g_old_segv.sa_flags & SA_SIGINFO) {
    g_old_segv.sa_sigaction(sig, info, uctx);
  } else if (g_old_segv.sa_handler == SIG_DFL || g_old_segv.sa_handler == SIG_IGN) {
    sigaction(SIGSEGV, &g_old_segv, nullptr);  // the faulting access repeats and kills
  } else {
    g_old_segv.sa_handler(sig);
  }
}

void install_handler() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    return true;
  }();
  (void)installed;
}

// ---- queue and errors ----
struct Op {
  std::string what;
  std::function<void()> run;
};
std::deque<Op>& queue() {
  static auto* q = new std::deque<Op>;  // never destroyed: static destructors still free device memory
  return *q;
}
cudaError_t g_sticky = cudaSuccess;
std::string g_sticky_detail;
cudaError_t g_last = cudaSuccess;
std::string g_last_detail;
cudaError_t g_taken = cudaSuccess;  // the last error cudaGetLastError returned, and its detail
std::string g_taken_detail;
bool g_flushing = false;

const char* base_string(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "CUDA error";
  }
}

}  // namespace

void* device_alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t used = (bytes + 7) / 8 * 8;
  const size_t mapped = (used + page - 1) / page * page;
  void* p = mmap(nullptr, mapped + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const char* user = static_cast<const char*>(p) + mapped - used;
  if (used > bytes) {
    char* end = static_cast<char*>(p) + mapped;
    mprotect(end - page, page, PROT_READ | PROT_WRITE);
    std::memset(end - (used - bytes), 0xFF, used - bytes);
    mprotect(end - page, page, PROT_NONE);
  }
  regions()[p] = Region{mapped, user, bytes};
  g_in_use += mapped;
  return const_cast<char*>(user);
}

bool device_release(void* user) {
  const auto* r = mapping_of(user);
  if (!r || r->second.user != user) return false;
  void* base = const_cast<void*>(r->first);
  const size_t mapped = r->second.mapped;
  auto& o = opened();
  o.erase(std::remove_if(o.begin(), o.end(), [base](const auto& x) { return x.first == base; }), o.end());
  regions().erase(base);
  munmap(base, mapped + static_cast<size_t>(sysconf(_SC_PAGESIZE)));
  g_in_use -= mapped;
  return true;
}

bool device_range(const void* p, size_t bytes, const void** base) {
  const auto* r = mapping_of(p);
  if (!r) return false;
  const char* u = r->second.user;
  const char* q = static_cast<const char*>(p);
  if (q < u || q > u + r->second.bytes || bytes > static_cast<size_t>(u + r->second.bytes - q))
    return false;
  if (bytes == 0 && q == u + r->second.bytes && r->second.bytes > 0) return false;  // one past the end
  if (base) *base = u;
  return true;
}

size_t device_bytes_in_use() { return g_in_use; }

Access::Access() {
  if (g_access++ == 0) {
    install_handler();
    opened().clear();
    opened().reserve(regions().size() + 64);  // the handler must not allocate
  }
}
Access::~Access() {
  if (--g_access == 0) {
    for (const auto& [p, n] : opened())
      if (regions().count(p)) mprotect(p, n, PROT_NONE);  // (a freed one is gone from both)
    opened().clear();
  }
}

void enqueue(const char* what, std::function<void()> op) {
  queue().push_back(Op{what, std::move(op)});
  // CUDA_LAUNCH_BLOCKING=1, as on a GPU: every operation runs before its call returns, so a
  // failure surfaces at the call that queued it (a debugger's backtrace then names the caller).
  static const bool blocking = [] {
    const char* v = std::getenv("CUDA_LAUNCH_BLOCKING");
    return v && std::strcmp(v, "1") == 0;
  }();
  if (blocking) (void)flush();
}

cudaError_t flush() {
  if (g_sticky != cudaSuccess) {
    queue().clear();
    return g_sticky;
  }
  if (g_flushing) return cudaSuccess;  // an operation that synchronises runs inside a flush
  g_flushing = true;
  Access open;
  while (!queue().empty()) {
    Op op = std::move(queue().front());
    queue().pop_front();
    try {
      op.run();
    } catch (const std::exception& e) {
      g_sticky = cudaErrorLaunchFailure;
      const std::string why = e.what();
      // A kernel's message already starts with "kernel NAME".
      g_sticky_detail = why.rfind(op.what, 0) == 0 ? why : op.what + ": " + why;
      queue().clear();
    }
  }
  g_flushing = false;
  return g_sticky;
}

cudaError_t sticky_error() { return g_sticky; }

void set_last_error(cudaError_t e, std::string detail) {
  g_last = e;
  g_last_detail = std::move(detail);
}

cudaError_t peek_last_error() { return g_sticky != cudaSuccess ? g_sticky : g_last; }

cudaError_t take_last_error() {
  if (g_sticky != cudaSuccess) return g_sticky;
  const cudaError_t e = g_last;
  if (e != cudaSuccess) {
    g_taken = e;
    g_taken_detail = g_last_detail;
  }
  g_last = cudaSuccess;
  return e;
}

const char* error_string(cudaError_t e) {
  thread_local std::string s;
  const char* base = base_string(e);
  char code[48] = "";
  if (std::strcmp(base, "CUDA error") == 0) std::snprintf(code, sizeof code, " %d", static_cast<int>(e));
  const std::string* detail = e == g_sticky && e != cudaSuccess  ? &g_sticky_detail
                              : e == g_last && e != cudaSuccess  ? &g_last_detail
                              : e == g_taken && e != cudaSuccess ? &g_taken_detail
                                                                 : nullptr;
  s.assign(base);
  s.append(code);
  if (detail && !detail->empty()) s.append(" (").append(*detail).append(")");
  return s.c_str();
}

}  // namespace moe::simt

// ---- the CUDA runtime API, as moetrain calls it ----

struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  bool recorded = false;
};
struct CUstream_st {
  int id = 0;
};

namespace {

int emulated_gpus() {
  const char* v = std::getenv("MOETRAIN_EMULATED_GPUS");
  const long n = v ? std::strtol(v, nullptr, 10) : 1;
  return n > 0 && n < 1024 ? static_cast<int>(n) : 1;
}
int g_device = 0;

cudaError_t fail(cudaError_t e, std::string detail) {
  moe::simt::set_last_error(e, std::move(detail));
  return e;
}

std::string ptr(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

// Checks one side of a copy: device memory of at least `bytes` when `device`, host memory otherwise.
bool side_ok(const char* call, const char* side, const void* p, size_t bytes, bool device,
             cudaError_t* err) {
  if (bytes == 0) return true;
  if (!p) {
    *err = fail(cudaErrorInvalidValue, std::string(call) + ": " + side + " is null");
    return false;
  }
  const void* base = nullptr;
  const bool in_dev = moe::simt::device_range(p, 0, &base);
  if (device && !in_dev) {
    *err = fail(cudaErrorInvalidValue,
                std::string(call) + ": " + side + " " + ptr(p) + " is not device memory");
    return false;
  }
  if (!device && in_dev) {
    *err = fail(cudaErrorInvalidMemcpyDirection,
                std::string(call) + ": " + side + " " + ptr(p) + " is device memory");
    return false;
  }
  if (device && !moe::simt::device_range(p, bytes)) {
    *err = fail(cudaErrorInvalidValue, std::string(call) + ": " + std::to_string(bytes) +
                                           " bytes at " + side + " " + ptr(p) +
                                           " run past the end of its allocation");
    return false;
  }
  return true;
}

// Resolves cudaMemcpyDefault and checks both sides; false with *err set on a bad argument.
bool copy_ok(const char* call, void* dst, const void* src, size_t bytes, cudaMemcpyKind& kind,
             cudaError_t* err) {
  if (kind == cudaMemcpyDefault) {
    const bool d = moe::simt::device_range(dst, 0), s = moe::simt::device_range(src, 0);
    kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
             : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    *err = fail(cudaErrorInvalidMemcpyDirection, std::string(call) + ": kind " + std::to_string(kind));
    return false;
  }
  return side_ok(call, "destination", dst, bytes, dst_dev, err) &&
         side_ok(call, "source", src, bytes, src_dev, err);
}

bool memset_ok(const char* call, void* p, size_t bytes, cudaError_t* err) {
  return side_ok(call, "destination", p, bytes, true, err);
}

}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null count");
  *count = emulated_gpus();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emulated_gpus())
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(" + std::to_string(device) + "): " +
                                            std::to_string(emulated_gpus()) + " emulated GPUs");
  g_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice: null device");
  *device = g_device;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
             page = sysconf(_SC_PAGESIZE);
  size_t total = pages > 0 && page > 0 ? static_cast<size_t>(pages) * page : 0;
  size_t fr = avail > 0 && page > 0 ? static_cast<size_t>(avail) * page : 0;
  // Test hook: an emulated GPU of this many bytes (the "does not fit on the GPU" error path).
  if (const char* v = std::getenv("MOETRAIN_EMULATED_GPU_BYTES")) {
    char* end = nullptr;
    const unsigned long long b = std::strtoull(v, &end, 10);
    if (end && *end == '\0') {
      total = static_cast<size_t>(b);
      const size_t used = moe::simt::device_bytes_in_use();
      fr = used < total ? total - used : 0;
    }
  }
  if (free_bytes) *free_bytes = fr;
  if (total_bytes) *total_bytes = total;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc: null pointer");
  if (moe::simt::sticky_error() != cudaSuccess) return moe::simt::sticky_error();
  size_t free_b = 0;
  cudaMemGetInfo(&free_b, nullptr);
  if (std::getenv("MOETRAIN_EMULATED_GPU_BYTES") && bytes > free_b) {
    *p = nullptr;
    return fail(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes");
  }
  *p = moe::simt::device_alloc(bytes);
  if (!*p) return fail(cudaErrorMemoryAllocation, "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  const cudaError_t e = moe::simt::flush();  // cudaFree waits for the device
  if (!moe::simt::device_release(p))
    return fail(cudaErrorInvalidValue, "cudaFree(" + ptr(p) + "): not a device allocation");
  return e;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaMallocHost: null pointer");
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaMallocHost");
}

cudaError_t cudaFreeHost(void* p) {
  (void)moe::simt::flush();
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cudaError_t err = cudaSuccess;
  if (!copy_ok("cudaMemcpy", dst, src, bytes, kind, &err)) return err;
  if (const cudaError_t e = moe::simt::flush(); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  moe::simt::Access open;
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  cudaError_t err = cudaSuccess;
  if (!copy_ok("cudaMemcpyAsync", dst, src, bytes, kind, &err)) return err;
  if (moe::simt::sticky_error() != cudaSuccess) return moe::simt::sticky_error();
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost) {
    // From pageable host memory the bytes are taken now: the caller may reuse its buffer.
    std::vector<unsigned char> staged(static_cast<const unsigned char*>(src),
                                      static_cast<const unsigned char*>(src) + bytes);
    moe::simt::enqueue("cudaMemcpyAsync", [dst, staged = std::move(staged)] {
      std::memcpy(dst, staged.data(), staged.size());
    });
  } else {
    moe::simt::enqueue("cudaMemcpyAsync", [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  cudaError_t err = cudaSuccess;
  if (!memset_ok("cudaMemset", p, bytes, &err)) return err;
  if (const cudaError_t e = moe::simt::flush(); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  moe::simt::Access open;
  std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  cudaError_t err = cudaSuccess;
  if (!memset_ok("cudaMemsetAsync", p, bytes, &err)) return err;
  if (moe::simt::sticky_error() != cudaSuccess) return moe::simt::sticky_error();
  if (bytes == 0) return cudaSuccess;
  moe::simt::enqueue("cudaMemsetAsync", [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (!a) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes: null attributes");
  *a = cudaPointerAttributes{};
  const void* base = nullptr;
  if (p && moe::simt::device_range(p, 0, &base)) {
    a->type = cudaMemoryTypeDevice;
    a->device = g_device;
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->type = cudaMemoryTypeUnregistered;
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return moe::simt::flush(); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return moe::simt::flush(); }

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  if (!s) return fail(cudaErrorInvalidValue, "cudaStreamCreate: null stream");
  static int next = 1;
  *s = new CUstream_st{next++};
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  (void)moe::simt::flush();
  delete s;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
  if (!e) return fail(cudaErrorInvalidValue, "cudaEventCreate: null event");
  *e = new CUevent_st{};
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: null event");
  (void)moe::simt::flush();
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
  e->recorded = false;
  moe::simt::enqueue("cudaEventRecord", [e] {
    e->at = std::chrono::steady_clock::now();
    e->recorded = true;
  });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
  return moe::simt::flush();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: null event");
  return cudaSuccess;  // one queue: everything before it already runs first
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
  if (!a->recorded || !b->recorded)
    return fail(cudaErrorNotReady, "cudaEventElapsedTime: an event has not completed");
  *ms = std::chrono::duration<float, std::milli>(b->at - a->at).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > moe::simt::max_shared_opt_in())
      return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: " + std::to_string(value) +
                                             " bytes of dynamic shared memory (at most 227 KiB)");
    moe::simt::set_max_dynamic_shared(func, value);
  }
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return moe::simt::take_last_error(); }
cudaError_t cudaPeekAtLastError() {
  return moe::simt::peek_last_error();
}
const char* cudaGetErrorString(cudaError_t e) { return moe::simt::error_string(e); }
const char* cudaGetErrorName(cudaError_t e) { return moe::simt::error_string(e); }

}  // extern "C"
