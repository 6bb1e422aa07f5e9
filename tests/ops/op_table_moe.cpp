// The op table's MoE permutation kernels (op_table.h, kernels/permute.h): the padding-free
// layout's counting sort (count_pairs_per_expert, place_pairs), the row kernels of dispatch and
// combine, and the expert-parallel regroup. Index outputs are compared exactly; the index maps the
// row kernels read are built by naive loops here.
#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "kernels/permute.h"
#include "ops/op_table.h"
#ifdef MOETRAIN_OP_DEVICE
#include "ops/op_device.h"
#endif

namespace moe::ops {

using namespace moe::kernels;
using test_util::uniform;
using IVec = std::vector<int32_t>;

// Expert ids of T tokens × k distinct slots in [0, E), expert `skip` never chosen (-1: none).
IVec topk_ids(Rng& rng, int T, int k, int E, int skip) {
  IVec idx(size_t(T) * k);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      int32_t e;
      bool again;
      do {
        e = static_cast<int32_t>(rng.below(E));
        again = e == skip;
        for (int i = 0; i < j; ++i) again = again || idx[size_t(t) * k + i] == e;
      } while (again);
      idx[size_t(t) * k + j] = e;
    }
  return idx;
}

void add_into(Vec& d, const Vec& x) {
  for (size_t i = 0; i < x.size(); ++i) d[i] += x[i];
}

namespace {

IVec naive_counts(const IVec& idx, int E) {
  IVec count(E, 0);
  for (int32_t e : idx) ++count[e];
  return count;
}

// offsets_E1 of a layout: every pair kept, a capacity `cap` per expert, or padded (e·cap).
IVec layout_offsets(const IVec& count, int cap, Offsets kind) {
  const int E = static_cast<int>(count.size());
  IVec off(E + 1, 0);
  for (int e = 0; e < E; ++e) {
    const int kept = kind == Offsets::kFull ? count[e] : std::min(count[e], cap);
    off[e + 1] = kind == Offsets::kPadded ? (e + 1) * cap : off[e] + kept;
  }
  return off;
}

// The stable counting sort: pairs in p order fill expert e's rows from off[e]; pairs past its
// rows get row -1, rows no pair fills keep slot -1.
struct Layout {
  IVec idx, off, slot, row;  // ids [P], offsets [E+1], slot_of_row [N], row_of_slot [P]
  size_t N = 0;
};
Layout naive_place(IVec idx, IVec off) {
  Layout l;
  const int E = static_cast<int>(off.size()) - 1;
  l.N = static_cast<size_t>(off[E]);
  l.slot.assign(l.N, -1);
  l.row.assign(idx.size(), -1);
  IVec next(off.begin(), off.end() - 1);
  for (size_t p = 0; p < idx.size(); ++p) {
    const int32_t e = idx[p];
    if (next[e] < off[e + 1]) {
      l.slot[next[e]] = static_cast<int32_t>(p);
      l.row[p] = next[e]++;
    }
  }
  l.idx = std::move(idx);
  l.off = std::move(off);
  return l;
}

// The row kernels' layout: padded E·C with C = T·k/E (at least 1), so some experts drop pairs
// and others leave padding rows; expert 1 never chosen when E > 2.
std::shared_ptr<const Layout> row_layout(int T, int k, int E) {
  Rng rng(90);
  IVec idx = topk_ids(rng, T, k, E, E > 2 ? 1 : -1);
  IVec off = layout_offsets(naive_counts(idx, E), std::max(1, T * k / E), Offsets::kPadded);
  return std::make_shared<const Layout>(naive_place(std::move(idx), std::move(off)));
}

// row_of_i: n distinct rows of n + 5, shuffled.
std::shared_ptr<const IVec> regroup_rows(int n) {
  Rng rng(95);
  IVec r(n + 5);
  for (int i = 0; i < n + 5; ++i) r[i] = i;
  for (int i = n + 4; i > 0; --i) std::swap(r[i], r[rng.below(i + 1)]);
  r.resize(n);
  return std::make_shared<const IVec>(std::move(r));
}

std::string layout_shape(int T, int k, int E, int skip) {
  return str_cat("T=", T, " k=", k, " E=", E, skip >= 0 ? str_cat(" (expert ", skip, " empty)") : "");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The layout. No FLOPs: bytes of the ids read and the maps written.

Op count_pairs_op(int T, int k, int E, int skip, bool bad_id) {
  Op op;
  op.name = "count_pairs_per_expert";
  op.shape = layout_shape(T, k, E, skip) + (bad_id ? " bad id" : "");
  Rng rng(80);
  IVec ids = topk_ids(rng, T, k, E, skip);
  if (bad_id) ids.at(3) = E;
  auto idx = std::make_shared<const IVec>(std::move(ids));
  const size_t P = idx->size();
  op.fwd_bytes = double(P + E) * sizeof(int32_t);
  op.make_inputs = [](Rng&) { return Tensors{}; };
  op.forward = [=](const Tensors&) {
    IVec count(E, -7);
    count_pairs_per_expert(count.data(), idx->data(), P, E);
    Vec out;
    append(out, count);
    return out;
  };
  op.reference = [=](const Tensors&) {
    Vec out;
    append(out, naive_counts(*idx, E));
    return out;
  };
  op.exact_tail = E;
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  if (bad_id) {
    op.device = {{"count_pairs_per_expert refused", 0.0, [=](Checker& c) {
                    auto d_idx = dev(*idx);
                    IVec cnt(E);
                    try {
                      cuda::count_pairs_per_expert(cnt.data(), d_idx.data(), P, E);
                      c.mismatch("throw", str_cat("no moe::Error for id ", E));
                    } catch (const Error&) {
                    }
                  }}};
    return op;
  }
  op.device = {{"count_pairs_per_expert", 0.0, [=](Checker& c) {
                  auto d_idx = dev(*idx);
                  IVec cnt(E, -7), d_cnt(E, -7);  // count_E is host memory on every device
                  count_pairs_per_expert(cnt.data(), idx->data(), P, E);
                  cuda::count_pairs_per_expert(d_cnt.data(), d_idx.data(), P, E);
                  c.same("count", d_cnt, cnt);
                }}};
#endif
  return op;
}

// Output [slot_of_row (N) | row_of_slot (P)], all exact. A capacity below the mean count drops.
Op place_pairs_op(int T, int k, int E, int skip, Offsets kind) {
  Op op;
  op.name = "place_pairs";
  const char* kname = kind == Offsets::kFull       ? "all kept"
                      : kind == Offsets::kCapacity ? "capacity drops"
                                                   : "padded E*C";
  op.shape = layout_shape(T, k, E, skip) + " " + kname;
  Rng rng(81);
  IVec ids = topk_ids(rng, T, k, E, skip);
  const int cap = std::max(1, T * k / std::max(E, 1) * 3 / 4);
  auto want = std::make_shared<const Layout>(
      naive_place(ids, layout_offsets(naive_counts(ids, E), cap, kind)));
  const size_t P = want->idx.size(), N = want->N;
  op.fwd_bytes = double(2 * P + N) * sizeof(int32_t);
  op.make_inputs = [](Rng&) { return Tensors{}; };
  op.forward = [=](const Tensors&) {
    IVec slot(N, -1), row(P, 99);
    place_pairs(slot.data(), row.data(), want->idx.data(), want->off.data(), P, E);
    Vec out;
    append(out, slot);
    append(out, row);
    return out;
  };
  op.reference = [=](const Tensors&) {
    Vec out;
    append(out, want->slot);
    append(out, want->row);
    return out;
  };
  op.exact_tail = N + P;
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"place_pairs", 0.0, [=](Checker& c) {
                  IVec slot(N, -1), row(P, 99);
                  auto d_idx = dev(want->idx), d_slot = dev(slot), d_row = dev(row);
                  place_pairs(slot.data(), row.data(), want->idx.data(), want->off.data(), P, E);
                  cuda::place_pairs(d_slot.data(), d_row.data(), d_idx.data(), want->off.data(), P,
                                    E);
                  c.same("slot_of_row", host(d_slot), slot);
                  c.same("row_of_slot", host(d_row), row);
                }}};
#endif
  return op;
}

// ---------------------------------------------------------------------------------------------
// Dispatch and combine rows.

// rows [N, H] from x [T, H]; padding rows zero. Backward: dx[t] += Σ_j drows[row(t·k + j)].
Op gather_rows_op(int T, int k, int E, int H) {
  Op op;
  op.name = "gather_rows";
  op.shape = str_cat("T=", T, " k=", k, " E=", E, " H=", H);
  auto l = row_layout(T, k, E);
  const size_t N = l->N;
  op.fwd_bytes = 2.0 * N * H * sizeof(float);
  op.bwd_flops = double(T) * k * H;
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, size_t(T) * H, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec rows(N * H, 7.0f);
    gather_rows(rows.data(), in[0].data(), l->slot.data(), N, k, H);
    return rows;
  };
  op.reference = [=](const Tensors& in) {
    Vec rows(N * H, 0.0f);
    for (size_t n = 0; n < N; ++n)
      if (l->slot[n] >= 0)
        std::copy_n(in[0].begin() + size_t(l->slot[n] / k) * H, H, rows.begin() + n * H);
    return rows;
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& drows) {
    gather_rows_backward(d[0].data(), drows.data(), l->row.data(), T, k, H);
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device.push_back({"gather_rows", 0.0, [=](Checker& c) {
                         Rng rng(90);
                         Vec x = randn(rng, size_t(T) * H), rows = randn(rng, N * H);
                         auto d_x = dev(x), d_rows = dev(rows);
                         auto d_slot = dev(l->slot);
                         gather_rows(rows.data(), x.data(), l->slot.data(), N, k, H);
                         cuda::gather_rows(d_rows.data(), d_x.data(), d_slot.data(), N, k, H);
                         c.close("rows", host(d_rows), rows);
                       }});
  op.device.push_back({"gather_rows_backward", 0.0, [=](Checker& c) {
                         Rng rng(91);
                         Vec dx = randn(rng, size_t(T) * H), drows = randn(rng, N * H);
                         auto d_dx = dev(dx), d_drows = dev(drows);
                         auto d_row = dev(l->row);
                         gather_rows_backward(dx.data(), drows.data(), l->row.data(), T, k, H);
                         cuda::gather_rows_backward(d_dx.data(), d_drows.data(), d_row.data(), T,
                                                    k, H);
                         c.close("dx", host(d_dx), dx);
                       }});
#endif
  return op;
}

// out[t] (= or += a fixed out0) Σ_j w[p]·y[row(p)]: 2·T·k·H; backward dy = w·dout and
// dweight = y·dout: 3·T·k·H.
Op combine_rows_op(int T, int k, int E, int H, bool accumulate) {
  Op op;
  op.name = "combine_rows";
  op.shape = str_cat("T=", T, " k=", k, " E=", E, " H=", H, accumulate ? " accumulate" : "");
  auto l = row_layout(T, k, E);
  const size_t N = l->N, P = l->row.size();
  op.fwd_flops = 2.0 * T * k * H;
  op.bwd_flops = 3.0 * T * k * H;
  Rng rng(92);
  auto out0 = std::make_shared<const Vec>(randn(rng, size_t(T) * H));
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, N * H, 1.0), uniform(r, P, 0.0, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec out = accumulate ? *out0 : Vec(size_t(T) * H, 7.0f);
    combine_rows(out.data(), in[0].data(), in[1].data(), l->row.data(), T, k, H, accumulate);
    return out;
  };
  op.reference = [=](const Tensors& in) {
    Vec out(size_t(T) * H);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        double s = accumulate ? (*out0)[size_t(t) * H + h] : 0.0;
        for (int j = 0; j < k; ++j) {
          const size_t p = size_t(t) * k + j;
          if (l->row[p] >= 0) s += double(in[1][p]) * in[0][size_t(l->row[p]) * H + h];
        }
        out[size_t(t) * H + h] = static_cast<float>(s);
      }
    return out;
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dout) {
    Vec dy(N * H, 0.0f), dw(P, 0.0f);  // the kernel overwrites
    combine_rows_backward(dy.data(), dw.data(), dout.data(), in[0].data(), in[1].data(),
                          l->row.data(), T, k, H);
    add_into(d[0], dy);
    add_into(d[1], dw);
  };
#ifdef MOETRAIN_OP_DEVICE
  op.device.push_back(
      {"combine_rows", 1e-10, [=](Checker& c) {
         Rng rng(92);
         Vec y = randn(rng, N * H), w = uniform(rng, P, 0.0, 1.0),
             out = randn(rng, size_t(T) * H);
         auto d_y = dev(y), d_w = dev(w), d_out = dev(out);
         auto d_row = dev(l->row);
         combine_rows(out.data(), y.data(), w.data(), l->row.data(), T, k, H, accumulate);
         cuda::combine_rows(d_out.data(), d_y.data(), d_w.data(), d_row.data(), T, k, H,
                            accumulate);
         c.close("out", host(d_out), out);
       }});
  if (!accumulate)
    for (int which : {0, 1, 2}) {  // both outputs, dy only, dweight only
      const char* name = which == 0   ? "combine_rows_backward"
                         : which == 1 ? "combine_rows_backward dweight=null"
                                      : "combine_rows_backward dy=null";
      op.device.push_back(
          {name, 1e-10, [=](Checker& c) {
             Rng rng(93);
             Vec y = randn(rng, N * H), w = uniform(rng, P, 0.0, 1.0),
                 dout = randn(rng, size_t(T) * H), dy = randn(rng, N * H), dw = randn(rng, P);
             auto d_y = dev(y), d_w = dev(w), d_dout = dev(dout), d_dy = dev(dy), d_dw = dev(dw);
             auto d_row = dev(l->row);
             const bool want_dy = which != 2, want_dw = which != 1;
             combine_rows_backward(want_dy ? dy.data() : nullptr, want_dw ? dw.data() : nullptr,
                                   dout.data(), y.data(), w.data(), l->row.data(), T, k, H);
             cuda::combine_rows_backward(want_dy ? d_dy.data() : nullptr,
                                         want_dw ? d_dw.data() : nullptr, d_dout.data(),
                                         d_y.data(), d_w.data(), d_row.data(), T, k, H);
             c.close("dy", host(d_dy), dy);
             c.close("dweight", host(d_dw), dw);
           }});
    }
#endif
  return op;
}

// ---------------------------------------------------------------------------------------------
// The expert-parallel regroup over row_of_i (n of n + 5 rows). scatter_rows and
// gather_rows_by_index are each other's adjoint: each entry's backward is the other kernel.

// dst [(n + 5), H]: dst[row_of_i[i]] = src[i]; the 5 rows no i names keep 0.
Op scatter_rows_op(int n, int H) {
  Op op;
  op.name = "scatter_rows";
  op.shape = str_cat("n=", n, " H=", H);
  auto r = regroup_rows(n);
  const size_t rows = size_t(n) + 5;
  op.fwd_bytes = 2.0 * n * H * sizeof(float);
  op.make_inputs = [=](Rng& g) { return Tensors{randn(g, size_t(n) * H, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec dst(rows * H, 0.0f);
    scatter_rows(dst.data(), in[0].data(), r->data(), n, H);
    return dst;
  };
  op.reference = [=](const Tensors& in) {
    Vec dst(rows * H, 0.0f);
    for (int i = 0; i < n; ++i)
      std::copy_n(in[0].begin() + size_t(i) * H, H, dst.begin() + size_t((*r)[i]) * H);
    return dst;
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& ddst) {
    Vec dsrc(size_t(n) * H);
    gather_rows_by_index(dsrc.data(), ddst.data(), r->data(), n, H);
    add_into(d[0], dsrc);
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"scatter_rows", 0.0, [=](Checker& c) {
                  Rng rng(95);
                  Vec src = randn(rng, size_t(n) * H), dst = randn(rng, rows * H);
                  auto d_src = dev(src), d_dst = dev(dst);
                  auto d_r = dev(*r);
                  scatter_rows(dst.data(), src.data(), r->data(), n, H);
                  cuda::scatter_rows(d_dst.data(), d_src.data(), d_r.data(), n, H);
                  c.close("scatter", host(d_dst), dst);
                }}};
#endif
  return op;
}

// dst [n, H]: dst[i] = src[row_of_i[i]] from src [(n + 5), H].
Op gather_rows_by_index_op(int n, int H) {
  Op op;
  op.name = "gather_rows_by_index";
  op.shape = str_cat("n=", n, " H=", H);
  auto r = regroup_rows(n);
  const size_t rows = size_t(n) + 5;
  op.fwd_bytes = 2.0 * n * H * sizeof(float);
  op.make_inputs = [=](Rng& g) { return Tensors{randn(g, rows * H, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec dst(size_t(n) * H, 7.0f);
    gather_rows_by_index(dst.data(), in[0].data(), r->data(), n, H);
    return dst;
  };
  op.reference = [=](const Tensors& in) {
    Vec dst(size_t(n) * H);
    for (int i = 0; i < n; ++i)
      std::copy_n(in[0].begin() + size_t((*r)[i]) * H, H, dst.begin() + size_t(i) * H);
    return dst;
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& ddst) {
    Vec dsrc(rows * H, 0.0f);
    scatter_rows(dsrc.data(), ddst.data(), r->data(), n, H);
    add_into(d[0], dsrc);
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"gather_rows_by_index", 0.0, [=](Checker& c) {
                  Rng rng(95);
                  Vec big = randn(rng, rows * H), back = randn(rng, size_t(n) * H);
                  auto d_big = dev(big), d_back = dev(back);
                  auto d_r = dev(*r);
                  gather_rows_by_index(back.data(), big.data(), r->data(), n, H);
                  cuda::gather_rows_by_index(d_back.data(), d_big.data(), d_r.data(), n, H);
                  c.close("gather", host(d_back), back);
                }}};
#endif
  return op;
}

// dst[i] = value[i]·src[row_of_i[i]]: n·H; backward dsrc = value·d and dvalue = src·d: 3·n·H.
Op gather_scaled_rows_op(int n, int H) {
  Op op;
  op.name = "gather_scaled_rows";
  op.shape = str_cat("n=", n, " H=", H);
  auto r = regroup_rows(n);
  const size_t rows = size_t(n) + 5;
  op.fwd_flops = double(n) * H;
  op.bwd_flops = 3.0 * n * H;
  op.make_inputs = [=](Rng& g) {
    return Tensors{randn(g, rows * H, 1.0), uniform(g, size_t(n), 0.0, 1.0)};
  };
  op.forward = [=](const Tensors& in) {
    Vec dst(size_t(n) * H, 7.0f);
    gather_scaled_rows(dst.data(), in[0].data(), r->data(), in[1].data(), n, H);
    return dst;
  };
  op.reference = [=](const Tensors& in) {
    Vec dst(size_t(n) * H);
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h)
        dst[size_t(i) * H + h] =
            static_cast<float>(double(in[1][i]) * in[0][size_t((*r)[i]) * H + h]);
    return dst;
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dd) {
    Vec dsrc(rows * H, 0.0f), dvalue(n, 0.0f);  // the kernel overwrites
    gather_scaled_rows_backward(dsrc.data(), dvalue.data(), dd.data(), in[0].data(), r->data(),
                                in[1].data(), n, H);
    add_into(d[0], dsrc);
    add_into(d[1], dvalue);
  };
  op.fwd_nmse = 1e-14;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"gather_scaled_rows + backward", 1e-10, [=](Checker& c) {
                  Rng rng(96);
                  Vec src = randn(rng, rows * H), val = uniform(rng, n, 0.0, 1.0),
                      dst = randn(rng, size_t(n) * H), d = randn(rng, size_t(n) * H),
                      dsrc = randn(rng, rows * H), dval = randn(rng, n);
                  auto d_src = dev(src), d_val = dev(val), d_dst = dev(dst), d_d = dev(d),
                       d_dsrc = dev(dsrc), d_dval = dev(dval);
                  auto d_r = dev(*r);
                  gather_scaled_rows(dst.data(), src.data(), r->data(), val.data(), n, H);
                  gather_scaled_rows_backward(dsrc.data(), dval.data(), d.data(), src.data(),
                                              r->data(), val.data(), n, H);
                  cuda::gather_scaled_rows(d_dst.data(), d_src.data(), d_r.data(), d_val.data(),
                                           n, H);
                  cuda::gather_scaled_rows_backward(d_dsrc.data(), d_dval.data(), d_d.data(),
                                                    d_src.data(), d_r.data(), d_val.data(), n, H);
                  c.close("dst", host(d_dst), dst);
                  c.close("dsrc", host(d_dsrc), dsrc);
                  c.close("dvalue", host(d_dval), dval);
                }}};
#endif
  return op;
}

}  // namespace moe::ops
