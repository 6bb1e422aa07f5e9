// The SIMT shim's scheduler: each CUDA thread of a block is a fiber, blocks run one after another,
// barriers and warp operations park fibers until they can be released. See simt_cpu.h.
#include "kernels/simt/simt_cpu.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/simt/simt_device.h"

#if defined(__SANITIZE_ADDRESS__)
#define MOE_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_SIMT_ASAN 1
#endif
#endif
#ifdef MOE_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef MOE_SIMT_ASAN
#include <pthread.h>
#endif
// -DMOETRAIN_SIMT_TSAN=1 (the ThreadSanitizer build of the kernel tests; this file itself is not
// instrumented): every CUDA thread is a TSan fiber, switched without synchronisation, so TSan sees
// the threads of a block as concurrent; __syncthreads and warp operations are the only
// happens-before edges between them (release on arrival, acquire on leaving), as on a GPU. A plain
// `+=` from several threads of a block to one address is then a reported race. Blocks are ordered
// one after another (static __shared__ arrays are reused by every block), so races between blocks
// are not seen.
#ifdef MOETRAIN_SIMT_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace moe::simt {

uint3 g_thread_idx{};
uint3 g_block_idx{};
dim3 g_block_dim{};
dim3 g_grid_dim{};
unsigned char* g_dynamic_shared = nullptr;

namespace {

// ---- fibers: a stack and a saved context ----
#if defined(__x86_64__)
// moe_simt_switch(save, load): pushes the callee-saved registers, stores the stack pointer in
// *save, loads `load` and pops the same from there. The SSE / x87 control words are not switched
// (ldmxcsr and fldcw cost more than the rest of a switch): kernels never change the rounding mode.
// A new fiber's stack is laid out as if it had switched away just before moe_simt_trampoline,
// which calls r13(r12).
extern "C" void moe_simt_switch(void** save_sp, void* load_sp);
extern "C" void moe_simt_trampoline();
asm(R"(
  .text
  .globl moe_simt_switch
  .type moe_simt_switch, @function
moe_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size moe_simt_switch, .-moe_simt_switch
  .globl moe_simt_trampoline
  .type moe_simt_trampoline, @function
moe_simt_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size moe_simt_trampoline, .-moe_simt_trampoline
  .section .note.GNU-stack,"",@progbits
  .text
)");

struct Context {
  void* sp = nullptr;
};
void make_context(Context& c, char* stack_lo, size_t size, void (*fn)(void*), void* arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + size) & ~uintptr_t{15};
  // 6 registers and the return address; after the `ret` the stack pointer is 16-byte aligned,
  // so the trampoline's call enters fn with the alignment the ABI requires.
  auto* frame = reinterpret_cast<uint64_t*>(top - 64) + 1;
  frame[0] = 0;                                // r15
  frame[1] = 0;                                // r14
  frame[2] = reinterpret_cast<uint64_t>(fn);   // r13
  frame[3] = reinterpret_cast<uint64_t>(arg);  // r12
  frame[4] = 0;                                // rbx
  frame[5] = 0;                                // rbp
  frame[6] = reinterpret_cast<uint64_t>(&moe_simt_trampoline);
  c.sp = frame;
}
inline void switch_context(Context& from, Context& to) { moe_simt_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
void (*g_entry_fn)(void*) = nullptr;
void* g_entry_arg = nullptr;
void ucontext_entry() { g_entry_fn(g_entry_arg); }
void make_context(Context& c, char* stack_lo, size_t size, void (*fn)(void*), void* arg) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack_lo;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  g_entry_fn = fn;  // read by the fiber before its first switch away
  g_entry_arg = arg;
  makecontext(&c.uc, ucontext_entry, 0);
}
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

#ifdef MOE_SIMT_ASAN
constexpr size_t kStackBytes = 256 << 10;  // ASan's redzones make frames larger
#else
constexpr size_t kStackBytes = 64 << 10;
#endif

struct Stack {
  char* lo = nullptr;  // usable [lo, lo + kStackBytes); one PROT_NONE page below it
  size_t color = 0;    // bytes left unused at the top (see take_stack)
};
std::vector<Stack> g_free_stacks;

Stack take_stack() {
  if (!g_free_stacks.empty()) {
    Stack s = g_free_stacks.back();
    g_free_stacks.pop_back();
    return s;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("SIMT shim: could not map a fiber stack");
  mprotect(p, page, PROT_NONE);  // overflow faults instead of corrupting the next stack
  // Stacks 64 KiB apart would put every fiber's top frame in the same cache set; a different
  // offset per stack (steps of 208 bytes within a page) spreads them.
  static size_t n_made = 0;
  return Stack{static_cast<char*>(p) + page, (n_made++ * 208) % 4096};
}
// Stacks are handed back from inside fibers: the pool never reallocates there (a heap block
// allocated in one fiber and freed in another is a race to ThreadSanitizer).
void reserve_stack_pool() { g_free_stacks.reserve(1024 + 64); }

void give_stack(Stack s) {
#ifdef MOE_SIMT_ASAN
  // Frames left on it (the entry function never returns; an abandoned fiber) keep their redzones.
  __asan_unpoison_memory_region(s.lo, kStackBytes);
#endif
  g_free_stacks.push_back(s);
}

// ---- one block ----
enum class State : uint8_t {
  kRunnable,
  kBarrier,
  kWarp,
  kDone,
  kFailed
};

struct Fiber {
  Context ctx;
  Stack stack;
  bool started = false;
  uint3 tid{};
  int linear = 0;
  State state = State::kRunnable;
  int line = 0;  // where it parked
  // the warp operation it waits at
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint64_t bits = 0, result = 0;
  int src = 0;
  void* fake_stack = nullptr;  // ASan's fake stack while switched away
  void* tsan = nullptr;        // its TSan fiber (MOETRAIN_SIMT_TSAN)
};

struct WarpGroup {
  unsigned mask = 0, arrived = 0;
  WarpOp op = WarpOp::kSync;
  int line = 0;
};

struct Block {
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  int n = 0;
  std::vector<Fiber> fibers;
  int at_barrier = 0, done = 0;
  std::vector<std::vector<WarpGroup>> warps;  // pending groups per warp
  std::string error;
};

Block* g_block = nullptr;
Fiber* g_cur = nullptr;
Context g_sched;
#ifdef MOE_SIMT_ASAN
const void* g_sched_bottom = nullptr;
size_t g_sched_size = 0;
#endif
uint64_t g_seed = [] {
  const char* v = std::getenv("MOETRAIN_SIMT_SEED");
  return v ? std::strtoull(v, nullptr, 10) : 0;
}();
std::map<std::string, long>& run_counts() {
  static auto* m = new std::map<std::string, long>;  // never destroyed: static destructors still free device memory
  return *m;
}
// MOETRAIN_SIMT_STATS=1: launches, blocks, threads and seconds per kernel, printed at exit.
struct KernelStats {
  long launches = 0;
  double blocks = 0, threads = 0, seconds = 0;
};
std::map<std::string, KernelStats>* g_stats = [] {
  if (!std::getenv("MOETRAIN_SIMT_STATS")) return static_cast<std::map<std::string, KernelStats>*>(nullptr);
  auto* m = new std::map<std::string, KernelStats>;
  std::atexit([] {
    std::fprintf(stderr, "%-36s %9s %12s %14s %9s\n", "SIMT kernel", "launches", "blocks", "threads", "seconds");
    for (const auto& [k, v] : *g_stats)
      std::fprintf(stderr, "%-36s %9ld %12.0f %14.0f %9.3f\n", k.c_str(), v.launches, v.blocks, v.threads, v.seconds);
  });
  return m;
}();

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kSync: return "__syncwarp";
    case WarpOp::kShfl: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
  }
  return "?";
}

std::string hex(unsigned m) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", m);
  return b;
}

void fiber_entry(void*);

// ---- switching ----
// A round is the list of fibers runnable when it began (shuffled under a seed). A fiber that
// parks or finishes hands the CPU straight to the next runnable fiber of the round (one switch,
// not two through the scheduler); the scheduler gets control back only when the round is used up
// or the kernel failed.
std::vector<Fiber*> g_round;
size_t g_next = 0;
Stack g_pending_release;  // the stack of a fiber that finished, given back once we are off it

#ifdef MOETRAIN_SIMT_TSAN
void* g_sched_tsan = nullptr;
char g_launch_sync, g_block_sync;  // happens-before: launch -> block's threads -> next block
inline void tsan_switch(void* to) { __tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync); }
// One TSan fiber per thread index, kept for the process (creating one per CUDA thread made the
// kernel tests spend minutes mapping and unmapping TSan's thread state). Thread i of every block
// shares one: blocks are ordered anyway.
void* tsan_fiber(int i) {
  static auto* pool = new std::vector<void*>;
  if (pool->size() <= static_cast<size_t>(i)) pool->resize(i + 1, nullptr);
  if (!(*pool)[i]) (*pool)[i] = __tsan_create_fiber(0);
  return (*pool)[i];
}
inline void tsan_release(void* a) { __tsan_release(a); }
inline void tsan_acquire(void* a) { __tsan_acquire(a); }
#else
inline void tsan_switch(void*) {}
inline void tsan_release(void*) {}
inline void tsan_acquire(void*) {}
#endif
void* g_next_tsan = nullptr;  // the TSan fiber next_context chose

// The context to run next: the next runnable fiber of the round (started if new), or the scheduler.
Context& next_context(const void** bottom, size_t* size) {
  if (g_block->error.empty()) {
    while (g_next < g_round.size()) {
      Fiber* f = g_round[g_next++];
      if (f->state != State::kRunnable) continue;
      g_cur = f;
      g_thread_idx = f->tid;
      if (!f->started) {
        f->stack = take_stack();
        make_context(f->ctx, f->stack.lo, kStackBytes - f->stack.color, fiber_entry, nullptr);
        f->started = true;
#ifdef MOETRAIN_SIMT_TSAN
        f->tsan = tsan_fiber(f->linear);
#endif
      }
      g_next_tsan = f->tsan;
      *bottom = f->stack.lo;
      *size = kStackBytes;
      return f->ctx;
    }
  }
  g_cur = nullptr;
#ifdef MOETRAIN_SIMT_TSAN
  g_next_tsan = g_sched_tsan;
#endif
#ifdef MOE_SIMT_ASAN
  *bottom = g_sched_bottom;
  *size = g_sched_size;
#else
  *bottom = nullptr;
  *size = 0;
#endif
  return g_sched;
}

// Whoever runs after a switch: a finished fiber's stack goes back to the pool.
void after_switch() {
  if (g_pending_release.lo) {
    give_stack(g_pending_release);
    g_pending_release = Stack{};
  }
}

// Fiber side: hands over to the next fiber or the scheduler; returns when resumed (never, after
// a failure).
void park() {
  Fiber* f = g_cur;
  const void* bottom;
  size_t size;
  Context& to = next_context(&bottom, &size);
#ifdef MOE_SIMT_ASAN
  __sanitizer_start_switch_fiber(&f->fake_stack, bottom, size);
#endif
  tsan_switch(g_next_tsan);
  switch_context(f->ctx, to);
#ifdef MOE_SIMT_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
  after_switch();
}

// Fiber side: records why the kernel cannot go on and parks for good.
[[noreturn]] void fail(std::string why) {
  g_block->error = std::move(why);
  g_cur->state = State::kFailed;
  park();
  std::abort();  // never resumed
}

void fiber_entry(void*) {
#ifdef MOE_SIMT_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  after_switch();
#ifdef MOETRAIN_SIMT_TSAN
  tsan_acquire(&g_block_sync);  // the launch's arguments and the blocks before this one
#endif
  (*g_block->body)();
  Fiber* f = g_cur;
#ifdef MOETRAIN_SIMT_TSAN
  tsan_release(&g_launch_sync);  // what this thread wrote, to the host after the grid
#endif
  f->state = State::kDone;
  ++g_block->done;
  g_pending_release = f->stack;  // still running on it: released by whoever runs next
  f->stack = Stack{};
  f->tsan = nullptr;
  const void* bottom;
  size_t size;
  Context& to = next_context(&bottom, &size);
#ifdef MOE_SIMT_ASAN
  __sanitizer_start_switch_fiber(nullptr, bottom, size);
#endif
  tsan_switch(g_next_tsan);
  Context dead;
  switch_context(dead, to);
  std::abort();  // a finished fiber is never resumed
}

// Scheduler side: runs the current round until every fiber in it has parked or finished.
void run_round() {
  const void* bottom;
  size_t size;
#ifdef MOETRAIN_SIMT_TSAN
  g_sched_tsan = __tsan_get_current_fiber();
#endif
  Context& to = next_context(&bottom, &size);
  if (&to == &g_sched) return;
#ifdef MOE_SIMT_ASAN
  if (!g_sched_bottom) {  // the launching thread's own stack, where fibers switch back to
    pthread_attr_t attr;
    pthread_getattr_np(pthread_self(), &attr);
    void* lo = nullptr;
    pthread_attr_getstack(&attr, &lo, &g_sched_size);
    pthread_attr_destroy(&attr);
    g_sched_bottom = lo;
  }
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, bottom, size);
#endif
  tsan_switch(g_next_tsan);
  switch_context(g_sched, to);
#ifdef MOE_SIMT_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  after_switch();
}

std::string where(const Block& b) {
  return "kernel " + std::string(b.kernel) + " block (" + std::to_string(g_block_idx.x) + "," +
         std::to_string(g_block_idx.y) + "," + std::to_string(g_block_idx.z) + ") of " +
         std::to_string(b.n) + " threads: ";
}

// Nothing can run and not every thread finished: say which barrier can never complete.
std::string deadlock(const Block& b) {
  for (size_t w = 0; w < b.warps.size(); ++w)
    for (const WarpGroup& g : b.warps[w]) {
      unsigned exited = 0, elsewhere = 0;
      int barrier_line = 0;
      for (int l = 0; l < 32; ++l) {
        if (!(g.mask >> l & 1u) || (g.arrived >> l & 1u)) continue;
        const Fiber& f = b.fibers[w * 32 + l];
        if (f.state == State::kDone) exited |= 1u << l;
        else {
          elsewhere |= 1u << l;
          if (f.state == State::kBarrier) barrier_line = f.line;
        }
      }
      std::string s = where(b) + op_name(g.op) + " (line " + std::to_string(g.line) +
                      ") of warp " + std::to_string(w) + " with mask " + hex(g.mask) +
                      " can never complete: lanes " + hex(g.arrived) + " arrived";
      if (exited) s += ", lanes " + hex(exited) + " exited";
      if (elsewhere)
        s += ", lanes " + hex(elsewhere) + " wait elsewhere" +
             (barrier_line ? " (__syncthreads, line " + std::to_string(barrier_line) + ")" : "");
      return s;
    }
  int line = 0;
  for (const Fiber& f : b.fibers)
    if (f.state == State::kBarrier) line = f.line;
  return where(b) + "divergent __syncthreads (line " + std::to_string(line) +
         ") can never complete: " + std::to_string(b.at_barrier) + " of " + std::to_string(b.n) +
         " threads arrived, " + std::to_string(b.done) + " exited";
}

// Runs every thread of one block to completion (throws std::runtime_error naming the kernel).
void run_block(Block& b, std::mt19937_64* rng) {
  b.at_barrier = b.done = 0;
  b.error.clear();
  for (auto& w : b.warps) w.clear();
  for (int i = 0; i < b.n; ++i) {
    Fiber& f = b.fibers[i];
    f.started = false;
    f.state = State::kRunnable;
    f.stack = Stack{};
  }
  for (;;) {
    g_round.clear();
    g_next = 0;
    for (Fiber& f : b.fibers)
      if (f.state == State::kRunnable) g_round.push_back(&f);
    if (g_round.empty()) {
      if (b.done == b.n) return;
      b.error = deadlock(b);
    } else {
      if (rng) std::shuffle(g_round.begin(), g_round.end(), *rng);
      run_round();
    }
    if (!b.error.empty()) {
      for (Fiber& f : b.fibers) {  // abandoned mid-kernel: their stacks go back to the pool
        if (f.started && f.stack.lo) {
          give_stack(f.stack);
          f.stack = Stack{};
        }
        f.tsan = nullptr;  // (pooled: see tsan_fiber)
      }
      throw std::runtime_error(b.error);
    }
  }
}

// Dynamic shared memory of the launch running now: `bytes` (rounded to 16) ending at a PROT_NONE
// page, so an access past the launch's size faults.
struct SharedArena {
  unsigned char* base = nullptr;
  size_t usable = 0;  // bytes before the guard page
  unsigned char* get(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t need = (bytes + page - 1) / page * page;
    if (!base || need > usable) {
      if (base) munmap(base, usable + page);
      void* p = mmap(nullptr, need + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("SIMT shim: could not map shared memory");
      base = static_cast<unsigned char*>(p);
      usable = need;
      mprotect(base + usable, page, PROT_NONE);
    }
    const size_t padded = (bytes + 15) / 16 * 16;
    return base + usable - padded;
  }
} g_shared;

struct FuncAttr {
  int max_dynamic_smem = 48 << 10;  // the default limit without cudaFuncSetAttribute
};
std::map<const void*, FuncAttr>& func_attrs() {
  static auto* m = new std::map<const void*, FuncAttr>;  // never destroyed: static destructors still free device memory
  return *m;
}

constexpr int kMaxSharedOptIn = 232448;  // 227 KiB: sm_90's opt-in limit per block

void run_grid(const char* name, dim3 grid, dim3 block, size_t smem,
              const std::function<void()>& body) {
  Block b;
  b.kernel = name;
  b.body = &body;
  b.n = static_cast<int>(block.x * block.y * block.z);
  b.fibers.resize(b.n);
  b.warps.resize((b.n + 31) / 32);
  for (auto& w : b.warps) w.reserve(32);  // grown inside fibers never (see reserve_stack_pool)
  reserve_stack_pool();
  for (int i = 0; i < b.n; ++i) {
    Fiber& f = b.fibers[i];
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i) % block.x, static_cast<unsigned>(i) / block.x % block.y,
                  static_cast<unsigned>(i) / (block.x * block.y)};
  }
  g_block_dim = block;
  g_grid_dim = grid;
  unsigned char* shared = g_shared.get(smem);
  g_dynamic_shared = shared;
  const uint64_t n_blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
  std::mt19937_64 rng(g_seed * 0x9E3779B97F4A7C15ull + n_blocks);
  std::vector<uint32_t> block_order;
  const bool shuffled = g_seed != 0;
  if (shuffled && n_blocks <= (1u << 22)) {
    block_order.resize(n_blocks);
    for (uint64_t i = 0; i < n_blocks; ++i) block_order[i] = static_cast<uint32_t>(i);
    std::shuffle(block_order.begin(), block_order.end(), rng);
  }
  g_block = &b;
  struct Reset {
    ~Reset() {
      g_block = nullptr;
      g_cur = nullptr;
    }
  } reset;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n_blocks; ++i) {
    const uint64_t id = block_order.empty() ? i : block_order[i];
    g_block_idx = uint3{static_cast<unsigned>(id % grid.x), static_cast<unsigned>(id / grid.x % grid.y),
                        static_cast<unsigned>(id / (static_cast<uint64_t>(grid.x) * grid.y))};
#ifdef MOETRAIN_SIMT_TSAN
    tsan_acquire(&g_launch_sync);  // the previous block's threads (and the host before the grid)
#endif
    if (smem) std::memset(shared, 0xFF, smem);  // NaN in every float until written
#ifdef MOETRAIN_SIMT_TSAN
    tsan_release(&g_block_sync);
#endif
    run_block(b, shuffled ? &rng : nullptr);
  }
#ifdef MOETRAIN_SIMT_TSAN
  tsan_acquire(&g_launch_sync);
#endif
  ++run_counts()[name];
  if (g_stats) {
    KernelStats& st = (*g_stats)[name];
    ++st.launches;
    st.blocks += static_cast<double>(n_blocks);
    st.threads += static_cast<double>(n_blocks) * b.n;
    st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

}  // namespace

void set_schedule_seed(uint64_t seed) { g_seed = seed; }
uint64_t schedule_seed() { return g_seed; }

std::vector<std::pair<std::string, long>> kernels_run() {
  return {run_counts().begin(), run_counts().end()};
}

void set_max_dynamic_shared(const void* func, int bytes) { func_attrs()[func].max_dynamic_smem = bytes; }

void enqueue_kernel(const char* name, const void* func, dim3 grid, dim3 block, size_t smem,
                    cudaStream_t stream, std::function<void()> body) {
  (void)stream;  // every stream runs in issue order (one queue)
  if (sticky_error() != cudaSuccess) {
    set_last_error(sticky_error(), "");
    return;
  }
  auto refuse = [&](cudaError_t e, const std::string& why) {
    set_last_error(e, "kernel " + std::string(name) + ": " + why);
  };
  auto dims = [](dim3 d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
  };
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0)
    return refuse(cudaErrorInvalidConfiguration,
                  "empty launch: grid " + dims(grid) + ", block " + dims(block));
  if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024)
    return refuse(cudaErrorInvalidConfiguration,
                  "block " + dims(block) + " has " + std::to_string(threads) +
                      " threads (at most 1024, z at most 64)");
  if (grid.x > 2147483647u || grid.y > 65535u || grid.z > 65535u)
    return refuse(cudaErrorInvalidConfiguration, "grid " + dims(grid) + " is beyond (2^31-1,65535,65535)");
  auto it = func_attrs().find(func);
  const int limit = it == func_attrs().end() ? FuncAttr{}.max_dynamic_smem : it->second.max_dynamic_smem;
  if (smem > static_cast<size_t>(limit))
    return refuse(cudaErrorInvalidValue,
                  std::to_string(smem) + " bytes of dynamic shared memory; the limit is " +
                      std::to_string(limit) +
                      (limit < kMaxSharedOptIn
                           ? " (more needs cudaFuncSetAttribute(MaxDynamicSharedMemorySize), up to 227 KiB)"
                           : ""));
  enqueue((std::string("kernel ") + name).c_str(), [name, grid, block, smem, body = std::move(body)] {
    run_grid(name, grid, block, smem, body);
  });
}

int max_shared_opt_in() { return kMaxSharedOptIn; }

void syncthreads(int line) {
  Block& b = *g_block;
  Fiber& f = *g_cur;
  tsan_release(&b);
  if (++b.at_barrier == b.n) {  // the last to arrive releases the block and goes on
    for (Fiber& o : b.fibers)
      if (o.state == State::kBarrier) o.state = State::kRunnable;
    b.at_barrier = 0;
    tsan_acquire(&b);
    return;
  }
  f.state = State::kBarrier;
  f.line = line;
  park();
  tsan_acquire(&b);
}

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t bits, int arg, int width, int line) {
  Block& b = *g_block;
  Fiber& f = *g_cur;
  const int lane = f.linear % 32, warp = f.linear / 32;
  const int lanes = std::min(32, b.n - warp * 32);
  const unsigned exists = lanes == 32 ? ~0u : (1u << lanes) - 1u;
  auto at = [&] {  // built only for an error
    return where(b) + op_name(op) + " (line " + std::to_string(line) + ") in lane " +
           std::to_string(lane) + " of warp " + std::to_string(warp) + ": ";
  };
  if (!(mask >> lane & 1u)) fail(at() + "mask " + hex(mask) + " leaves out the calling lane");
  if (mask & ~exists)
    fail(at() + "mask " + hex(mask) + " names lanes that do not exist (this warp has " +
         std::to_string(lanes) + " lanes: the block size is not a multiple of 32)");
  if (width < 1 || width > 32 || (width & (width - 1)))
    fail(at() + "width " + std::to_string(width) + " is not a power of two in [1, 32]");
  const int seg = lane & ~(width - 1);
  int src = lane;
  switch (op) {
    case WarpOp::kSync: break;
    case WarpOp::kShfl: src = seg + (arg & (width - 1)); break;
    case WarpOp::kShflUp: src = lane - arg >= seg ? lane - arg : lane; break;
    case WarpOp::kShflDown: src = lane + arg < seg + width ? lane + arg : lane; break;
    case WarpOp::kShflXor: {
      const int s = lane ^ arg;
      src = (s > 31 || (s & ~(width - 1)) > seg) ? lane : s;
      break;
    }
  }
  if (!(mask >> src & 1u))
    fail(at() + "reads lane " + std::to_string(src) + ", which is not in the mask " + hex(mask));
  std::vector<WarpGroup>& groups = b.warps[warp];
  WarpGroup* g = nullptr;
  for (WarpGroup& x : groups)
    if (x.mask & mask) {
      if (x.mask != mask)
        fail(at() + "mask " + hex(mask) + " overlaps mask " + hex(x.mask) + " of lanes " +
             hex(x.arrived) + " waiting at line " + std::to_string(x.line));
      if (x.op != op)
        fail(at() + "lanes " + hex(x.arrived) + " wait at " + op_name(x.op) + " (line " +
             std::to_string(x.line) + ") with the same mask");
      g = &x;
    }
  if (!g) {
    groups.push_back(WarpGroup{mask, 0u, op, line});
    g = &groups.back();
  }
  tsan_release(&groups);
  f.op = op;
  f.mask = mask;
  f.bits = bits;
  f.src = src;
  f.line = line;
  g->arrived |= 1u << lane;
  if (g->arrived == mask) {  // the last lane releases the group, every lane reads its source
    for (int l = 0; l < 32; ++l) {
      if (!(mask >> l & 1u)) continue;
      Fiber& o = b.fibers[warp * 32 + l];
      o.result = b.fibers[warp * 32 + o.src].bits;
      if (&o != &f) o.state = State::kRunnable;
    }
    groups.erase(groups.begin() + (g - groups.data()));
    tsan_acquire(&groups);
    return f.result;
  }
  f.state = State::kWarp;
  park();
  tsan_acquire(&groups);
  return f.result;
}

}  // namespace moe::simt
