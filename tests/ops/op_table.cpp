// The op table (op_table.h): one factory per model-layer kernel op (linear through
// grouped_swiglu); the other leaf kernels' factories are in op_table_dense.cpp, op_table_moe.cpp
// and op_table_router.cpp, the table's lists at its three sets of shapes in op_table_shapes.cpp.
#include "ops/op_table.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <utility>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu_mlp.h"
#ifdef MOETRAIN_OP_DEVICE
#include "kernels/device_select.h"
#include "ops/op_device.h"
#endif

namespace moe::ops {

using namespace moe::kernels;

double nmse(const Vec& a, const Vec& ref) {
  MOE_CHECK(a.size() == ref.size(), "nmse: sizes differ (", a.size(), " vs ", ref.size(), ")");
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? num / den : num;
}

namespace {

std::string dims(const char* a, long x, const char* b, long y) {
  return std::string(a) + "=" + std::to_string(x) + " " + b + "=" + std::to_string(y);
}

double silu(double z) { return z / (1.0 + std::exp(-z)); }

Vec ref_swiglu(const Vec& g, const Vec& u) {
  Vec h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = static_cast<float>(silu(g[i]) * u[i]);
  return h;
}

// HF rotate_half with the angle computed directly: p · theta^(-2i/d)
Vec ref_rope(const Vec& x, int B, int T, int nh, int hd, double theta) {
  Vec out(x.size());
  int half = hd / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < nh; ++h) {
        size_t base = ((static_cast<size_t>(b) * T + t) * nh + h) * hd;
        for (int i = 0; i < half; ++i) {
          double a = t * std::pow(theta, -2.0 * i / hd);
          double x1 = x[base + i], x2 = x[base + i + half];
          out[base + i] = static_cast<float>(x1 * std::cos(a) - x2 * std::sin(a));
          out[base + i + half] = static_cast<float>(x2 * std::cos(a) + x1 * std::sin(a));
        }
      }
  return out;
}

Vec ref_attention(const Vec& q, const Vec& k, const Vec& v, int B, int T, int nh, int hd) {
  int C = nh * hd;
  Vec out(q.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < nh; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0.0;
        for (int s = 0; s <= t; ++s) {
          double d = 0.0;
          for (int j = 0; j < hd; ++j)
            d += static_cast<double>(q[(b * T + t) * C + h * hd + j]) *
                 k[(b * T + s) * C + h * hd + j];
          p[s] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, p[s]);
        }
        for (int s = 0; s <= t; ++s) sum += p[s] = std::exp(p[s] - mx);
        for (int j = 0; j < hd; ++j) {
          double o = 0.0;
          for (int s = 0; s <= t; ++s) o += p[s] / sum * v[(b * T + s) * C + h * hd + j];
          out[(b * T + t) * C + h * hd + j] = static_cast<float>(o);
        }
      }
  return out;
}

Vec ref_mlp(const Vec& x, const float* gate, const float* up, const float* down, int N, int H,
            int F) {
  Vec gw(gate, gate + F * H), uw(up, up + F * H), dw(down, down + H * F);
  Vec g = ref::linear(x, gw, N, H, F), u = ref::linear(x, uw, N, H, F);
  return ref::linear(ref_swiglu(g, u), dw, N, F, H);
}

constexpr double kTheta = 10000.0;

}  // namespace

namespace ref {

Vec linear(const Vec& x, const Vec& w, int T, int in, int out) {
  Vec y(static_cast<size_t>(T) * out);
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < out; ++o) {
      double s = 0.0;
      for (int i = 0; i < in; ++i) s += static_cast<double>(x[t * in + i]) * w[o * in + i];
      y[t * out + o] = static_cast<float>(s);
    }
  return y;
}

Vec rmsnorm(const Vec& x, const Vec& w, int rows, int dim, double eps) {
  Vec out(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int j = 0; j < dim; ++j) ss += static_cast<double>(x[r * dim + j]) * x[r * dim + j];
    double rs = 1.0 / std::sqrt(ss / dim + eps);
    for (int j = 0; j < dim; ++j) out[r * dim + j] = static_cast<float>(x[r * dim + j] * rs * w[j]);
  }
  return out;
}

}  // namespace ref

// ---------------------------------------------------------------------------------------------
// The ops.

// 2·T·in·out forward (one GEMM), twice that backward (dx and dw).
Op linear_op(int T, int in, int out) {
  Op op;
  op.name = "linear";
  op.shape = "T=" + std::to_string(T) + " " + dims("in", in, "out", out);
  op.fwd_flops = 2.0 * T * in * out;
  op.bwd_flops = 2.0 * op.fwd_flops;
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, size_t(T) * in, 1.0), randn(r, size_t(out) * in, 0.4)};
  };
  op.forward = [=](const Tensors& in_) {
    Vec y(size_t(T) * out);
    linear_forward(y.data(), in_[0].data(), in_[1].data(), T, in, out);
    return y;
  };
  op.reference = [=](const Tensors& in_) { return ref::linear(in_[0], in_[1], T, in, out); };
  op.backward = [=](Tensors& d, const Tensors& in_, const Vec& dy) {
    linear_backward(d[0].data(), d[1].data(), dy.data(), in_[0].data(), in_[1].data(), T, in, out);
  };
#ifdef MOETRAIN_OP_DEVICE
  // Through the seam itself: the leaf kernels forward to CUDA when the active device is CUDA.
  op.device = {{"dispatch linear_forward/backward", 1e-7, [=](Checker& c) {
                  Rng rng(130);
                  Vec x = randn(rng, size_t(T) * in), w = randn(rng, size_t(out) * in),
                      y(size_t(T) * out), dy = randn(rng, y.size()), dx = randn(rng, x.size()),
                      dw = randn(rng, w.size());
                  auto d_x = dev(x), d_w = dev(w), d_y = dev(y), d_dy = dev(dy), d_dx = dev(dx),
                       d_dw = dev(dw);
                  linear_forward(y.data(), x.data(), w.data(), T, in, out);
                  linear_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), T, in, out);
                  {
                    const DeviceScope on_device(Device::kCuda, false);
                    linear_forward(d_y.data(), d_x.data(), d_w.data(), T, in, out);
                    linear_backward(d_dx.data(), d_dw.data(), d_dy.data(), d_x.data(), d_w.data(),
                                    T, in, out);
                  }
                  c.close("y", host(d_y), y);
                  c.close("dx", host(d_dx), dx);
                  c.close("dw", host(d_dw), dw);
                }}};
#endif
  return op;
}

// Forward 4 per element (square, sum, two products); backward 10 per element on top of the
// forward it reruns for rstd.
Op rmsnorm_op(int rows, int dim) {
  Op op;
  op.name = "rmsnorm";
  op.shape = dims("rows", rows, "dim", dim);
  op.fwd_flops = 4.0 * rows * dim;
  op.bwd_flops = op.fwd_flops + 10.0 * rows * dim;
  op.make_inputs = [=](Rng& r) {
    Vec w = randn(r, dim, 0.3);
    for (auto& x : w) x += 1.0f;
    return Tensors{randn(r, size_t(rows) * dim, 1.0), w};
  };
  op.forward = [=](const Tensors& in) {
    Vec out(in[0].size()), rstd(rows);
    rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), rows, dim, 1e-5f);
    return out;
  };
  op.reference = [=](const Tensors& in) { return ref::rmsnorm(in[0], in[1], rows, dim, 1e-5); };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dout) {
    Vec out(in[0].size()), rstd(rows);
    rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), rows, dim, 1e-5f);
    rmsnorm_backward(d[0].data(), d[1].data(), dout.data(), in[0].data(), in[1].data(),
                     rstd.data(), rows, dim);
  };
#ifdef MOETRAIN_OP_DEVICE
  // Forward: row sums in double on both sides (only the summation tree differs). Backward's dw:
  // chunked partial sums (GPU) vs one running sum (CPU), fp32 round-off.
  op.device.push_back({"rmsnorm_forward", 1e-10, [=](Checker& c) {
                         Rng rng(10 + rows);
                         const size_t n = size_t(rows) * dim;
                         Vec x = randn(rng, n, 3.0), w = uniform(rng, dim, 0.5, 1.5), out(n),
                             rstd(rows);
                         auto dx = dev(x), dw = dev(w), dout = dev(out), drstd = dev(rstd);
                         rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim,
                                         1e-6f);
                         cuda::rmsnorm_forward(dout.data(), drstd.data(), dx.data(), dw.data(),
                                               rows, dim, 1e-6f);
                         c.close("out", host(dout), out);
                         c.close("rstd", host(drstd), rstd);
                       }});
  for (bool with_dw : {true, false})
    op.device.push_back(
        {with_dw ? "rmsnorm_backward" : "rmsnorm_backward dw=null", 1e-8, [=](Checker& c) {
           Rng rng(20 + rows);
           const size_t n = size_t(rows) * dim;
           Vec x = randn(rng, n, 3.0), w = uniform(rng, dim, 0.5, 1.5), dout = randn(rng, n),
               rstd(rows), out(n);
           rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-6f);
           Vec dx = randn(rng, n), dw = randn(rng, dim);
           auto d_x = dev(x), d_w = dev(w), d_dout = dev(dout), d_rstd = dev(rstd), d_dx = dev(dx),
                d_dw = dev(dw);
           rmsnorm_backward(dx.data(), with_dw ? dw.data() : nullptr, dout.data(), x.data(),
                            w.data(), rstd.data(), rows, dim);
           cuda::rmsnorm_backward(d_dx.data(), with_dw ? d_dw.data() : nullptr, d_dout.data(),
                                  d_x.data(), d_w.data(), d_rstd.data(), rows, dim);
           c.close("dx", host(d_dx), dx);
           c.close("dw", host(d_dw), dw);
         }});
#endif
  return op;
}

// A rotation: 6 FLOPs per pair of elements, forward and backward.
Op rope_op(int B, int T, int nh, int hd) {
  Op op;
  op.name = "rope";
  op.shape = dims("B", B, "T", T) + " " + dims("nh", nh, "hd", hd);
  const size_t n = size_t(B) * T * nh * hd;
  op.fwd_flops = op.bwd_flops = 3.0 * n;
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, n, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    RopeTable table = make_rope_table(T + 3, hd, kTheta);  // longer than T on purpose
    Vec x = in[0];
    rope_forward(x.data(), table, B, T, nh, hd);
    return x;
  };
  op.reference = [=](const Tensors& in) { return ref_rope(in[0], B, T, nh, hd, kTheta); };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& dout) {
    RopeTable table = make_rope_table(T, hd, kTheta);
    Vec dx = dout;  // rope_backward rotates in place; the += is ours
    rope_backward(dx.data(), table, B, T, nh, hd);
    add_inplace(d[0].data(), dx.data(), dx.size());
  };
  op.fwd_nmse = 4e-12;
#ifdef MOETRAIN_OP_DEVICE
  op.device = {{"rope_forward + backward", 1e-10, [=](Checker& c) {
                  Rng rng(30);
                  RopeTable table = make_rope_table(T + 7, hd, kTheta);  // longer than T
                  Vec x = randn(rng, n), dx = randn(rng, n);
                  auto d_x = dev(x), d_dx = dev(dx);
                  rope_forward(x.data(), table, B, T, nh, hd);
                  rope_backward(dx.data(), table, B, T, nh, hd);
                  cuda::rope_forward(d_x.data(), table, B, T, nh, hd);    // uploads the table
                  cuda::rope_backward(d_dx.data(), table, B, T, nh, hd);  // reuses it
                  c.close("x", host(d_x), x);
                  c.close("dx", host(d_dx), dx);
                }}};
#endif
  return op;
}

// Causal: P = B·nh·T(T+1)/2 (query, key) pairs. Forward 2·hd per pair for q·k and for p·v, 3 for
// the softmax; backward (dv, dp, dq, dk) 8·hd + 3 per pair on top of the forward it reruns.
Op attention_op(int B, int T, int nh, int hd) {
  Op op;
  op.name = "attention";
  op.shape = dims("B", B, "T", T) + " " + dims("nh", nh, "hd", hd);
  const double pairs = double(B) * nh * T * (T + 1) / 2.0;
  op.fwd_flops = (4.0 * hd + 3.0) * pairs;
  op.bwd_flops = op.fwd_flops + (8.0 * hd + 3.0) * pairs;
  const size_t n = size_t(B) * T * nh * hd;
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, n, 1.0), randn(r, n, 1.0), randn(r, n, 1.0)};
  };
  op.forward = [=](const Tensors& in) {
    Vec out(in[0].size()), att(attention_saved_floats(B, T, nh, hd));
    attention_forward(out.data(), att.data(), in[0].data(), in[1].data(), in[2].data(), B, T, nh,
                      hd);
    return out;
  };
  op.reference = [=](const Tensors& in) {
    return ref_attention(in[0], in[1], in[2], B, T, nh, hd);
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dout) {
    Vec out(in[0].size()), att(attention_saved_floats(B, T, nh, hd)),
        scratch(attention_scratch_floats(T));
    attention_forward(out.data(), att.data(), in[0].data(), in[1].data(), in[2].data(), B, T, nh,
                      hd);
    attention_backward(d[0].data(), d[1].data(), d[2].data(), dout.data(), in[0].data(),
                       in[1].data(), in[2].data(), att.data(), B, T, nh, hd, scratch.data());
  };
  op.fd_h = 1e-3;
#ifdef MOETRAIN_OP_DEVICE
  // Both devices run flash attention with element_math.h's softmax pieces, over different key
  // blocks (CPU 64 rows, CUDA 32): fp32 round-off. The saved state [lse | out] has one layout.
  // Past the CUDA kernel's head_dim (32 lanes × 4 columns = 128) the check is the refusal.
  if (hd > 128) {
    op.device = {{"attention head_dim " + std::to_string(hd) + " refused", 0.0, [=](Checker& c) {
                    try {
                      cuda::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, B, T,
                                              nh, hd);
                      c.mismatch("throw", str_cat("no moe::Error for head_dim ", hd));
                    } catch (const Error&) {
                    }
                  }}};
    return op;
  }
  op.device = {{"attention_forward + backward", 1e-6, [=](Checker& c) {
                  Rng rng(40 + T + hd);
                  Vec q = randn(rng, n, 1.5), k = randn(rng, n, 1.5), v = randn(rng, n),
                      dout = randn(rng, n);
                  Vec dq = randn(rng, n), dk = randn(rng, n), dv = randn(rng, n), out(n);
                  Vec att(attention_saved_floats(B, T, nh, hd));
                  Vec scratch(attention_scratch_floats(T));
                  auto d_q = dev(q), d_k = dev(k), d_v = dev(v), d_dout = dev(dout),
                       d_dq = dev(dq), d_dk = dev(dk), d_dv = dev(dv), d_out = dev(out);
                  Buffer<float> d_att(cuda_saved_floats(B, T, nh, hd), nullptr, Device::kCuda);
                  attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), B, T,
                                    nh, hd);
                  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), att.data(), B, T, nh, hd,
                                     scratch.data());
                  cuda::attention_forward(d_out.data(), d_att.data(), d_q.data(), d_k.data(),
                                          d_v.data(), B, T, nh, hd);
                  cuda::attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), d_dout.data(),
                                           d_q.data(), d_k.data(), d_v.data(), d_att.data(), B,
                                           T, nh, hd, nullptr);
                  c.close("out", host(d_out), out);
                  c.close("lse + out copy", host(d_att), att);
                  c.close("dq", host(d_dq), dq);
                  c.close("dk", host(d_dk), dk);
                  c.close("dv", host(d_dv), dv);
                }}};
#endif
  return op;
}

// silu(g)·u: 5 per element forward, 10 backward.
Op swiglu_op(size_t n) {
  Op op;
  op.name = "swiglu";
  op.shape = "n=" + std::to_string(n);
  op.fwd_flops = 5.0 * n;
  op.bwd_flops = 10.0 * n;
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, n, 2.0), randn(r, n, 1.0)}; };
  op.forward = [](const Tensors& in) {
    Vec h(in[0].size());
    swiglu_forward(h.data(), in[0].data(), in[1].data(), h.size());
    return h;
  };
  op.reference = [](const Tensors& in) { return ref_swiglu(in[0], in[1]); };
  op.backward = [](Tensors& d, const Tensors& in, const Vec& dh) {
    swiglu_backward(d[0].data(), d[1].data(), dh.data(), in[0].data(), in[1].data(), dh.size());
  };
  op.fd_h = 1e-3;
#ifdef MOETRAIN_OP_DEVICE
  // The same math::swiglu per element; only expf ulps and FMA contraction differ.
  op.device.push_back({"swiglu_forward", 1e-10, [=](Checker& c) {
                         Rng rng(1);
                         Vec g = randn(rng, n, 2.0), u = randn(rng, n), h(n, 0.0f);
                         auto dg = dev(g), du = dev(u), dh = dev(h);
                         swiglu_forward(h.data(), g.data(), u.data(), n);
                         cuda::swiglu_forward(dh.data(), dg.data(), du.data(), n);
                         c.close("h", host(dh), h);
                       }});
  op.device.push_back(
      {"swiglu_backward", 1e-10, [=](Checker& c) {
         Rng rng(2);
         Vec g = randn(rng, n, 2.0), u = randn(rng, n), dh = randn(rng, n);
         Vec dg = randn(rng, n), du = randn(rng, n);  // += contract
         auto d_g = dev(g), d_u = dev(u), d_dh = dev(dh), d_dg = dev(dg), d_du = dev(du);
         swiglu_backward(dg.data(), du.data(), dh.data(), g.data(), u.data(), n);
         cuda::swiglu_backward(d_dg.data(), d_du.data(), d_dh.data(), d_g.data(), d_u.data(), n);
         c.close("dg", host(d_dg), dg);
         c.close("du", host(d_du), du);
       }});
  op.device.push_back({"swiglu_backward_inplace", 1e-10, [=](Checker& c) {
                         Rng rng(3);
                         Vec g = randn(rng, n, 2.0), u = randn(rng, n), dg = randn(rng, n),
                             du = randn(rng, n);  // du is overwritten
                         auto d_g = dev(g), d_u = dev(u), d_dg = dev(dg), d_du = dev(du);
                         swiglu_backward_inplace(dg.data(), du.data(), g.data(), u.data(), n);
                         cuda::swiglu_backward_inplace(d_dg.data(), d_du.data(), d_g.data(),
                                                       d_u.data(), n);
                         c.close("dg", host(d_dg), dg);
                         c.close("du", host(d_du), du);
                       }});
#endif
  return op;
}

// A gather: no FLOPs forward; backward adds one row per token.
Op embedding_op(int vocab, int dim, std::vector<int32_t> tokens) {
  Op op;
  op.name = "embedding";
  const int n = static_cast<int>(tokens.size());
  const size_t distinct = std::set<int32_t>(tokens.begin(), tokens.end()).size();
  op.shape = dims("V", vocab, "dim", dim) + " " + dims("tokens", n, "distinct", long(distinct));
  op.bwd_flops = double(n) * dim;
  op.fwd_bytes = 2.0 * n * dim * sizeof(float) + n * sizeof(int32_t);
  auto tok = std::make_shared<const std::vector<int32_t>>(std::move(tokens));
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, size_t(vocab) * dim, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec out(size_t(n) * dim);
    embedding_forward(out.data(), tok->data(), in[0].data(), n, dim);
    return out;
  };
  op.reference = [=](const Tensors& in) {
    Vec out;
    for (int32_t t : *tok)
      out.insert(out.end(), in[0].begin() + size_t(t) * dim, in[0].begin() + size_t(t + 1) * dim);
    return out;
  };
  op.backward = [=](Tensors& d, const Tensors&, const Vec& dout) {
    embedding_backward(d[0].data(), dout.data(), tok->data(), n, dim);
  };
  op.fwd_nmse = 0.0;
#ifdef MOETRAIN_OP_DEVICE
  // A copy forward; backward the same adds in the same (token) order: bit-identical.
  op.device.push_back({"embedding_forward", 0.0, [=](Checker& c) {
                         Rng rng(4);
                         Vec wte = randn(rng, size_t(vocab) * dim), out(size_t(n) * dim);
                         auto d_wte = dev(wte), d_out = dev(out);
                         auto d_tok = dev(*tok);
                         embedding_forward(out.data(), tok->data(), wte.data(), n, dim);
                         cuda::embedding_forward(d_out.data(), d_tok.data(), d_wte.data(), n, dim);
                         c.close("out", host(d_out), out);
                       }});
  op.device.push_back({"embedding_backward", 0.0, [=](Checker& c) {
                         Rng rng(5);
                         Vec dwte = randn(rng, size_t(vocab) * dim),
                             dout = randn(rng, size_t(n) * dim);
                         auto d_dwte = dev(dwte), d_dout = dev(dout);
                         auto d_tok = dev(*tok);
                         embedding_backward(dwte.data(), dout.data(), tok->data(), n, dim);
                         cuda::embedding_backward(d_dwte.data(), d_dout.data(), d_tok.data(), n,
                                                  dim);
                         c.close("dwte", host(d_dwte), dwte);
                       }});
#endif
  return op;
}

// Per row: max, subtract and exp, sum, divide (~5 per logit); backward p - onehot scaled (2 per
// logit) on top of the forward it reruns for the probabilities.
Op cross_entropy_op(int V, std::vector<int32_t> targets) {
  Op op;
  op.name = "cross_entropy";
  const int N = static_cast<int>(targets.size());
  op.shape = dims("N", N, "V", V);
  op.fwd_flops = 5.0 * N * V;
  op.bwd_flops = op.fwd_flops + 2.0 * N * V;
  auto tgt = std::make_shared<const std::vector<int32_t>>(std::move(targets));
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, size_t(N) * V, 2.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec losses(N), probs(in[0].size());
    cross_entropy_forward(losses.data(), probs.data(), in[0].data(), tgt->data(), N, V);
    return losses;
  };
  op.reference = [=](const Tensors& in) {
    Vec losses;
    for (int n = 0; n < N; ++n) {
      const float* x = in[0].data() + size_t(n) * V;
      double mx = *std::max_element(x, x + V), s = 0.0;
      for (int j = 0; j < V; ++j) s += std::exp(x[j] - mx);
      losses.push_back(static_cast<float>(mx + std::log(s) - x[(*tgt)[n]]));
    }
    return losses;
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dloss) {
    Vec losses(N), probs(in[0].size());
    cross_entropy_forward(losses.data(), probs.data(), in[0].data(), tgt->data(), N, V);
    // dL/dlogits_n = dloss_n · (p_n - onehot): one call per row, scale = dloss_n
    for (int n = 0; n < N; ++n)
      cross_entropy_backward(d[0].data() + size_t(n) * V, probs.data() + size_t(n) * V,
                             tgt->data() + n, 1, V, dloss[n]);
  };
  op.fd_h = 1e-3;
#ifdef MOETRAIN_OP_DEVICE
  // With a target outside [0, V) the check is the CUDA kernel's refusal.
  if (std::any_of(tgt->begin(), tgt->end(), [=](int32_t t) { return t < 0 || t >= V; })) {
    op.device = {{"cross_entropy bad target refused", 0.0, [=](Checker& c) {
                    Vec logits(size_t(N) * V, 0.5f);
                    auto d_logits = dev(logits), d_probs = dev(logits), d_losses = dev(Vec(N));
                    auto d_tgt = dev(*tgt);
                    try {
                      cuda::cross_entropy_forward(d_losses.data(), d_probs.data(),
                                                  d_logits.data(), d_tgt.data(), N, V);
                      c.mismatch("throw", "no moe::Error for a target outside [0, V)");
                    } catch (const Error&) {
                    }
                  }}};
    return op;
  }
  op.device.push_back({"cross_entropy_forward", 1e-10, [=](Checker& c) {
                         Rng rng(50 + N);
                         const size_t n = size_t(N) * V;
                         Vec logits = randn(rng, n, 3.0), probs(n), losses(N);
                         auto d_logits = dev(logits), d_probs = dev(probs), d_losses = dev(losses);
                         auto d_tgt = dev(*tgt);
                         const double mean = cross_entropy_forward(
                             losses.data(), probs.data(), logits.data(), tgt->data(), N, V);
                         const double d_mean = cuda::cross_entropy_forward(
                             d_losses.data(), d_probs.data(), d_logits.data(), d_tgt.data(), N, V);
                         c.close("losses", host(d_losses), losses);
                         c.close("probs", host(d_probs), probs);
                         c.scalar("mean", d_mean, mean);
                       }});
  op.device.push_back({"cross_entropy_backward", 1e-10, [=](Checker& c) {
                         Rng rng(60 + N);
                         const size_t n = size_t(N) * V;
                         Vec probs = uniform(rng, n, 0.0, 1.0), d = randn(rng, n);
                         auto d_probs = dev(probs), d_d = dev(d);
                         auto d_tgt = dev(*tgt);
                         const float scale = N ? 1.0f / N : 1.0f;
                         cross_entropy_backward(d.data(), probs.data(), tgt->data(), N, V, scale);
                         cuda::cross_entropy_backward(d_d.data(), d_probs.data(), d_tgt.data(), N,
                                                      V, scale);
                         c.close("dlogits", host(d_d), d);
                       }});
#endif
  return op;
}

// Three GEMMs forward (6·N·H·F) and the SwiGLU; backward six GEMMs and the SwiGLU's backward on
// top of the forward it reruns.
Op swiglu_mlp_op(int N, int H, int F) {
  Op op;
  op.name = "swiglu_mlp";
  op.shape = "N=" + std::to_string(N) + " " + dims("H", H, "F", F);
  op.fwd_flops = 6.0 * N * H * F + 5.0 * N * F;
  op.bwd_flops = op.fwd_flops + 12.0 * N * H * F + 10.0 * N * F;
  const size_t fh = size_t(F) * H;
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, size_t(N) * H, 1.0), randn(r, fh, 0.5), randn(r, fh, 0.5),
                   randn(r, fh, 0.5)};
  };
  op.forward = [=](const Tensors& in) {
    Vec y(size_t(N) * H), g(size_t(N) * F), u(g.size()), h(g.size());
    swiglu_mlp_forward(y.data(), g.data(), u.data(), h.data(), in[0].data(),
                       {in[1].data(), in[2].data(), in[3].data()}, N, H, F);
    return y;
  };
  op.reference = [=](const Tensors& in) {
    return ref_mlp(in[0], in[1].data(), in[2].data(), in[3].data(), N, H, F);
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dy) {
    Vec y(size_t(N) * H), g(size_t(N) * F), u(g.size()), h(g.size()), scratch(2 * g.size());
    MlpWeights w{in[1].data(), in[2].data(), in[3].data()};
    swiglu_mlp_forward(y.data(), g.data(), u.data(), h.data(), in[0].data(), w, N, H, F);
    swiglu_mlp_backward(d[0].data(), {d[1].data(), d[2].data(), d[3].data()}, dy.data(),
                        in[0].data(), g.data(), u.data(), h.data(), w, N, H, F, scratch.data());
  };
  op.fd_h = 1e-3;
  return op;
}

// The SwiGLU MLP per expert over R = offsets.back() rows: the same FLOPs as swiglu_mlp with N = R.
Op grouped_swiglu_op(int H, int F, std::vector<int32_t> offsets_E1) {
  Op op;
  op.name = "grouped_swiglu";
  const int E = static_cast<int>(offsets_E1.size()) - 1, R = offsets_E1.back();
  long empty = 0;
  for (int e = 0; e < E; ++e) empty += offsets_E1[e + 1] == offsets_E1[e];
  op.shape = dims("R", R, "E", E) + " " + dims("H", H, "F", F) + " empty=" + std::to_string(empty);
  op.fwd_flops = 6.0 * R * H * F + 5.0 * R * F;
  op.bwd_flops = op.fwd_flops + 12.0 * R * H * F + 10.0 * R * F;
  const size_t fh = size_t(F) * H;
  auto off = std::make_shared<const std::vector<int32_t>>(std::move(offsets_E1));
  op.make_inputs = [=](Rng& r) {
    return Tensors{randn(r, size_t(R) * H, 1.0), randn(r, E * fh, 0.5), randn(r, E * fh, 0.5),
                   randn(r, E * fh, 0.5)};
  };
  op.forward = [=](const Tensors& in) {
    Vec y(size_t(R) * H), g(size_t(R) * F), u(g.size()), h(g.size());
    grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), in[0].data(), off->data(), E,
                           {in[1].data(), in[2].data(), in[3].data()}, H, F);
    return y;
  };
  op.reference = [=](const Tensors& in) {
    Vec y;
    for (int e = 0; e < E; ++e) {
      int r0 = (*off)[e], n = (*off)[e + 1] - r0;
      Vec x(in[0].begin() + size_t(r0) * H, in[0].begin() + size_t(r0 + n) * H);
      Vec ye = ref_mlp(x, in[1].data() + e * fh, in[2].data() + e * fh, in[3].data() + e * fh, n,
                       H, F);
      y.insert(y.end(), ye.begin(), ye.end());
    }
    return y;
  };
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dy) {
    Vec y(size_t(R) * H), g(size_t(R) * F), u(g.size()), h(g.size()), scratch(2 * g.size());
    MlpWeights w{in[1].data(), in[2].data(), in[3].data()};
    grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), in[0].data(), off->data(), E, w,
                           H, F);
    // The grouped backward writes dx (weight gradients add): add it into d[0] here, as the
    // table's contract says.
    Vec dx(size_t(R) * H);
    grouped_swiglu_backward(dx.data(), {d[1].data(), d[2].data(), d[3].data()}, dy.data(),
                            in[0].data(), g.data(), u.data(), h.data(), off->data(), E, w, H, F,
                            scratch.data());
    for (size_t i = 0; i < dx.size(); ++i) d[0][i] += dx[i];
  };
  op.fd_h = 1e-3;
#ifdef MOETRAIN_OP_DEVICE
  // On CUDA one grouped GEMM per product (cublasGemmGroupedBatchedEx in fp32, per-expert calls in
  // bf16), against the CPU's expert-by-expert loop; forward outputs and every gradient (dw
  // accumulated into, dx written). bf16: input rounding 2^-9.
  for (bool bf16 : {false, true})
    op.device.push_back(
        {bf16 ? "grouped_swiglu_forward + backward bf16" : "grouped_swiglu_forward + backward",
         bf16 ? 1e-4 : 1e-10, [=](Checker& c) {
           Rng rng(140);
           const size_t nh = size_t(R) * H, nf = size_t(R) * F;
           const int32_t* offsets = off->data();
           Vec x = randn(rng, nh), dy = randn(rng, nh), wg = randn(rng, E * fh, 0.2),
               wu = randn(rng, E * fh, 0.2), wd = randn(rng, E * fh, 0.2);
           Vec y(nh), g(nf), u(nf), h(nf), dx(nh), scratch(2 * nf);
           Vec dwg = randn(rng, E * fh), dwu = randn(rng, E * fh), dwd = randn(rng, E * fh);
           auto d_x = dev(x), d_dy = dev(dy), d_wg = dev(wg), d_wu = dev(wu), d_wd = dev(wd),
                d_y = dev(y), d_g = dev(g), d_u = dev(u), d_h = dev(h), d_dx = dev(dx),
                d_scratch = dev(scratch), d_dwg = dev(dwg), d_dwu = dev(dwu), d_dwd = dev(dwd);
           {
             const DeviceScope on_host(Device::kCpu, bf16);
             grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), offsets, E,
                                    {wg.data(), wu.data(), wd.data()}, H, F);
             grouped_swiglu_backward(dx.data(), {dwg.data(), dwu.data(), dwd.data()}, dy.data(),
                                     x.data(), g.data(), u.data(), h.data(), offsets, E,
                                     {wg.data(), wu.data(), wd.data()}, H, F, scratch.data());
           }
           {
             const DeviceScope on_device(Device::kCuda, bf16);
             const MlpWeights w{d_wg.data(), d_wu.data(), d_wd.data()};
             grouped_swiglu_forward(d_y.data(), d_g.data(), d_u.data(), d_h.data(), d_x.data(),
                                    offsets, E, w, H, F);
             grouped_swiglu_backward(d_dx.data(), {d_dwg.data(), d_dwu.data(), d_dwd.data()},
                                     d_dy.data(), d_x.data(), d_g.data(), d_u.data(), d_h.data(),
                                     offsets, E, w, H, F, d_scratch.data());
           }
           c.close("y", host(d_y), y);
           c.close("h", host(d_h), h);
           c.close("dx", host(d_dx), dx);
           c.close("dW_gate", host(d_dwg), dwg);
           c.close("dW_up", host(d_dwu), dwu);
           c.close("dW_down", host(d_dwd), dwd);
         }});
#endif
  return op;
}

}  // namespace moe::ops
