// The SIMT shim: the CUDA kernel source (src/kernels/cuda/*.cu) compiled by the host compiler and
// run on the CPU, so that every CI build executes the real kernels (-DMOETRAIN_EMULATE_CUDA=ON).
// common.cuh includes this header instead of the device builtins when __CUDACC__ is not defined.
//
// Execution model (simt_cpu.cpp):
//   - a launch is queued on its stream and runs when the host synchronises (cudaStreamSynchronize,
//     a synchronous cudaMemcpy, cudaFree, ...): a read of a stream's result before its sync sees
//     the old bytes, as on a GPU with pinned memory;
//   - blocks run one after another; each CUDA thread of a block is a fiber (its own stack) that
//     runs until it finishes or parks at __syncthreads, __syncwarp or a shuffle;
//   - __syncthreads releases the block when every thread has arrived; a warp operation releases
//     when every lane named by the mask has arrived with the same mask (and the same operation);
//     a barrier that can never complete (a lane exited, or waits elsewhere) is an error naming the
//     kernel, the block and the lanes, never a hang;
//   - a schedule seed (MOETRAIN_SIMT_SEED, simt::set_schedule_seed) shuffles the order in which
//     runnable fibers resume, and the order of the blocks, so a missing barrier shows as a wrong
//     result; seed 0 runs everything in index order;
//   - static __shared__ is a function-local static (blocks never overlap); dynamic shared memory
//     (MOE_DYNAMIC_SHARED) ends at a PROT_NONE page and starts filled with 0xFF bytes (NaN), so
//     reading past its size faults and reading it before writing shows;
//   - atomics are GCC's __atomic builtins (fibers never pre-empt each other, so any
//     read-modify-write would do; the builtins let the ThreadSanitizer build, where each CUDA
//     thread is a TSan fiber, tell an atomic from a racing `+=`: simt_cpu.cpp).
// What it cannot check: tensor-core and inline-PTX code, the memory model beyond barriers, races
// between blocks, occupancy and speed (scripts/gpu_check.sh on a GPU does). docs/simt_shim.md.
#pragma once
#if defined(__CUDACC__)
#error "simt_cpu.h is the host compiler's stand-in for the CUDA device builtins"
#endif
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// Block-wide storage: a static of the kernel function (one block runs at a time).
#undef __shared__
#define __shared__ static

namespace moe::simt {

// The coordinates of the fiber that runs now (set by the scheduler before every resume).
extern uint3 g_thread_idx;
extern uint3 g_block_idx;
extern dim3 g_block_dim;
extern dim3 g_grid_dim;
extern unsigned char* g_dynamic_shared;  // this launch's dynamic shared memory

// Queues a kernel on `stream`; the launch checks the driver would make (block size, grid size,
// shared memory) set cudaGetLastError instead. `body` runs once per CUDA thread.
void enqueue_kernel(const char* name, const void* func, dim3 grid, dim3 block, size_t dynamic_smem,
                    cudaStream_t stream, std::function<void()> body);
// cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes).
void set_max_dynamic_shared(const void* func, int bytes);
int max_shared_opt_in();  // 227 KiB, sm_90's limit

// The schedule seed of later launches (0: index order). Starts as MOETRAIN_SIMT_SEED or 0.
void set_schedule_seed(uint64_t seed);
uint64_t schedule_seed();

// Kernels executed so far, by name (the per-kernel tests count them against the source).
std::vector<std::pair<std::string, long>> kernels_run();

// Device-side operations (called from fibers only).
void syncthreads(int line);
enum class WarpOp : uint8_t {
  kSync,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor
};
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, int line);

template <class T>
T warp_shuffle(WarpOp op, unsigned mask, T v, int arg, int width, int line) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "shuffle of a type wider than 64 bits");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_op(op, mask, bits, arg, width, line);
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// kernel(args...) for every thread of the grid: the arguments are converted to the kernel's
// parameter types once, at the launch, and each thread gets its own copy (as CUDA passes them).
template <class... P>
class Launch {
 public:
  Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
         cudaStream_t stream)
      : name_(name), kernel_(kernel), grid_(grid), block_(block), smem_(smem), stream_(stream) {}
  template <class... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong argument count");
    std::tuple<std::decay_t<P>...> args(static_cast<std::decay_t<P>>(std::forward<A>(a))...);
    void (*k)(P...) = kernel_;
    enqueue_kernel(name_, reinterpret_cast<const void*>(k), grid_, block_, smem_, stream_,
                   [k, args]() { std::apply(k, args); });
  }

 private:
  const char* name_;
  void (*kernel_)(P...);
  dim3 grid_, block_;
  size_t smem_;
  cudaStream_t stream_;
};
template <class... P>
Launch<P...> make_launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                         size_t smem, cudaStream_t stream) {
  return Launch<P...>(name, kernel, grid, block, smem, stream);
}

}  // namespace moe::simt

#define threadIdx (static_cast<const uint3&>(::moe::simt::g_thread_idx))
#define blockIdx (static_cast<const uint3&>(::moe::simt::g_block_idx))
#define blockDim (static_cast<const dim3&>(::moe::simt::g_block_dim))
#define gridDim (static_cast<const dim3&>(::moe::simt::g_grid_dim))
#ifndef warpSize
#define warpSize 32
#endif

#define __syncthreads() ::moe::simt::syncthreads(__LINE__)
#define __syncwarp(...) ::moe::simt::syncwarp_at(__LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(mask, v, src, ...)                                      \
  ::moe::simt::warp_shuffle(::moe::simt::WarpOp::kShfl, (mask), (v), (src), \
                            ::moe::simt::width_or_32(__VA_ARGS__), __LINE__)
#define __shfl_up_sync(mask, v, delta, ...)                                     \
  ::moe::simt::warp_shuffle(::moe::simt::WarpOp::kShflUp, (mask), (v), (delta), \
                            ::moe::simt::width_or_32(__VA_ARGS__), __LINE__)
#define __shfl_down_sync(mask, v, delta, ...)                                     \
  ::moe::simt::warp_shuffle(::moe::simt::WarpOp::kShflDown, (mask), (v), (delta), \
                            ::moe::simt::width_or_32(__VA_ARGS__), __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask, ...)                                     \
  ::moe::simt::warp_shuffle(::moe::simt::WarpOp::kShflXor, (mask), (v), (lane_mask), \
                            ::moe::simt::width_or_32(__VA_ARGS__), __LINE__)

namespace moe::simt {
inline int width_or_32() { return 32; }
inline int width_or_32(int w) { return w; }
inline void syncwarp_at(int line, unsigned mask = 0xffffffffu) {
  (void)warp_op(WarpOp::kSync, mask, 0, 0, 32, line);
}
}  // namespace moe::simt

// Atomics: GCC's __atomic builtins (relaxed, as CUDA's atomics are). Fibers never run at the same
// time, so a plain read-modify-write would do; the builtins are what lets the ThreadSanitizer
// build (MOETRAIN_SIMT_TSAN) tell an atomic from a racing `+=`. Floats go through a CAS loop.
namespace moe::simt {
template <class T, class F>
inline T atomic_update(T* p, F f) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  T next = f(old);
  while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    next = f(old);
  return old;
}
}  // namespace moe::simt
template <class T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral_v<T>) return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  else return ::moe::simt::atomic_update(p, [v](T x) { return x + v; });
}
template <class T>
inline T atomicSub(T* p, T v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);
}
template <class T>
inline T atomicMin(T* p, T v) {
  return ::moe::simt::atomic_update(p, [v](T x) { return v < x ? v : x; });
}
template <class T>
inline T atomicMax(T* p, T v) {
  return ::moe::simt::atomic_update(p, [v](T x) { return v > x ? v : x; });
}
template <class T>
inline T atomicExch(T* p, T v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_RELAXED);
  return old;
}
template <class T>
inline T atomicCAS(T* p, T compare, T v) {
  __atomic_compare_exchange(p, &compare, &v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;  // the old value either way
}

template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// Device math that has no host declaration.
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
inline int __float_as_int(float f) {
  int x;
  std::memcpy(&x, &f, sizeof x);
  return x;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
// CUDA's device min/max overloads (integers and floats, mixed as the usual conversions make them).
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
}
