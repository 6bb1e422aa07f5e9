// The CUDA leaf kernels against the CPU ones, test-backend-ops style. The ops of the CPU op table
// (tests/ops/op_table.h: linear through the device seam, rmsnorm, rope, attention, swiglu,
// embedding, cross_entropy, grouped experts) run their entries' device checks at the device shapes
// (device_ops()); the device-only ops follow in the table below (gemm with its strides and bf16,
// add_inplace, copy, fill_zero, MLA's head assembly, copy_cols, adamw, sum_squares, the permute
// and router kernels): they have no entry in the CPU table, whose checks are a naive reference and
// finite differences of a differentiable op, and their CPU kernels are tested by their own suites.
// Every case fills the inputs, runs the CPU kernel with the active device cpu and the
// kernels::cuda one on device copies of the same inputs, and compares every output. Gradient
// outputs are pre-filled with nonzero values on both sides, so the += contract is checked too.
// Error = normalised mean squared error (ggml's NMSE):
//   nmse = Σ (gpu - cpu)² / Σ cpu²
// with the bound stated per case; index outputs (layouts, top-k ids, counts) must match exactly.
// One line per case; exit 1 on any failure, 77 (ctest: skipped) without a visible GPU.
#include <algorithm>
#ifdef MOETRAIN_EMULATED_CUDA
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "kernels/simt/simt_cpu.h"
#endif
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/context.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/permute.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu_mlp.h"
#include "kernels/router_ops.h"
#include "ops/op_device.h"
#include "ops/op_table.h"

namespace {

using namespace moe;
using namespace moe::kernels;
using moe::ops::Checker;
using moe::ops::dev;
using moe::ops::DeviceScope;
using moe::ops::host;
using moe::ops::randn;
using moe::ops::uniform;
using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

// Expert ids of T tokens × k distinct slots in [0, E), expert `skip` never chosen (-1: none).
IVec topk_ids(Rng& rng, int T, int k, int E, int skip) {
  IVec idx(static_cast<size_t>(T) * k);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool again;
      do {
        e = static_cast<int32_t>(rng.below(E));
        again = e == skip;
        for (int i = 0; i < j; ++i) again = again || idx[static_cast<size_t>(t) * k + i] == e;
      } while (again);
      idx[static_cast<size_t>(t) * k + j] = e;
    }
  return idx;
}

struct OpCase {
  std::string name;
  std::string shape;
  double bound;  // NMSE bound of the float outputs
  std::function<void(Checker&)> run;
};

// ---------------------------------------------------------------------------------------------
// The table.

void add_gemm(std::vector<OpCase>& ops, bool ta, bool tb, int M, int N, int K, float alpha,
              float beta, int pad, bool bf16) {
  const std::string name = str_cat("gemm", bf16 ? "_bf16" : "", " ", ta ? "T" : "N", tb ? "T" : "N",
                                   pad ? " strided" : "");
  const std::string shape = str_cat("M=", M, " N=", N, " K=", K, " a=", alpha, " b=", beta);
  // fp32: cuBLAS vs OpenBLAS round-off (~1e-13 expected); bf16: input rounding 2^-9 (~3e-6).
  ops.push_back({name, shape, bf16 ? 1e-4 : 1e-7, [=](Checker& c) {
                   Rng rng(1000 + M * 7 + N * 3 + K);
                   const int lda = pad ? (ta ? M : K) + pad : 0,
                             ldb = pad ? (tb ? K : N) + pad + 1 : 0, ldc = pad ? N + pad + 2 : 0;
                   const size_t a_n = static_cast<size_t>(ta ? K : M) * (lda ? lda : (ta ? M : K));
                   const size_t b_n = static_cast<size_t>(tb ? N : K) * (ldb ? ldb : (tb ? K : N));
                   const size_t c_n = static_cast<size_t>(M) * (ldc ? ldc : N);
                   Vec A = randn(rng, a_n), B = randn(rng, b_n), C = randn(rng, c_n);
                   auto dA = dev(A), dB = dev(B);
                   auto dC = dev(C);
                   gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                   {
                     const DeviceScope bf16_gemm(Device::kCpu, bf16);  // cuda::gemm is called directly
                     cuda::gemm(ta, tb, M, N, K, alpha, dA.data(), lda, dB.data(), ldb, beta,
                                dC.data(), ldc);
                   }
                   c.close("C", host(dC), C);
                 }});
}

void add_elementwise(std::vector<OpCase>& ops) {
  const size_t n = 4099;
  ops.push_back({"add_inplace", str_cat("n=", n), 0.0, [=](Checker& c) {
                   Rng rng(6);
                   Vec y = randn(rng, n), x = randn(rng, n);
                   auto dy = dev(y), dx = dev(x);
                   add_inplace(y.data(), x.data(), n);
                   cuda::add_inplace(dy.data(), dx.data(), n);
                   c.close("y", host(dy), y);
                 }});
  ops.push_back({"copy + fill_zero", str_cat("n=", n), 0.0, [=](Checker& c) {
                   Rng rng(7);
                   Vec x = randn(rng, n), y = randn(rng, n), z = randn(rng, n);
                   auto dx = dev(x), dy = dev(y), dz = dev(z);
                   copy(y.data(), x.data(), n);
                   fill_zero(z.data(), n - 1);  // the last element stays
                   cuda::copy(dy.data(), dx.data(), n);
                   cuda::fill_zero(dz.data(), n - 1);
                   c.close("copy", host(dy), y);
                   c.close("fill_zero", host(dz), z);
                 }});
}

// Multi-head latent attention's head assembly: a query wider than the value (V padded), a value
// wider than the query (Q and K padded), YaRN-scaled table; and copy_cols both ways.
void add_mla(std::vector<OpCase>& ops) {
  struct S {
    int B, T, nh, dn, dr, dv;
    bool yarn;
  };
  for (S s : {S{2, 9, 3, 8, 4, 8, false}, S{1, 13, 2, 4, 6, 16, true}, S{2, 5, 1, 0, 2, 3, false}}) {
    const std::string shape = str_cat("B=", s.B, " T=", s.T, " nh=", s.nh, " dn=", s.dn, " dr=", s.dr,
                                      " dv=", s.dv, s.yarn ? " yarn" : "");
    ops.push_back({"mla_heads_forward + backward", shape, 1e-12, [=](Checker& c) {
                     Rng rng(40 + s.dv);
                     MlaShape m;
                     m.B = s.B, m.T = s.T, m.nh = s.nh, m.dn = s.dn, m.dr = s.dr, m.dv = s.dv;
                     m.D = std::max(s.dn + s.dr, s.dv);
                     YarnParams y;
                     y.factor = 4.0, y.mscale = 0.7, y.mscale_all_dim = 1.0, y.original_max_pos = 8;
                     const RopeTable table = s.yarn ? make_yarn_rope_table(20, s.dr, 10000.0, y)
                                                    : make_rope_table(20, s.dr, 10000.0);
                     const size_t N = static_cast<size_t>(s.B) * s.T, heads = N * s.nh * m.D;
                     Vec q = randn(rng, N * s.nh * (s.dn + s.dr)), kv = randn(rng, N * s.nh * (s.dn + s.dv)),
                         kpe = randn(rng, N * s.dr), Q(heads), K(heads), V(heads);
                     Vec dQ = randn(rng, heads), dK = randn(rng, heads), dV = randn(rng, heads);
                     Vec dq(q.size()), dkv(kv.size()), dkpe(kpe.size());
                     auto d_q = dev(q), d_kv = dev(kv), d_kpe = dev(kpe), d_Q = dev(randn(rng, heads)),
                          d_K = dev(randn(rng, heads)), d_V = dev(randn(rng, heads));
                     auto d_dQ = dev(dQ), d_dK = dev(dK), d_dV = dev(dV), d_dq = dev(randn(rng, q.size())),
                          d_dkv = dev(randn(rng, kv.size())), d_dkpe = dev(randn(rng, kpe.size()));
                     mla_heads_forward(Q.data(), K.data(), V.data(), q.data(), kv.data(), kpe.data(), table, m, 0.6f);
                     mla_heads_backward(dq.data(), dkv.data(), dkpe.data(), dQ.data(), dK.data(), dV.data(), table,
                                        m, 0.6f);
                     cuda::mla_heads_forward(d_Q.data(), d_K.data(), d_V.data(), d_q.data(), d_kv.data(),
                                             d_kpe.data(), table, m, 0.6f);
                     cuda::mla_heads_backward(d_dq.data(), d_dkv.data(), d_dkpe.data(), d_dQ.data(), d_dK.data(),
                                              d_dV.data(), table, m, 0.6f);
                     c.close("Q", host(d_Q), Q);
                     c.close("K", host(d_K), K);
                     c.close("V", host(d_V), V);
                     c.close("dq", host(d_dq), dq);
                     c.close("dkv", host(d_dkv), dkv);
                     c.close("dkpe", host(d_dkpe), dkpe);
                   }});
  }
  for (auto [from, to] : {std::pair{12, 8}, std::pair{8, 12}}) {
    ops.push_back({"copy_cols", str_cat("rows=37 ", from, " -> ", to), 0.0, [=](Checker& c) {
                     Rng rng(50 + to);
                     Vec src = randn(rng, 37 * static_cast<size_t>(from)), dst(37 * static_cast<size_t>(to));
                     auto d_src = dev(src), d_dst = dev(randn(rng, dst.size()));
                     copy_cols(dst.data(), to, src.data(), from, 37);
                     cuda::copy_cols(d_dst.data(), to, d_src.data(), from, 37);
                     c.close("dst", host(d_dst), dst);
                   }});
  }
}

void add_adamw(std::vector<OpCase>& ops) {
  const size_t n = 5003;
  ops.push_back({"adamw_update", str_cat("n=", n, " step=3"), 1e-10, [=](Checker& c) {
                   Rng rng(70);
                   Vec p = randn(rng, n), g = randn(rng, n), m = randn(rng, n, 0.1),
                       v = uniform(rng, n, 0.0, 0.2);
                   auto d_p = dev(p), d_g = dev(g), d_m = dev(m), d_v = dev(v);
                   AdamWParams hp;
                   hp.lr = 3e-3f;
                   hp.weight_decay = 0.1f;
                   adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp, 3, 0.8f);
                   cuda::adamw_update(d_p.data(), d_g.data(), d_m.data(), d_v.data(), n, hp, 3,
                                      0.8f);
                   c.close("p", host(d_p), p);
                   c.close("m", host(d_m), m);
                   c.close("v", host(d_v), v);
                 }});
  for (size_t len : {size_t{100003}, size_t{1}, size_t{0}}) {
    // Double sums in a different order: ~1e-30 expected.
    ops.push_back({"sum_squares", str_cat("n=", len), 1e-20, [=](Checker& c) {
                     Rng rng(71);
                     Vec x = randn(rng, len);
                     auto d_x = dev(x);
                     c.scalar("sum", cuda::sum_squares(d_x.data(), len),
                              sum_squares(x.data(), len));
                   }});
  }
}

// offsets_E1 of a layout: no capacity (cap 0), a capacity C, or padded (e·C).
enum class Offsets { kFull, kCapacity, kPadded };
IVec layout_offsets(const IVec& count, int cap, Offsets kind) {
  const int E = static_cast<int>(count.size());
  IVec off(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    const int kept = kind == Offsets::kFull ? count[e] : std::min(count[e], cap);
    off[e + 1] = kind == Offsets::kPadded ? (e + 1) * cap : off[e] + kept;
  }
  return off;
}

void add_permute(std::vector<OpCase>& ops) {
  struct S {
    int T, k, E, skip;
  };
  // E = 12288 is the most experts count_kernel histograms in shared memory (48 KiB, the default
  // limit); E = 12289 takes its global-memory path.
  for (S s : {S{50, 3, 7, 5}, S{1000, 1, 16, 3}, S{257, 4, 64, -1}, S{300, 2, 12288, -1},
              S{300, 2, 12289, -1}}) {
    const std::string shape = str_cat("T=", s.T, " k=", s.k, " E=", s.E,
                                      s.skip >= 0 ? str_cat(" (expert ", s.skip, " empty)") : "");
    ops.push_back({"count_pairs_per_expert", shape, 0.0, [=](Checker& c) {
                     Rng rng(80);
                     IVec idx = topk_ids(rng, s.T, s.k, s.E, s.skip);
                     auto d_idx = dev(idx);
                     IVec cnt(s.E, -7), d_cnt(s.E, -7);
                     count_pairs_per_expert(cnt.data(), idx.data(), idx.size(), s.E);
                     cuda::count_pairs_per_expert(d_cnt.data(), d_idx.data(), idx.size(), s.E);
                     c.same("count", d_cnt, cnt);
                   }});
    for (Offsets kind : {Offsets::kFull, Offsets::kCapacity, Offsets::kPadded}) {
      const char* kname = kind == Offsets::kFull       ? "all kept"
                          : kind == Offsets::kCapacity ? "capacity drops"
                                                       : "padded E*C";
      ops.push_back({str_cat("place_pairs ", kname), shape, 0.0, [=](Checker& c) {
                       Rng rng(81);
                       IVec idx = topk_ids(rng, s.T, s.k, s.E, s.skip);
                       IVec cnt(s.E);
                       count_pairs_per_expert(cnt.data(), idx.data(), idx.size(), s.E);
                       const int cap = std::max(1, s.T * s.k / s.E * 3 / 4);  // below the mean
                       IVec off = layout_offsets(cnt, cap, kind);
                       IVec slot(off[s.E], -1), row(idx.size(), 99);
                       auto d_idx = dev(idx), d_slot = dev(slot), d_row = dev(row);
                       place_pairs(slot.data(), row.data(), idx.data(), off.data(), idx.size(),
                                   s.E);
                       cuda::place_pairs(d_slot.data(), d_row.data(), d_idx.data(), off.data(),
                                         idx.size(), s.E);
                       c.same("slot_of_row", host(d_slot), slot);
                       c.same("row_of_slot", host(d_row), row);
                     }});
    }
  }
  ops.push_back({"place_pairs", "P=0", 0.0, [](Checker& c) {
                   IVec off = {0, 0, 0};
                   cuda::place_pairs(nullptr, nullptr, nullptr, off.data(), 0, 2);
                   cuda::synchronize("place_pairs P=0");
                 }});
  ops.push_back({"count_pairs_per_expert bad id refused", "P=6 E=3", 0.0, [](Checker& c) {
                   auto d_idx = dev(IVec{0, 1, 2, 3, 1, 0});
                   IVec cnt(3);
                   try {
                     cuda::count_pairs_per_expert(cnt.data(), d_idx.data(), 6, 3);
                     c.mismatch("throw", "no moe::Error for id 3");
                   } catch (const Error&) {
                   }
                 }});

  // The row kernels on a padded layout with drops (rows of -1 and slots of -1) and odd H.
  struct R {
    int T, k, E, H;
  };
  for (R s : {R{61, 2, 8, 37}, R{40, 1, 4, 300}, R{0, 2, 4, 8}}) {
    const std::string shape = str_cat("T=", s.T, " k=", s.k, " E=", s.E, " H=", s.H);
    struct Layout {
      IVec idx, slot, row;
      size_t N;
    };
    auto make_layout = [s](Rng& rng) {
      Layout l;
      l.idx = topk_ids(rng, s.T, s.k, s.E, s.E > 2 ? 1 : -1);
      IVec cnt(s.E);
      count_pairs_per_expert(cnt.data(), l.idx.data(), l.idx.size(), s.E);
      IVec off = layout_offsets(cnt, std::max(1, s.T * s.k / s.E), Offsets::kPadded);
      l.N = static_cast<size_t>(off[s.E]);
      l.slot.assign(l.N, -1);
      l.row.assign(l.idx.size(), -1);
      place_pairs(l.slot.data(), l.row.data(), l.idx.data(), off.data(), l.idx.size(), s.E);
      return l;
    };
    ops.push_back({"gather_rows", shape, 0.0, [=](Checker& c) {
                     Rng rng(90);
                     Layout l = make_layout(rng);
                     Vec x = randn(rng, static_cast<size_t>(s.T) * s.H),
                         rows = randn(rng, l.N * s.H);
                     auto d_x = dev(x), d_rows = dev(rows);
                     auto d_slot = dev(l.slot);
                     gather_rows(rows.data(), x.data(), l.slot.data(), l.N, s.k, s.H);
                     cuda::gather_rows(d_rows.data(), d_x.data(), d_slot.data(), l.N, s.k, s.H);
                     c.close("rows", host(d_rows), rows);
                   }});
    ops.push_back(
        {"gather_rows_backward", shape, 0.0, [=](Checker& c) {
           Rng rng(91);
           Layout l = make_layout(rng);
           Vec dx = randn(rng, static_cast<size_t>(s.T) * s.H), drows = randn(rng, l.N * s.H);
           auto d_dx = dev(dx), d_drows = dev(drows);
           auto d_row = dev(l.row);
           gather_rows_backward(dx.data(), drows.data(), l.row.data(), s.T, s.k, s.H);
           cuda::gather_rows_backward(d_dx.data(), d_drows.data(), d_row.data(), s.T, s.k, s.H);
           c.close("dx", host(d_dx), dx);
         }});
    for (bool acc : {false, true}) {
      ops.push_back(
          {acc ? "combine_rows accumulate" : "combine_rows", shape, 1e-10, [=](Checker& c) {
             Rng rng(92);
             Layout l = make_layout(rng);
             Vec y = randn(rng, l.N * s.H), w = uniform(rng, l.idx.size(), 0.0, 1.0),
                 out = randn(rng, static_cast<size_t>(s.T) * s.H);
             auto d_y = dev(y), d_w = dev(w), d_out = dev(out);
             auto d_row = dev(l.row);
             combine_rows(out.data(), y.data(), w.data(), l.row.data(), s.T, s.k, s.H, acc);
             cuda::combine_rows(d_out.data(), d_y.data(), d_w.data(), d_row.data(), s.T, s.k, s.H,
                                acc);
             c.close("out", host(d_out), out);
           }});
    }
    for (int which : {0, 1, 2}) {  // both outputs, dy only, dweight only
      const char* name = which == 0   ? "combine_rows_backward"
                         : which == 1 ? "combine_rows_backward dweight=null"
                                      : "combine_rows_backward dy=null";
      ops.push_back(
          {name, shape, 1e-10, [=](Checker& c) {
             Rng rng(93);
             Layout l = make_layout(rng);
             Vec y = randn(rng, l.N * s.H), w = uniform(rng, l.idx.size(), 0.0, 1.0),
                 dout = randn(rng, static_cast<size_t>(s.T) * s.H), dy = randn(rng, l.N * s.H),
                 dw = randn(rng, l.idx.size());
             auto d_y = dev(y), d_w = dev(w), d_dout = dev(dout), d_dy = dev(dy), d_dw = dev(dw);
             auto d_row = dev(l.row);
             const bool want_dy = which != 2, want_dw = which != 1;
             combine_rows_backward(want_dy ? dy.data() : nullptr, want_dw ? dw.data() : nullptr,
                                   dout.data(), y.data(), w.data(), l.row.data(), s.T, s.k, s.H);
             cuda::combine_rows_backward(want_dy ? d_dy.data() : nullptr,
                                         want_dw ? d_dw.data() : nullptr, d_dout.data(), d_y.data(),
                                         d_w.data(), d_row.data(), s.T, s.k, s.H);
             c.close("dy", host(d_dy), dy);
             c.close("dweight", host(d_dw), dw);
           }});
    }
  }

  // Expert-parallel regroup: row_of_i is a permutation of n rows into n + 5 destination rows.
  for (int n : {0, 1, 211}) {
    const int H = 45;
    const std::string shape = str_cat("n=", n, " H=", H);
    auto perm = [n](Rng& rng) {
      IVec r(n + 5);
      for (int i = 0; i < n + 5; ++i) r[i] = i;
      for (int i = n + 4; i > 0; --i) std::swap(r[i], r[rng.below(i + 1)]);
      r.resize(n);
      return r;
    };
    ops.push_back({"scatter_rows + gather_rows_by_index", shape, 0.0, [=](Checker& c) {
                     Rng rng(95);
                     IVec r = perm(rng);
                     const size_t rows = static_cast<size_t>(n) + 5;
                     Vec src = randn(rng, static_cast<size_t>(n) * H), dst = randn(rng, rows * H),
                         big = randn(rng, rows * H), back = randn(rng, static_cast<size_t>(n) * H);
                     auto d_src = dev(src), d_dst = dev(dst), d_big = dev(big), d_back = dev(back);
                     auto d_r = dev(r);
                     scatter_rows(dst.data(), src.data(), r.data(), n, H);
                     gather_rows_by_index(back.data(), big.data(), r.data(), n, H);
                     cuda::scatter_rows(d_dst.data(), d_src.data(), d_r.data(), n, H);
                     cuda::gather_rows_by_index(d_back.data(), d_big.data(), d_r.data(), n, H);
                     c.close("scatter", host(d_dst), dst);
                     c.close("gather", host(d_back), back);
                   }});
    ops.push_back(
        {"gather_scaled_rows + backward", shape, 1e-10, [=](Checker& c) {
           Rng rng(96);
           IVec r = perm(rng);
           const size_t rows = static_cast<size_t>(n) + 5;
           Vec src = randn(rng, rows * H), val = uniform(rng, n, 0.0, 1.0),
               dst = randn(rng, static_cast<size_t>(n) * H),
               d = randn(rng, static_cast<size_t>(n) * H), dsrc = randn(rng, rows * H),
               dval = randn(rng, n);
           auto d_src = dev(src), d_val = dev(val), d_dst = dev(dst), d_d = dev(d),
                d_dsrc = dev(dsrc), d_dval = dev(dval);
           auto d_r = dev(r);
           gather_scaled_rows(dst.data(), src.data(), r.data(), val.data(), n, H);
           gather_scaled_rows_backward(dsrc.data(), dval.data(), d.data(), src.data(), r.data(),
                                       val.data(), n, H);
           cuda::gather_scaled_rows(d_dst.data(), d_src.data(), d_r.data(), d_val.data(), n, H);
           cuda::gather_scaled_rows_backward(d_dsrc.data(), d_dval.data(), d_d.data(), d_src.data(),
                                             d_r.data(), d_val.data(), n, H);
           c.close("dst", host(d_dst), dst);
           c.close("dsrc", host(d_dsrc), dsrc);
           c.close("dvalue", host(d_dval), dval);
         }});
  }
}

void add_router(std::vector<OpCase>& ops) {
  struct S {
    int T, E, k;
    bool renorm;
  };
  for (S s : {S{67, 16, 1, false}, S{67, 16, 4, true}, S{130, 64, 6, false}, S{9, 8, 8, true}}) {
    const std::string shape = str_cat("T=", s.T, " E=", s.E, " k=", s.k, s.renorm ? " renorm" : "");
    ops.push_back({"router_topk", shape, 1e-10, [=](Checker& c) {
                     Rng rng(100 + s.E);
                     Vec scores = randn(rng, static_cast<size_t>(s.T) * s.E, 2.0),
                         w(static_cast<size_t>(s.T) * s.k);
                     IVec idx(w.size(), -1);
                     auto d_scores = dev(scores), d_w = dev(w);
                     auto d_idx = dev(idx);
                     router_topk(scores.data(), idx.data(), w.data(), s.T, s.E, s.k, s.renorm);
                     cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), s.T, s.E, s.k,
                                       s.renorm);
                     c.same("topk_idx", host(d_idx), idx);
                     c.close("scores", host(d_scores), scores);
                     c.close("weights", host(d_w), w);
                   }});
    for (bool aux : {false, true}) {
      ops.push_back({aux ? "router_topk_backward aux" : "router_topk_backward", shape, 1e-10,
                     [=](Checker& c) {
                       Rng rng(110 + s.E);
                       const int B = aux && s.T % 2 == 0 ? 2 : 1, S_len = s.T / B;
                       Vec scores = randn(rng, static_cast<size_t>(s.T) * s.E, 2.0),
                           w(static_cast<size_t>(s.T) * s.k);
                       IVec idx(w.size());
                       router_topk(scores.data(), idx.data(), w.data(), s.T, s.E, s.k, s.renorm);
                       Vec dw = randn(rng, w.size()),
                           coef = randn(rng, static_cast<size_t>(B) * s.E),
                           dlogits = randn(rng, scores.size());  // overwritten
                       auto d_scores = dev(scores), d_dw = dev(dw), d_coef = dev(coef),
                            d_dlogits = dev(dlogits);
                       auto d_idx = dev(idx);
                       router_topk_backward(dlogits.data(), scores.data(), idx.data(), dw.data(),
                                            s.T, s.E, s.k, s.renorm, aux ? coef.data() : nullptr,
                                            S_len, 0.01f);
                       cuda::router_topk_backward(d_dlogits.data(), d_scores.data(), d_idx.data(),
                                                  d_dw.data(), s.T, s.E, s.k, s.renorm,
                                                  aux ? d_coef.data() : nullptr, S_len, 0.01f);
                       c.close("dlogits", host(d_dlogits), dlogits);
                     }});
    }
    // Same double sums in the same order: bit-identical.
    ops.push_back({"router_aux_stats", shape, 0.0, [=](Checker& c) {
                     Rng rng(120 + s.E);
                     const int B = s.T % 2 == 0 ? 2 : 1;
                     Vec scores = randn(rng, static_cast<size_t>(s.T) * s.E, 2.0),
                         w(static_cast<size_t>(s.T) * s.k);
                     IVec idx(w.size());
                     router_topk(scores.data(), idx.data(), w.data(), s.T, s.E, s.k, s.renorm);
                     auto d_scores = dev(scores);
                     auto d_idx = dev(idx);
                     const size_t be = static_cast<size_t>(B) * s.E;
                     std::vector<double> cnt(be), sum(be), d_cnt(be), d_sum(be);
                     router_aux_stats(cnt.data(), sum.data(), idx.data(), scores.data(), s.T, s.E,
                                      s.k, B);
                     cuda::router_aux_stats(d_cnt.data(), d_sum.data(), d_idx.data(),
                                            d_scores.data(), s.T, s.E, s.k, B);
                     c.same("count", d_cnt, cnt);
                     c.same("score_sum", d_sum, sum);
                   }});
    // DeepSeek-V3 (noaux_tc): sigmoid scores, a selection bias on the device, a scale; its
    // backward with the normalised-score aux term; the aux statistics of s / sum(s).
    ops.push_back({"router_topk sigmoid+bias", shape, 1e-10, [=](Checker& c) {
                     Rng rng(140 + s.E);
                     Vec scores = randn(rng, static_cast<size_t>(s.T) * s.E, 2.0),
                         w(static_cast<size_t>(s.T) * s.k), bias = randn(rng, s.E, 0.5);
                     IVec idx(w.size(), -1);
                     auto d_scores = dev(scores), d_w = dev(w), d_bias = dev(bias);
                     auto d_idx = dev(idx);
                     math::RouterScoring hs{true, bias.data(), 2.5f, {}},
                         ds{true, d_bias.data(), 2.5f, {}};
                     router_topk(scores.data(), idx.data(), w.data(), s.T, s.E, s.k, s.renorm, hs);
                     cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), s.T, s.E, s.k,
                                       s.renorm, ds);
                     c.same("topk_idx", host(d_idx), idx);
                     c.close("scores", host(d_scores), scores);
                     c.close("weights", host(d_w), w);
                     const int B = s.T % 2 == 0 ? 2 : 1;
                     const size_t be = static_cast<size_t>(B) * s.E;
                     std::vector<double> cnt(be), sum(be), d_cnt(be), d_sum(be);
                     router_aux_stats(cnt.data(), sum.data(), idx.data(), scores.data(), s.T, s.E,
                                      s.k, B, /*normalise=*/true);
                     cuda::router_aux_stats(d_cnt.data(), d_sum.data(), d_idx.data(),
                                            d_scores.data(), s.T, s.E, s.k, B, /*normalise=*/true);
                     c.same("count", d_cnt, cnt);
                     // expf differs between the devices in the last bit: close, not the same bits.
                     c.close("score_sum normalised", Vec(d_sum.begin(), d_sum.end()),
                             Vec(sum.begin(), sum.end()));
                     Vec dw = randn(rng, w.size()), coef = randn(rng, be), dlogits(scores.size());
                     auto d_dw = dev(dw), d_coef = dev(coef), d_dlogits = dev(dlogits);
                     router_topk_backward(dlogits.data(), scores.data(), idx.data(), dw.data(), s.T,
                                          s.E, s.k, s.renorm, coef.data(), s.T / B, 0.01f, hs);
                     cuda::router_topk_backward(d_dlogits.data(), d_scores.data(), d_idx.data(),
                                                d_dw.data(), s.T, s.E, s.k, s.renorm, d_coef.data(),
                                                s.T / B, 0.01f, ds);
                     c.close("dlogits", host(d_dlogits), dlogits);
                   }});
    // Group-limited selection (4 groups; enough kept for k): softmax scores the groups by their
    // max (DeepSeek-V2), sigmoid + bias by their top-2 sum (V3).
    const int G = s.E / 4, topk_group = std::min(4, std::max(2, (s.k + G - 1) / G));
    for (bool sig : {false, true}) {
      ops.push_back({sig ? "router_topk groups sigmoid+bias" : "router_topk groups softmax",
                     str_cat(shape, " n_group=4 topk_group=", topk_group), 1e-10, [=](Checker& c) {
                       Rng rng(150 + s.E + sig);
                       Vec scores = randn(rng, static_cast<size_t>(s.T) * s.E, 2.0),
                           w(static_cast<size_t>(s.T) * s.k), bias = randn(rng, s.E, 0.5);
                       IVec idx(w.size(), -1);
                       auto d_scores = dev(scores), d_w = dev(w), d_bias = dev(bias);
                       auto d_idx = dev(idx);
                       const math::GroupLimit groups{4, topk_group, sig};
                       math::RouterScoring hs{sig, sig ? bias.data() : nullptr, sig ? 2.5f : 1.0f,
                                              groups},
                           ds{sig, sig ? d_bias.data() : nullptr, sig ? 2.5f : 1.0f, groups};
                       router_topk(scores.data(), idx.data(), w.data(), s.T, s.E, s.k, s.renorm, hs);
                       cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), s.T, s.E, s.k,
                                         s.renorm, ds);
                       c.same("topk_idx", host(d_idx), idx);
                       c.close("scores", host(d_scores), scores);
                       c.close("weights", host(d_w), w);
                     }});
    }
  }
}

std::vector<OpCase> all_ops() {
  std::vector<OpCase> ops;
  for (const moe::ops::Op& op : moe::ops::device_ops())
    for (const moe::ops::DeviceCheck& check : op.device)
      ops.push_back({check.name, op.shape, check.bound, check.run});
  add_gemm(ops, false, false, 37, 53, 29, 0.7f, 0.3f, 0, false);
  add_gemm(ops, false, true, 64, 33, 100, 1.0f, 0.0f, 0, false);
  add_gemm(ops, true, false, 17, 128, 65, 1.0f, 1.0f, 0, false);
  add_gemm(ops, true, true, 5, 7, 3, -0.5f, 0.25f, 0, false);
  add_gemm(ops, false, false, 31, 29, 47, 1.0f, 0.5f, 3, false);
  add_gemm(ops, true, true, 31, 29, 47, 1.0f, 0.0f, 2, false);
  add_gemm(ops, false, true, 9, 11, 0, 1.0f, 0.5f, 0, false);  // K = 0: C = beta·C
  add_gemm(ops, false, true, 9, 11, 0, 1.0f, 0.0f, 1, false);  // K = 0, beta 0: C = 0
  add_gemm(ops, false, false, 0, 11, 5, 1.0f, 0.5f, 0, false);
  add_gemm(ops, false, false, 128, 96, 200, 1.0f, 0.0f, 0, true);
  add_gemm(ops, true, false, 33, 65, 47, 0.5f, 1.0f, 3, true);
  add_gemm(ops, false, true, 64, 40, 96, 1.0f, 1.0f, 0, true);
  add_elementwise(ops);
  add_mla(ops);
  add_adamw(ops);
  add_permute(ops);
  add_router(ops);
  return ops;
}

}  // namespace

#ifdef MOETRAIN_EMULATED_CUDA
std::pair<int, int> run_simt_refusals();  // simt_refusals.cpp: (cases, failed)

// The __global__ functions of the backend's source (src/kernels/cuda/*.cu), by name.
std::vector<std::string> global_functions() {
  std::vector<std::string> names;
  const std::filesystem::path dir = std::filesystem::path(MOETRAIN_SOURCE_DIR) / "src/kernels/cuda";
  const std::regex re(R"(__global__\s+void\s+(\w+)\s*\()");
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().extension() != ".cu") continue;
    std::ifstream in(f.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
      names.push_back((*it)[1]);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "N of M __global__ functions executed", naming the ones that never ran; false unless all ran.
bool kernel_count_line() {
  std::set<std::string> ran;
  for (const auto& [name, n] : moe::simt::kernels_run()) ran.insert(name);
  const std::vector<std::string> all = global_functions();
  std::string missing;
  int hit = 0;
  for (const std::string& k : all) {
    if (ran.count(k)) ++hit;
    else missing += " " + k;
  }
  std::printf("kernels executed: %d of %zu __global__ functions in src/kernels/cuda%s%s\n", hit,
              all.size(), missing.empty() ? "" : "; never ran:", missing.c_str());
  return hit == static_cast<int>(all.size()) && !all.empty();
}
#endif

int main(int argc, char** argv) {
  std::string why;
  if (moe::cuda_device_count(&why) == 0) {
    std::printf("cuda_ops: SKIPPED, no usable CUDA device (%s)\n", why.c_str());
    return 77;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
#ifdef MOETRAIN_EMULATED_CUDA
    if (a == "--seed" && i + 1 < argc) {
      moe::simt::set_schedule_seed(std::strtoull(argv[++i], nullptr, 10));
      continue;
    }
#endif
    std::fprintf(stderr, "usage: moetrain_cuda_tests%s\n",
#ifdef MOETRAIN_EMULATED_CUDA
                 " [--seed N]  (the SIMT shim's schedule seed)"
#else
                 ""
#endif
    );
    return 2;
  }
  int failed = 0, total = 0;
#ifdef MOETRAIN_EMULATED_CUDA
  std::printf("SIMT shim, schedule seed %llu\n",
              static_cast<unsigned long long>(moe::simt::schedule_seed()));
#endif
  std::printf("%-40s %-36s %-10s %-8s %s\n", "op", "shape", "nmse", "bound", "result");
  for (const OpCase& op : all_ops()) {
    ++total;
    Checker c;
    std::string error;
    try {
      op.run(c);
      moe::kernels::cuda::synchronize(op.name.c_str());
    } catch (const std::exception& e) {
      error = e.what();
    }
    const bool ok = error.empty() && c.exact_ok && c.worst <= op.bound;
    if (!ok) ++failed;
    std::printf("%-40s %-36s %-10.3e %-8.1e %s%s%s\n", op.name.c_str(), op.shape.c_str(), c.worst,
                op.bound, ok ? "PASS" : "FAIL", c.note.c_str(),
                error.empty() ? "" : (" error: " + error).c_str());
  }
#ifdef MOETRAIN_EMULATED_CUDA
  // The emulated GPU is this CPU: the roofline is measured once at a small size (it only shows
  // the measurement runs).
  const int roofline_n = 256, roofline_repeats = 2;
#else
  const int roofline_n = 4096, roofline_repeats = 5;
#endif
  for (bool bf16 : {false, true}) {
    ++total;
    try {
      std::printf("gemm roofline %s n=%d: %.1f GFLOP/s\n", bf16 ? "bf16" : "fp32", roofline_n,
                  moe::kernels::cuda::measure_gemm_gflops(roofline_n, roofline_repeats, bf16));
    } catch (const std::exception& e) {
      ++failed;
      std::printf("measure_gemm_gflops %s: FAIL %s\n", bf16 ? "bf16" : "fp32", e.what());
    }
  }
#ifdef MOETRAIN_EMULATED_CUDA
  ++total;
  if (!kernel_count_line()) ++failed;
  std::printf("SIMT shim refusals:\n");
  const auto [refusals, refused_wrong] = run_simt_refusals();
  failed += refused_wrong;
  total += refusals;
#endif
  std::printf("cuda_ops: %d of %d cases passed\n", total - failed, total);
  return failed ? 1 : 0;
}
