// Causal multi-head attention on the CPU, flash-style (see attention.h), one (b, h) pair at a time
// on strided views (row stride C = n_head·head_dim, so no transposes of the buffers).
// Queries and keys go in blocks of kBlock rows. The products of a block pair are register-blocked
// loops on 16-float vectors (kernels/lanes.h), built per instruction set (attention_blocks.inc),
// on tiles of a per-call workspace: the key block transposed for the scores, every block's rows
// padded to whole vectors for the products that run along head_dim. Key blocks above the
// diagonal are skipped, and so are the 16-key chunks of the diagonal block that no row of a row
// group sees (the causal half is never computed). Everything stays fp32 whatever --precision says:
// the scores and the softmax are fp32 (DESIGN.md, Numbers), as in the CUDA kernel. The exp is
// lanes.h's (the Cephes polynomial of element_math.h's exp_poly, which the CUDA kernel uses, with
// one product taken in another order), so the two devices agree to rounding, not bit for bit.
// Forward, query block i, online softmax over key blocks j <= i (running max m, sum l per row):
//   S = scale·Q_i K_j^T;  m' = max(m, rowmax S);  P = exp(S - m');  l = l·e^(m-m') + rowsum P;
//   O_i = O_i·e^(m-m') + P V_j;   finally O_i /= l, lse = m + log l.
// Backward, with P = exp(S - lse) recomputed and D_i = rowsum(dO_i ∘ O_i):
//   dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = scale·P ∘ (dP - D_i);
//   dQ_i += dS K_j;   dK_j += dS^T Q_i.
// Every sum runs in a fixed order along the reduced index, the tile products as fused
// multiply-adds and everything else rounded per operation (the file is compiled with
// -ffp-contract=off), so each instruction set gives the same bits (a test compares them). Before
// 2026-12-03 the tile products were BLAS calls: 1,536 sgemm calls in forward and 3,840 in backward
// per step of the tiny model; this kernel is 1.05-1.27x faster than those (README, Fused
// attention). A version with the products rounded apart (no FMA) was slower than the BLAS calls.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/element_math.h"
#include "kernels/lanes.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moe::kernels {

namespace {

using namespace lanes;

constexpr int kBlock = 64;  // rows per query block and per key block

// One (b, h): the views of its rows in the [B, T, C] buffers and in [B, nh, T].
struct HeadView {
  size_t off;      // element offset of row 0 in a [B, T, C] buffer
  size_t row_off;  // offset of row 0 in a [B, nh, T] buffer
  int T, C, hd;
  float scale;
};

HeadView head_view(int b, int h, int T, int n_head, int head_dim) {
  const int C = n_head * head_dim;
  return {static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * head_dim,
          (static_cast<size_t>(b) * n_head + h) * T,
          T,
          C,
          head_dim,
          1.0f / std::sqrt(static_cast<float>(head_dim))};
}

// head_dim rounded up to whole pairs of vectors: the row stride of the padded tiles.
int padded_dim(int hd) { return (hd + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes); }

// The tiles of one call, zeroed once: the padding columns [hd, hdp) stay 0, so the products along
// head_dim can run whole vectors. One call's workspace, so nothing is shared between calls.
// One head's keys are packed once for all its query blocks (key block j at offset j · tile), not
// once per (query block, key block) pair: at T = 128 that is 2 packings of each array instead of 3.
struct Tiles {
  int hd, hdp, nb;  // nb key blocks of kBlock rows (the last may be partial)
  std::vector<float> mem;
  float *kt, *vt;     // [nb][hd][kBlock]: the head's key blocks transposed (K, V)
  float *kp, *vp;     // [nb][kBlock][hdp]: the head's key blocks' rows (K, V)
  float *qp, *dp;     // [kBlock][hdp]: rows of a query block (Q, dO)
  float *acc, *acc2;  // [kBlock][hdp]: product accumulators
  float *s, *dps;     // [kBlock][kBlock]: scores / probabilities, dP / dS
  size_t tr, row;     // floats per block of kt / vt, of kp / vp
  Tiles(int head_dim, int T)
      : hd(head_dim), hdp(padded_dim(head_dim)), nb(std::max(1, (T + kBlock - 1) / kBlock)) {
    tr = static_cast<size_t>(hd) * kBlock;
    row = static_cast<size_t>(kBlock) * hdp;
    const size_t sq = static_cast<size_t>(kBlock) * kBlock;
    mem.assign(nb * (2 * tr + 2 * row) + 4 * row + 2 * sq, 0.0f);
    float* p = mem.data();
    for (float** t : {&kt, &vt}) *t = p, p += nb * tr;
    for (float** t : {&kp, &vp}) *t = p, p += nb * row;
    for (float** t : {&qp, &dp, &acc, &acc2}) *t = p, p += row;
    for (float** t : {&s, &dps}) *t = p, p += sq;
  }
};

// Unmasked keys of row t within the key block starting at s0 (clamped to [0, nk]).
int valid_keys(int t, int s0, int nk) { return std::clamp(t - s0 + 1, 0, nk); }

// The block kernels, once per instruction set (see attention_blocks.inc), chosen at run time by
// CPU feature (attention_cpu_isa). Where GCC's x86 target pragmas are not available, only the
// baseline is built.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOE_ATTENTION_ISAS 1
#pragma GCC push_options
#pragma GCC target("avx512f,fma")
#define MOE_ATTENTION_FMA 512
namespace isa_avx512 {
// Register tiles sized to 32 zmm registers: a score tile is 4 rows × 4 key chunks (16 accumulator
// vectors + 4 of keys), a product tile 8 rows × 2 vectors (16 + 2).
constexpr int kScoreRows = 4, kScoreChunks = 4, kAccRows = 8;
#include "kernels/attention_blocks.inc"
}  // namespace isa_avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#undef MOE_ATTENTION_FMA
#define MOE_ATTENTION_FMA 256
namespace isa_avx2 {
// 16 ymm registers, two per 16-float vector: a score tile is 2 rows × 2 key chunks (8 ymm of
// accumulators + 4 of keys), a product tile 2 rows × 2 vectors (8 + 4). The AVX-512 shapes spill
// here: 4 × 4 vectors are 32 ymm, and they ran at 2.1 GFLOP/s on an AVX2 Zen (2026-12-05).
constexpr int kScoreRows = 2, kScoreChunks = 2, kAccRows = 2;
#include "kernels/attention_blocks.inc"
}  // namespace isa_avx2
#pragma GCC pop_options
#undef MOE_ATTENTION_FMA
#endif
#define MOE_ATTENTION_FMA 0
namespace isa_base {
constexpr int kScoreRows = 2, kScoreChunks = 2, kAccRows = 2;  // as AVX2 (the lanes are in SSE)
#include "kernels/attention_blocks.inc"
}  // namespace isa_base
#undef MOE_ATTENTION_FMA
#ifdef MOE_ATTENTION_ISAS
#define ISA(name) isa_##name
#else
#define ISA(name) isa_base  // only the baseline is built
#endif

int g_forced_isa = -1;  // force_attention_cpu_isa (tests); -1: by CPU feature

int detected_isa() {
#ifdef MOE_ATTENTION_ISAS
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
  return 0;
}

void check_sizes(const char* who, int B, int T, int n_head, int head_dim) {
  MOE_CHECK(B >= 0 && T >= 0 && n_head > 0 && head_dim > 0, who, ": B=", B, " T=", T,
            " n_head=", n_head, " head_dim=", head_dim);
}

// The block kernels of the instruction set attention_cpu_isa() names.
template <class Fn>
Fn pick(Fn avx512, Fn avx2, Fn base) {
#ifdef MOE_ATTENTION_ISAS
  const int isa = attention_cpu_isa();
  if (isa == 2) return avx512;
  if (isa == 1) return avx2;
#else
  (void)avx512, (void)avx2;
#endif
  return base;
}

// What both directions walk: each (batch, head)'s keys and values packed into one set of tiles
// (backward: with the transposed copy), then block(head, tiles, t0, n) for each kBlock query rows.
template <class Block>
void for_each_query_block(const float* k, const float* v, int B, int T, int n_head, int head_dim,
                          bool backward, Block block) {
  Tiles w(head_dim, T);
  const auto pack = pick(&ISA(avx512)::pack_keys, &ISA(avx2)::pack_keys, &isa_base::pack_keys);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < n_head; ++h) {
      const HeadView g = head_view(b, h, T, n_head, head_dim);
      pack(w, k, v, g, backward);
      for (int t0 = 0; t0 < T; t0 += kBlock) block(g, w, t0, std::min(kBlock, T - t0));
    }
}

}  // namespace

int attention_cpu_isa() { return g_forced_isa >= 0 ? g_forced_isa : detected_isa(); }

void force_attention_cpu_isa(int isa) {
  MOE_CHECK(isa >= -1 && isa <= detected_isa(), "force_attention_cpu_isa: ", isa,
            " is not -1 or an instruction set this CPU has (0..", detected_isa(), ")");
  g_forced_isa = isa;
}

size_t attention_saved_floats(int B, int T, int n_head, int head_dim) {
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  return rows + rows * head_dim;
}

size_t attention_scratch_floats(int /*T*/) { return 0; }

void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int B, int T, int n_head, int head_dim) {
  MOE_CUDA_DISPATCH(attention_forward, out, att, q, k, v, B, T, n_head, head_dim);
  check_sizes("attention_forward", B, T, n_head, head_dim);
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  const auto block = pick(&ISA(avx512)::forward_query_block, &ISA(avx2)::forward_query_block,
                          &isa_base::forward_query_block);
  for_each_query_block(k, v, B, T, n_head, head_dim, /*backward=*/false,
                       [&](const auto& g, auto& w, int t0, int n) { block(out, att, att + rows, q, g, w, t0, n); });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* att, int B, int T, int n_head,
                        int head_dim, float* scratch) {
  MOE_CUDA_DISPATCH(attention_backward, dq, dk, dv, dout, q, k, v, att, B, T, n_head, head_dim,
                    scratch);
  check_sizes("attention_backward", B, T, n_head, head_dim);
  const size_t rows = static_cast<size_t>(B) * n_head * T;
  const auto block = pick(&ISA(avx512)::backward_query_block, &ISA(avx2)::backward_query_block,
                          &isa_base::backward_query_block);
  for_each_query_block(k, v, B, T, n_head, head_dim, /*backward=*/true, [&](const auto& g, auto& w, int t0, int n) {
    block(dq, dk, dv, dout, q, att, att + rows, g, w, t0, n);
  });
}

}  // namespace moe::kernels
