// The op table's dense leaf kernels (op_table.h): GEMM (transposes, row strides, K = 0, grouped,
// bf16 on the device), add_inplace, copy and fill_zero, copy_cols, MLA's head assembly, AdamW and
// the gradient norm's sum of squares. Each factory: inputs, the kernel, a naive reference in
// double, the backward where the kernel has one, and the CUDA twin's device checks.
#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "kernels/adamw.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/rope.h"
#include "ops/op_table.h"
#ifdef MOETRAIN_OP_DEVICE
#include "ops/op_device.h"
#endif

namespace moe::ops {

using namespace moe::kernels;
using test_util::uniform;

namespace {

// C = alpha·op(A)·op(B) + beta·C0 over explicit row strides (the padding of C kept).
Vec ref_gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
             const float* B, int ldb, float beta, const float* C0, int ldc, size_t c_n) {
  Vec C(C0, C0 + c_n);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int k = 0; k < K; ++k)
        s += static_cast<double>(ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
             (tb ? B[size_t(j) * ldb + k] : B[size_t(k) * ldb + j]);
      C[size_t(i) * ldc + j] = static_cast<float>(alpha * s + double(beta) * C0[size_t(i) * ldc + j]);
    }
  return C;
}

Vec concat(std::initializer_list<const Vec*> parts) {
  Vec out;
  for (const Vec* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GEMM. 2·M·N·K; no backward kernel (linear's is in the table as linear).
Op gemm_op(bool ta, bool tb, int M, int N, int K, float alpha, float beta, int pad, bool bf16) {
  Op op;
  op.name = "gemm";
  op.shape = str_cat(ta ? "T" : "N", tb ? "T" : "N", pad ? " strided" : "", " M=", M, " N=", N,
                     " K=", K, " a=", alpha, " b=", beta);
  op.fwd_flops = 2.0 * M * N * K;
  // Row strides past the dense ones (A by pad, B by pad + 1, C by pad + 2); 0 passes dense.
  const int lda = pad ? (ta ? M : K) + pad : 0, ldb = pad ? (tb ? K : N) + pad + 1 : 0,
            ldc = pad ? N + pad + 2 : 0;
  const int la = lda ? lda : (ta ? M : K), lb = ldb ? ldb : (tb ? K : N), lc = ldc ? ldc : N;
  const size_t a_n = size_t(ta ? K : M) * la, b_n = size_t(tb ? N : K) * lb, c_n = size_t(M) * lc;
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, a_n, 1.0), randn(r, b_n, 1.0), randn(r, c_n, 1.0)};
  };
  op.forward = [=](const Tensors& in) {
    Vec C = in[2];
    gemm(ta, tb, M, N, K, alpha, in[0].data(), lda, in[1].data(), ldb, beta, C.data(), ldc);
    return C;
  };
  op.reference = [=](const Tensors& in) {
    return ref_gemm(ta, tb, M, N, K, alpha, in[0].data(), la, in[1].data(), lb, beta,
                    in[2].data(), lc, c_n);
  };
#ifdef MOETRAIN_OP_DEVICE
  // fp32: cuBLAS vs OpenBLAS round-off (~1e-13 expected); bf16: input rounding 2^-9 (~3e-6).
  op.device = {{bf16 ? "gemm_bf16" : "gemm", bf16 ? 1e-4 : 1e-7, [=](Checker& c) {
                  Rng rng(1000 + M * 7 + N * 3 + K);
                  Vec A = randn(rng, a_n), B = randn(rng, b_n), C = randn(rng, c_n);
                  auto dA = dev(A), dB = dev(B), dC = dev(C);
                  gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
                  {
                    const DeviceScope bf16_gemm(Device::kCuda, bf16);  // cuBLAS with bf16 inputs or not
                    cuda::gemm(ta, tb, M, N, K, alpha, dA.data(), lda, dB.data(), ldb, beta,
                               dC.data(), ldc);
                  }
                  c.close("C", host(dC), C);
                }}};
#endif
  return op;
}

// Problem p: C_p = op(A_p)·op(B_p) + beta_p·C0_p, beta alternating 0 and 1; dense strides.
Op gemm_grouped_op(bool ta, bool tb, std::vector<int> M_P, int N, int K) {
  Op op;
  op.name = "gemm_grouped";
  const int P = static_cast<int>(M_P.size());
  long rows = 0, empty = 0;
  for (int m : M_P) rows += m, empty += m == 0;
  op.shape = str_cat(ta ? "T" : "N", tb ? "T" : "N", " P=", P, " sum_M=", rows, " N=", N, " K=", K,
                     " empty=", empty);
  op.fwd_flops = 2.0 * rows * N * K;
  auto ms = std::make_shared<const std::vector<int>>(std::move(M_P));
  const size_t a_n = size_t(rows) * K, b_n = size_t(P) * K * N, c_n = size_t(rows) * N;
  // The problems over the three packed tensors (A_p and C_p stacked by rows, B_p by problem).
  auto problems = [=](const float* A, const float* B, float* C) {
    std::vector<GemmProblem> ps;
    size_t r0 = 0;
    for (int p = 0; p < P; ++p) {
      const int M = (*ms)[p];
      GemmProblem g;
      g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = N, g.K = K, g.beta = p % 2 ? 1.0f : 0.0f;
      g.A = A + r0 * K, g.B = B + size_t(p) * K * N, g.C = C + r0 * N;
      ps.push_back(g);
      r0 += M;
    }
    return ps;
  };
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, a_n, 1.0), randn(r, b_n, 1.0), randn(r, c_n, 1.0)};
  };
  op.forward = [=](const Tensors& in) {
    Vec C = in[2];
    const auto ps = problems(in[0].data(), in[1].data(), C.data());
    gemm_grouped(ps.data(), P);
    return C;
  };
  op.reference = [=](const Tensors& in) {
    Vec C;
    size_t r0 = 0;
    for (int p = 0; p < P; ++p) {
      const int M = (*ms)[p];
      const Vec Cp = ref_gemm(ta, tb, M, N, K, 1.0f, in[0].data() + r0 * K, ta ? M : K,
                              in[1].data() + size_t(p) * K * N, tb ? K : N, p % 2 ? 1.0f : 0.0f,
                              in[2].data() + r0 * N, N, size_t(M) * N);
      C.insert(C.end(), Cp.begin(), Cp.end());
      r0 += M;
    }
    return C;
  };
#ifdef MOETRAIN_OP_DEVICE
  // fp32: one cublasGemmGroupedBatchedEx; bf16: per-problem calls (gemm.h).
  for (bool bf16 : {false, true})
    op.device.push_back({bf16 ? "gemm_grouped bf16" : "gemm_grouped", bf16 ? 1e-4 : 1e-7,
                         [=](Checker& c) {
                           Rng rng(1100 + N + K);
                           Vec A = randn(rng, a_n), B = randn(rng, b_n), C = randn(rng, c_n);
                           auto dA = dev(A), dB = dev(B), dC = dev(C);
                           const auto hp = problems(A.data(), B.data(), C.data());
                           const auto dp = problems(dA.data(), dB.data(), dC.data());
                           gemm_grouped(hp.data(), P);
                           {
                             const DeviceScope bf16_gemm(Device::kCuda, bf16);
                             cuda::gemm_grouped(dp.data(), P);
                           }
                           c.close("C", host(dC), C);
                         }});
#endif
  return op;
}

// ---------------------------------------------------------------------------------------------
// Copies. Memory-bound: bytes, no FLOPs counted (add_inplace's n adds aside).

Op add_inplace_op(size_t n) {
  Op op;
  op.name = "add_inplace";
  op.shape = str_cat("n=", n);
  op.fwd_flops = double(n);
  op.fwd_bytes = 3.0 * n * sizeof(float);
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, n, 1.0), randn(r, n, 1.0)}; };
  op.forward = [](const Tensors& in) {
    Vec y = in[0];
    add_inplace(y.data(), in[1].data(), y.size());
    return y;
  };
  op.reference = [](const Tensors& in) {
    Vec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] + in[1][i];  // one float add: exact
    return y;
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"add_inplace", 0.0, [=](Checker& c) {
                  Rng rng(6);
                  Vec y = randn(rng, n), x = randn(rng, n);
                  auto dy = dev(y), dx = dev(x);
                  add_inplace(y.data(), x.data(), n);
                  cuda::add_inplace(dy.data(), dx.data(), n);
                  c.close("y", host(dy), y);
                }}};
#endif
  return op;
}

// Output [copy of x (n) | z after fill_zero of its first n - 1 (n)].
Op copy_fill_op(size_t n) {
  Op op;
  op.name = "copy_fill";
  op.shape = str_cat("n=", n);
  op.fwd_bytes = 3.0 * n * sizeof(float);
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, n, 1.0), randn(r, n, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec y(n, 7.0f), z = in[1];
    copy(y.data(), in[0].data(), n);
    fill_zero(z.data(), n - 1);  // the last element stays
    return concat({&y, &z});
  };
  op.reference = [=](const Tensors& in) {
    Vec z(n, 0.0f);
    z[n - 1] = in[1][n - 1];
    return concat({&in[0], &z});
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"copy + fill_zero", 0.0, [=](Checker& c) {
                  Rng rng(7);
                  Vec x = randn(rng, n), y = randn(rng, n), z = randn(rng, n);
                  auto dx = dev(x), dy = dev(y), dz = dev(z);
                  copy(y.data(), x.data(), n);
                  fill_zero(z.data(), n - 1);
                  cuda::copy(dy.data(), dx.data(), n);
                  cuda::fill_zero(dz.data(), n - 1);
                  c.close("copy", host(dy), y);
                  c.close("fill_zero", host(dz), z);
                }}};
#endif
  return op;
}

// dst [rows, to] = src [rows, from] cut or zero-padded. Its adjoint is the copy back (to -> from),
// which is what the model calls for the backward.
Op copy_cols_op(size_t rows, int from, int to) {
  Op op;
  op.name = "copy_cols";
  op.shape = str_cat("rows=", rows, " from=", from, " to=", to);
  op.fwd_bytes = double(rows) * (std::min(from, to) + to) * sizeof(float);
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, rows * from, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec dst(rows * to, 7.0f);  // every element written
    copy_cols(dst.data(), to, in[0].data(), from, rows);
    return dst;
  };
  op.reference = [=](const Tensors& in) {
    Vec dst(rows * to, 0.0f);
    for (size_t r = 0; r < rows; ++r)
      for (int j = 0; j < std::min(from, to); ++j) dst[r * to + j] = in[0][r * from + j];
    return dst;
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& dout) {
    Vec back(rows * from);
    copy_cols(back.data(), from, dout.data(), to, rows);
    add_into(d[0], back);
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"copy_cols", 0.0, [=](Checker& c) {
                  Rng rng(50 + to);
                  Vec src = randn(rng, rows * from), dst(rows * to);
                  auto d_src = dev(src), d_dst = dev(randn(rng, dst.size()));
                  copy_cols(dst.data(), to, src.data(), from, rows);
                  cuda::copy_cols(d_dst.data(), to, d_src.data(), from, rows);
                  c.close("dst", host(d_dst), dst);
                }}};
#endif
  return op;
}

// ---------------------------------------------------------------------------------------------
// MLA's head assembly (kernels/mla.h). Output [Q | K | V], each [N, nh, D]. Forward per head:
// the scale of q's dn + dr columns and a 3-FLOP rotation per rotary column of q and of the key:
// N·nh·(dn + 7·dr); the backward (the adjoint) the same.
Op mla_heads_op(int B, int T, int nh, int dn, int dr, int dv, bool yarn) {
  Op op;
  op.name = "mla_heads";
  op.shape = str_cat("B=", B, " T=", T, " nh=", nh, " dn=", dn, " dr=", dr, " dv=", dv,
                     yarn ? " yarn" : "");
  MlaShape m;
  m.B = B, m.T = T, m.nh = nh, m.dn = dn, m.dr = dr, m.dv = dv, m.D = std::max(dn + dr, dv);
  const size_t N = size_t(B) * T, heads = N * nh * m.D;
  const size_t q_n = N * nh * (dn + dr), kv_n = N * nh * (dn + dv), kpe_n = N * dr;
  op.fwd_flops = op.bwd_flops = double(N) * nh * (dn + 7.0 * dr);
  const float q_scale = 0.6f;
  YarnParams y;
  y.factor = 4.0, y.mscale = 0.7, y.mscale_all_dim = 1.0, y.original_max_pos = 8;
  // Longer than T on purpose; a YaRN table carries its cos/sin scaling.
  auto table = std::make_shared<const RopeTable>(
      yarn ? make_yarn_rope_table(T + 7, dr, 10000.0, y) : make_rope_table(T + 7, dr, 10000.0));
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, q_n, 1.0), randn(r, kv_n, 1.0), randn(r, kpe_n, 1.0)};
  };
  op.forward = [=](const Tensors& in) {
    Vec Q(heads), K(heads), V(heads);
    mla_heads_forward(Q.data(), K.data(), V.data(), in[0].data(), in[1].data(), in[2].data(),
                      *table, m, q_scale);
    return concat({&Q, &K, &V});
  };
  // HF's DeepSeek-V2 layout: the rotary pair i is (x[2i], x[2i+1]), rotated by angle i of the
  // table into columns i and i + dr/2; zeros past the used columns.
  op.reference = [=](const Tensors& in) {
    Vec Q(heads, 0.0f), K(heads, 0.0f), V(heads, 0.0f);
    const int half = dr / 2;
    auto rotate = [&](float* out, const float* x, int t, double scale) {
      for (int i = 0; i < half; ++i) {
        const double c = table->cos[size_t(t) * half + i], s = table->sin[size_t(t) * half + i];
        const double a = x[2 * i], b = x[2 * i + 1];
        out[i] = static_cast<float>(scale * (a * c - b * s));
        out[half + i] = static_cast<float>(scale * (b * c + a * s));
      }
    };
    for (size_t n = 0; n < N; ++n)
      for (int h = 0; h < nh; ++h) {
        const size_t o = (n * nh + h) * m.D;
        const float* qh = in[0].data() + (n * nh + h) * (dn + dr);
        const float* kvh = in[1].data() + (n * nh + h) * (dn + dv);
        const int t = static_cast<int>(n % T);
        for (int j = 0; j < dn; ++j) Q[o + j] = static_cast<float>(double(qh[j]) * q_scale);
        rotate(Q.data() + o + dn, qh + dn, t, q_scale);
        for (int j = 0; j < dn; ++j) K[o + j] = kvh[j];
        rotate(K.data() + o + dn, in[2].data() + n * dr, t, 1.0);
        for (int j = 0; j < dv; ++j) V[o + j] = kvh[dn + j];
      }
    return concat({&Q, &K, &V});
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& dout) {
    Vec dq(q_n), dkv(kv_n), dkpe(kpe_n);  // the kernel overwrites
    mla_heads_backward(dq.data(), dkv.data(), dkpe.data(), dout.data(), dout.data() + heads,
                       dout.data() + 2 * heads, *table, m, q_scale);
    add_into(d[0], dq);
    add_into(d[1], dkv);
    add_into(d[2], dkpe);
  };
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"mla_heads_forward + backward", 1e-12, [=](Checker& c) {
                  Rng rng(40 + dv);
                  Vec q = randn(rng, q_n), kv = randn(rng, kv_n), kpe = randn(rng, kpe_n),
                      Q(heads), K(heads), V(heads);
                  Vec dQ = randn(rng, heads), dK = randn(rng, heads), dV = randn(rng, heads);
                  Vec dq(q_n), dkv(kv_n), dkpe(kpe_n);
                  auto d_q = dev(q), d_kv = dev(kv), d_kpe = dev(kpe), d_Q = dev(randn(rng, heads)),
                       d_K = dev(randn(rng, heads)), d_V = dev(randn(rng, heads));
                  auto d_dQ = dev(dQ), d_dK = dev(dK), d_dV = dev(dV),
                       d_dq = dev(randn(rng, q_n)), d_dkv = dev(randn(rng, kv_n)),
                       d_dkpe = dev(randn(rng, kpe_n));
                  mla_heads_forward(Q.data(), K.data(), V.data(), q.data(), kv.data(), kpe.data(),
                                    *table, m, q_scale);
                  mla_heads_backward(dq.data(), dkv.data(), dkpe.data(), dQ.data(), dK.data(),
                                     dV.data(), *table, m, q_scale);
                  cuda::mla_heads_forward(d_Q.data(), d_K.data(), d_V.data(), d_q.data(),
                                          d_kv.data(), d_kpe.data(), *table, m, q_scale);
                  cuda::mla_heads_backward(d_dq.data(), d_dkv.data(), d_dkpe.data(), d_dQ.data(),
                                           d_dK.data(), d_dV.data(), *table, m, q_scale);
                  c.close("Q", host(d_Q), Q);
                  c.close("K", host(d_K), K);
                  c.close("V", host(d_V), V);
                  c.close("dq", host(d_dq), dq);
                  c.close("dkv", host(d_dkv), dkv);
                  c.close("dkpe", host(d_dkpe), dkpe);
                }}};
#endif
  return op;
}

// ---------------------------------------------------------------------------------------------
// The optimizer. AdamW at step `step`, grad_scale 0.8, lr 3e-3, weight decay 0.1; output
// [p | m | v]. About 12 FLOPs per parameter (the sqrt and the division one each).
Op adamw_op(size_t n, int step) {
  Op op;
  op.name = "adamw";
  op.shape = str_cat("n=", n, " step=", step);
  op.fwd_flops = 12.0 * n;
  op.fwd_bytes = 7.0 * n * sizeof(float);
  AdamWParams hp;
  hp.lr = 3e-3f;
  hp.weight_decay = 0.1f;
  const float grad_scale = 0.8f;
  op.make_inputs = [=](Rng& r) {  // p, g, m, v (v >= 0)
    return Tensors{randn(r, n, 1.0), randn(r, n, 1.0), randn(r, n, 0.1), uniform(r, n, 0.0, 0.2)};
  };
  op.forward = [=](const Tensors& in) {
    Vec p = in[0], m = in[2], v = in[3];
    adamw_update(p.data(), in[1].data(), m.data(), v.data(), n, hp, step, grad_scale);
    return concat({&p, &m, &v});
  };
  // torch.optim.AdamW in double: decay, then the bias-corrected step.
  op.reference = [=](const Tensors& in) {
    const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, eps = hp.eps, wd = hp.weight_decay;
    const double bc1 = 1.0 - std::pow(b1, step), bc2 = 1.0 - std::pow(b2, step);
    Vec p(n), m(n), v(n);
    for (size_t i = 0; i < n; ++i) {
      const double g = double(in[1][i]) * grad_scale;
      const double mi = b1 * in[2][i] + (1.0 - b1) * g, vi = b2 * in[3][i] + (1.0 - b2) * g * g;
      const double pi = in[0][i] * (1.0 - lr * wd) - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
      p[i] = static_cast<float>(pi), m[i] = static_cast<float>(mi), v[i] = static_cast<float>(vi);
    }
    return concat({&p, &m, &v});
  };
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"adamw_update", 1e-10, [=](Checker& c) {
                  Rng rng(70);
                  Vec p = randn(rng, n), g = randn(rng, n), m = randn(rng, n, 0.1),
                      v = uniform(rng, n, 0.0, 0.2);
                  auto d_p = dev(p), d_g = dev(g), d_m = dev(m), d_v = dev(v);
                  adamw_update(p.data(), g.data(), m.data(), v.data(), n, hp, step, grad_scale);
                  cuda::adamw_update(d_p.data(), d_g.data(), d_m.data(), d_v.data(), n, hp, step,
                                     grad_scale);
                  c.close("p", host(d_p), p);
                  c.close("m", host(d_m), m);
                  c.close("v", host(d_v), v);
                }}};
#endif
  return op;
}

// The sum in double, as two floats [hi | lo] (hi = float(sum), lo = float(sum - hi)): the bound
// 1e-24 needs a double accumulation (a float one is off by ~1e-7 of the sum, nmse ~1e-14).
Op sum_squares_op(size_t n) {
  Op op;
  op.name = "sum_squares";
  op.shape = str_cat("n=", n);
  op.fwd_flops = 2.0 * n;
  op.fwd_bytes = double(n) * sizeof(float);
  auto split = [](double s) {
    const float hi = static_cast<float>(s);
    return Vec{hi, static_cast<float>(s - hi)};
  };
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, n, 1.0)}; };
  op.forward = [=](const Tensors& in) { return split(sum_squares(in[0].data(), n)); };
  op.reference = [=](const Tensors& in) {
    double s = 0.0;
    for (float x : in[0]) s += double(x) * x;
    return split(s);
  };
  op.fwd_nmse = 1e-24;
#ifdef MOETRAIN_OP_DEVICE
  // Double sums in a different order: ~1e-30 expected.
  op.device = {{"sum_squares", 1e-20, [=](Checker& c) {
                  Rng rng(71);
                  Vec x = randn(rng, n);
                  auto d_x = dev(x);
                  c.scalar("sum", cuda::sum_squares(d_x.data(), n), sum_squares(x.data(), n));
                }}};
#endif
  return op;
}

}  // namespace moe::ops
