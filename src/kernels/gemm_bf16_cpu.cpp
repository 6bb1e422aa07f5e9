// bf16 GEMM on the CPU through oneDNN's matmul. See gemm_bf16_cpu.h.
#include "kernels/gemm_bf16_cpu.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"

#ifdef MOETRAIN_HAVE_DNNL
#include <immintrin.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace moe::kernels {

float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // Inf, NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

#ifndef MOETRAIN_HAVE_DNNL

class Bf16CpuState {};
Bf16CpuState& ExecContext::bf16_cpu() {
  if (!bf16_cpu_) bf16_cpu_.reset(new Bf16CpuState);
  return *bf16_cpu_;
}
void Bf16CpuStateDeleter::operator()(Bf16CpuState* s) const { delete s; }

std::string bf16_cpu_unavailable_reason() {
  return "this build has no oneDNN (install libdnnl-dev and reconfigure with -DMOETRAIN_DNNL=AUTO or ON)";
}
void gemm_bf16_cpu(bool, bool, int, int, int, float, const float*, int, const float*, int, float, float*,
                   int) {
  MOE_CHECK(false, "bf16 GEMM on the CPU: ", bf16_cpu_unavailable_reason());
}
void bf16_roofline_product(int) { MOE_CHECK(false, "bf16 GEMM on the CPU: ", bf16_cpu_unavailable_reason()); }
void set_bf16_cpu_threads(int) {}
Bf16WeightScope::Bf16WeightScope(const std::vector<std::pair<const float*, size_t>>&) {}
Bf16WeightScope::Bf16WeightScope(const float*, size_t) {}
Bf16WeightScope::~Bf16WeightScope() {}
void invalidate_bf16_weights(const float*) {}
int64_t bf16_weight_copy_reads() { return 0; }
Bf16InputScope::Bf16InputScope(const float*, size_t) {}
Bf16InputScope::~Bf16InputScope() {}
int64_t bf16_input_conversions() { return 0; }

#else

namespace {
using dnnl::memory;
using bf16_t = uint16_t;

bf16_t bf16_bits(float x) {
  const float r = round_to_bf16(x);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return static_cast<bf16_t>(u >> 16);
}

// VCVTNEPS2BF16: 16 floats per instruction, nearest-even like round_to_bf16 (it also flushes
// fp32 denormals, below 1.2e-38, to zero). Only called where the CPU has AVX-512 BF16.
__attribute__((target("avx512f,avx512bf16"))) void convert_avx512(const float* s, bf16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), reinterpret_cast<const __m256i&>(b));
  }
  for (; i < n; ++i) d[i] = bf16_bits(s[i]);
}

// A row-major rows × cols matrix with row stride ld, rounded to bf16 into dense dst.
void convert_rows(const float* src, int rows, int cols, int ld, bf16_t* dst) {
  if (ld == cols) {
    convert_avx512(src, dst, static_cast<size_t>(rows) * cols);
    return;
  }
  for (int r = 0; r < rows; ++r)
    convert_avx512(src + static_cast<size_t>(r) * ld, dst + static_cast<size_t>(r) * cols, cols);
}

// The process's CPU engine (immutable once made; every context's stream runs on it).
dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN follows BLAS's thread count unless told otherwise (set_bf16_cpu_threads): one thread
// per rank by default, never OpenMP's one-per-core on a machine the ranks already fill.
bool g_threads_set = false;
void ensure_threads() {
  if (g_threads_set) return;
  omp_set_num_threads(std::max(1, blas_threads()));
  g_threads_set = true;
}

// One primitive per (trans_a, trans_b, alpha, beta) with run-time dims: it serves every segment
// size of the grouped expert GEMM. Measured here (one thread, bf16 in, fp32 out): oneDNN picks
// "gemm:jit" (created in 0.02-0.4 ms); fixed dims give "brg:avx512_core_amx_bf16", up to 1.5x
// faster at the MoE shapes but created in 0.3-7 ms, i.e. per GEMM, since the expert segment
// sizes change every step. Run-time strides would select the reference kernel (about 1 GFLOP/s),
// so the operands are dense (tags ab / ba) and a strided C goes through a dense copy.
using MatmulKey = std::tuple<bool, bool, float, float>;
const dnnl::matmul& matmul_for(std::map<MatmulKey, dnnl::matmul>& cache, bool ta, bool tb, float alpha,
                               float beta) {
  auto key = std::make_tuple(ta, tb, alpha, beta);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  using tag = memory::format_tag;
  const memory::dims rt2 = {DNNL_RUNTIME_DIM_VAL, DNNL_RUNTIME_DIM_VAL};
  const memory::desc a(rt2, memory::data_type::bf16, ta ? tag::ba : tag::ab),
      b(rt2, memory::data_type::bf16, tb ? tag::ba : tag::ab), c(rt2, memory::data_type::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}

// The open Bf16WeightScope's blocks and their bf16 copy, one after the other in `bits` (kept
// allocated between steps).
struct WeightCopy {
  struct Block {
    const float* data;
    size_t n;
    size_t at;  // offset in bits
  };
  std::vector<Block> blocks;
  bool open = false;
  std::vector<bf16_t> bits;
};

// An open Bf16InputScope's block; its copy is converted on its first read.
struct InputCopy {
  const float* data = nullptr;
  size_t n = 0;
  bool converted = false;
  std::vector<bf16_t> bits;  // kept allocated for the next scope at this depth
};

bool overlaps(const float* p, size_t n, const float* q, size_t m) { return p < q + m && q < p + n; }

}  // namespace

// One execution context's bf16 GEMM state: its oneDNN stream and primitives, the open weight and
// input copies, and the operand scratch kept between calls. A worker context reads its parent's
// weight copy (kernels/exec_context.h).
class Bf16CpuState {
 public:
  explicit Bf16CpuState(Bf16CpuState* parent)
      : stream(cpu_engine()), weights(parent ? parent->weights : &own_weights) {}

  dnnl::stream stream;
  std::map<MatmulKey, dnnl::matmul> primitives;
  WeightCopy own_weights;
  WeightCopy* weights;  // own_weights, or the parent's
  int64_t weight_reads = 0;
  InputCopy inputs[Bf16InputScope::kMaxInputScopes];  // innermost last
  int open_inputs = 0;
  int64_t input_conversions = 0;
  std::vector<bf16_t> scratch_a, scratch_b;  // operands not in a copy
  std::vector<float> dense_c;                // a strided C's dense stand-in
  std::vector<bf16_t> roofline_a, roofline_b;
  std::vector<float> roofline_c;

  // C[M,N] (dense) = alpha · op(A) · op(B) + beta · C for dense bf16 A and B.
  void run_matmul(bool ta, bool tb, int M, int N, int K, float alpha, const bf16_t* A, const bf16_t* B,
                  float beta, float* C) {
    ensure_threads();
    const dnnl::matmul& mm = matmul_for(primitives, ta, tb, alpha, beta);
    using tag = memory::format_tag;
    memory am(memory::desc({M, K}, memory::data_type::bf16, ta ? tag::ba : tag::ab), cpu_engine(),
              const_cast<bf16_t*>(A));
    memory bm(memory::desc({K, N}, memory::data_type::bf16, tb ? tag::ba : tag::ab), cpu_engine(),
              const_cast<bf16_t*>(B));
    memory cm(memory::desc({M, N}, memory::data_type::f32, tag::ab), cpu_engine(), C);
    mm.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  }

  // A stored rows × cols matrix with row stride ld as a dense bf16 operand: read from the weight
  // copy when it lies inside the open block and is dense, else from an open input scope's copy,
  // else converted into `scratch`.
  const bf16_t* operand(const float* p, int rows, int cols, int ld, std::vector<bf16_t>& scratch) {
    const size_t need = static_cast<size_t>(rows) * cols;
    if (weights->open && ld == cols)
      for (const WeightCopy::Block& b : weights->blocks)
        if (p >= b.data && p + need <= b.data + b.n) {
          ++weight_reads;
          return weights->bits.data() + b.at + (p - b.data);
        }
    if (ld == cols)
      for (int i = open_inputs - 1; i >= 0; --i) {
        InputCopy& in = inputs[i];
        if (p < in.data || p + need > in.data + in.n) continue;
        if (!in.converted) {
          if (in.bits.size() < in.n) in.bits.resize(in.n);
          convert_avx512(in.data, in.bits.data(), in.n);
          in.converted = true;
          ++input_conversions;
        }
        return in.bits.data() + (p - in.data);
      }
    if (scratch.size() < need) scratch.resize(need);
    convert_rows(p, rows, cols, ld, scratch.data());
    return scratch.data();
  }
};

Bf16CpuState& ExecContext::bf16_cpu() {
  if (!bf16_cpu_) bf16_cpu_.reset(new Bf16CpuState(parent_ ? &parent_->bf16_cpu() : nullptr));
  return *bf16_cpu_;
}
void Bf16CpuStateDeleter::operator()(Bf16CpuState* s) const { delete s; }

namespace {
Bf16CpuState& state() { return current_context().bf16_cpu(); }
// Where this context's GEMMs run in bf16 on the CPU (elsewhere nothing reads a bf16 copy).
bool bf16_here() { return gemm_bf16() && active_device() == Device::kCpu && bf16_cpu_available(); }
}  // namespace

std::string bf16_cpu_unavailable_reason() {
  if (!__builtin_cpu_supports("avx512bf16"))
    return "this CPU has no AVX-512 BF16 instructions (avx512_bf16 missing from its flags)";
  const unsigned isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const unsigned bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & bf16) != bf16)
    return "oneDNN may not use this CPU's AVX-512 BF16 instructions (DNNL_MAX_CPU_ISA limits it)";
  return "";
}

void gemm_bf16_cpu(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                   const float* B, int ldb, float beta, float* C, int ldc) {
  if (!gemm_prologue(trans_a, trans_b, M, N, K, lda, ldb, beta, C, ldc)) return;  // the fp32 path's rules
  Bf16CpuState& st = state();
  for (int i = 0; i < st.open_inputs; ++i)  // the copy would go stale
    MOE_CHECK(!overlaps(C, static_cast<size_t>(M - 1) * ldc + N, st.inputs[i].data, st.inputs[i].n),
              "gemm (bf16): the output overlaps an input held by a Bf16InputScope");
  const bf16_t* a = st.operand(A, trans_a ? K : M, trans_a ? M : K, lda, st.scratch_a);
  const bf16_t* b = st.operand(B, trans_b ? N : K, trans_b ? K : N, ldb, st.scratch_b);
  if (ldc == N) {
    st.run_matmul(trans_a, trans_b, M, N, K, alpha, a, b, beta, C);
    return;
  }
  // A strided C (attention heads write into [T, H] rows): through a dense copy.
  std::vector<float>& dense_c = st.dense_c;
  dense_c.resize(static_cast<size_t>(M) * N);
  const size_t row_bytes = static_cast<size_t>(N) * sizeof(float);
  for (int i = 0; i < M && beta != 0.0f; ++i)
    std::memcpy(dense_c.data() + static_cast<size_t>(i) * N, C + static_cast<size_t>(i) * ldc, row_bytes);
  st.run_matmul(trans_a, trans_b, M, N, K, alpha, a, b, beta, dense_c.data());
  for (int i = 0; i < M; ++i)
    std::memcpy(C + static_cast<size_t>(i) * ldc, dense_c.data() + static_cast<size_t>(i) * N, row_bytes);
}

void bf16_roofline_product(int n) {
  MOE_CHECK(n > 0, "bf16_roofline_product: n=", n);
  MOE_CHECK(bf16_cpu_available(), "bf16 GEMM on the CPU: ", bf16_cpu_unavailable_reason());
  Bf16CpuState& st = state();
  std::vector<bf16_t>& a = st.roofline_a;
  std::vector<bf16_t>& b = st.roofline_b;
  std::vector<float>& c = st.roofline_c;
  const size_t nn = static_cast<size_t>(n) * n;
  if (c.size() != nn) {  // the inputs of the fp32 peak (peak_rate.cpp), in bf16
    a.resize(nn);
    b.resize(nn);
    c.resize(nn);
    for (size_t i = 0; i < nn; ++i) {
      a[i] = bf16_bits(static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f);
      b[i] = bf16_bits(static_cast<float>((i * 104729) % 1000) * 1e-3f - 0.5f);
    }
  }
  st.run_matmul(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
}
void set_bf16_cpu_threads(int n) {
  MOE_CHECK(n >= 1, "set_bf16_cpu_threads: thread count must be >= 1, got ", n);
  omp_set_num_threads(n);
  g_threads_set = true;
}

Bf16WeightScope::Bf16WeightScope(const std::vector<std::pair<const float*, size_t>>& blocks) {
  if (!bf16_here()) return;
  WeightCopy& w = state().own_weights;
  MOE_CHECK(!w.open, "Bf16WeightScope: a weight copy is already open");
  w.blocks.clear();
  size_t total = 0;
  for (const auto& [data, n] : blocks) {
    w.blocks.push_back({data, n, total});
    total += n;
  }
  if (w.bits.size() < total) w.bits.resize(total);
  for (const WeightCopy::Block& b : w.blocks) convert_avx512(b.data, w.bits.data() + b.at, b.n);
  w.open = true;
  open_ = &state();
}

Bf16WeightScope::Bf16WeightScope(const float* block, size_t n)
    : Bf16WeightScope(std::vector<std::pair<const float*, size_t>>{std::make_pair(block, n)}) {}

Bf16WeightScope::~Bf16WeightScope() {
  if (open_) open_->own_weights.open = false;
}

void invalidate_bf16_weights(const float* p) {
  WeightCopy& w = *state().weights;
  if (!w.open) return;
  for (const WeightCopy::Block& b : w.blocks)
    if (p >= b.data && p < b.data + b.n) w.open = false;
}

int64_t bf16_weight_copy_reads() { return state().weight_reads; }

Bf16InputScope::Bf16InputScope(const float* p, size_t n) {
  if (!bf16_here() || n == 0) return;
  Bf16CpuState& st = state();
  MOE_CHECK(st.open_inputs < kMaxInputScopes, "Bf16InputScope: more than ", kMaxInputScopes, " open at once");
  InputCopy& in = st.inputs[st.open_inputs++];
  in.data = p;
  in.n = n;
  in.converted = false;
  state_ = &st;
}

Bf16InputScope::~Bf16InputScope() {
  if (state_) --state_->open_inputs;
}

int64_t bf16_input_conversions() { return state().input_conversions; }

#endif

}  // namespace moe::kernels
