// Correctness of the CPU kernels, test-backend-ops style: every op is described once in the op
// table (tests/ops/op_table.h: shapes, inputs, kernel forward and backward, naive reference, NMSE
// bounds, FLOPs) and that one description runs three ways here: forward against the naive loop,
// every backward against central finite differences of L = Σ out·R (fixed random R), and the +=
// convention (backward twice = 2×); bench/bench_ops.cpp runs it as a benchmark. Errors are
// normalised mean squared errors, Σ (a - b)² / Σ b². Below the table: the checks that do not fit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/mla.h"
#include "kernels/peak_rate.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu_mlp.h"
#include "ops/op_table.h"
#include "test_util.h"

namespace {

using namespace moe;
using namespace moe::kernels;
using Vec = std::vector<float>;
using Tensors = std::vector<Vec>;

using moe::test_util::randn;
using moe::test_util::norm_err;

using moe::ops::Op;
namespace ref = moe::ops::ref;
constexpr double kTheta = 10000.0;

// ---------------------------------------------------------------------------------------------
// The op table (tests/ops/op_table.h) at its test shapes.

const std::vector<Op>& ops() { return moe::ops::test_ops(); }

class KernelOp : public ::testing::TestWithParam<size_t> {
 protected:
  const Op& op() const { return ops()[GetParam()]; }
  Tensors inputs() const {
    Rng rng(1234 + GetParam());
    return op().make_inputs(rng);
  }
  Tensors zeros_like(const Tensors& t) const {
    Tensors z;
    for (const auto& v : t) z.emplace_back(v.size(), 0.0f);
    return z;
  }
  Vec weights_R(size_t n) const {
    Rng rng(99 + GetParam());
    return randn(rng, n, 1.0);
  }
};

TEST_P(KernelOp, ForwardMatchesNaiveReference) {
  Tensors in = inputs();
  Vec out = op().forward(in), ref = op().reference(in);
  ASSERT_EQ(out.size(), ref.size());
  ASSERT_LE(op().exact_tail, out.size());
  EXPECT_LE(moe::ops::nmse(out, ref), op().fwd_nmse) << op().shape;
  // Integer outputs (counts, ids, rows): exactly the reference's.
  for (size_t i = out.size() - op().exact_tail; i < out.size(); ++i)
    ASSERT_EQ(out[i], ref[i]) << op().shape << " integer output " << i;
}

// The same table, only the ops with a backward.
class KernelGrad : public KernelOp {};

TEST_P(KernelGrad, BackwardMatchesFiniteDifferences) {
  Tensors in = inputs();
  Vec R = weights_R(op().forward(in).size());
  auto loss = [&](const Tensors& x) {  // L = Σ out·R, summed in double
    Vec out = op().forward(x);
    double L = 0.0;
    for (size_t i = 0; i < out.size(); ++i) L += static_cast<double>(out[i]) * R[i];
    return L;
  };
  Tensors grads = zeros_like(in);
  op().backward(grads, in, R);
  const double h = op().fd_h;
  for (size_t t = 0; t < in.size(); ++t) {
    Vec numeric(in[t].size());
    for (size_t i = 0; i < in[t].size(); ++i) {
      Tensors x = in;
      x[t][i] = in[t][i] + static_cast<float>(h);
      double lp = loss(x);
      x[t][i] = in[t][i] - static_cast<float>(h);
      double lm = loss(x);
      numeric[i] = static_cast<float>((lp - lm) / (2 * h));
    }
    EXPECT_LE(moe::ops::nmse(grads[t], numeric), op().grad_nmse) << op().shape << " input " << t;
  }
}

TEST_P(KernelGrad, BackwardAddsIntoGradients) {
  Tensors in = inputs();
  Vec R = weights_R(op().forward(in).size());
  Tensors once = zeros_like(in), twice = zeros_like(in);
  op().backward(once, in, R);
  op().backward(twice, in, R);
  op().backward(twice, in, R);
  for (size_t t = 0; t < in.size(); ++t) {
    Vec doubled = once[t];
    for (auto& x : doubled) x *= 2.0f;
    EXPECT_LE(moe::ops::nmse(twice[t], doubled), 1e-12) << "input " << t;
  }
}

// An op's name, with _2, _3, ... on its later entries (gemm at every transpose and stride).
std::string entry_name(const ::testing::TestParamInfo<size_t>& info) {
  int earlier = 0;
  for (size_t i = 0; i < info.param; ++i) earlier += ops()[i].name == ops()[info.param].name;
  return ops()[info.param].name + (earlier ? "_" + std::to_string(earlier + 1) : "");
}
std::vector<size_t> with_backward() {
  std::vector<size_t> idx;
  for (size_t i = 0; i < ops().size(); ++i)
    if (ops()[i].backward) idx.push_back(i);
  return idx;
}

INSTANTIATE_TEST_SUITE_P(Ops, KernelOp, ::testing::Range<size_t>(0, ops().size()), entry_name);
INSTANTIATE_TEST_SUITE_P(Ops, KernelGrad, ::testing::ValuesIn(with_backward()), entry_name);

// ---------------------------------------------------------------------------------------------
// Checks that do not fit the table.

// gemm's transposes, strides, K = 0 and M = 0 are entries of the op table; linear's accumulate
// flag is not.
TEST(Gemm, LinearAccumulateAdds) {
  Rng rng(8);
  Vec x = randn(rng, 3 * 4, 1.0), w = randn(rng, 2 * 4, 1.0), y0 = randn(rng, 3 * 2, 1.0);
  Vec y = y0;
  linear_forward(y.data(), x.data(), w.data(), 3, 4, 2, /*accumulate=*/true);
  Vec ref = ref::linear(x, w, 3, 4, 2);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
  EXPECT_LE(norm_err(y, ref), 1e-6);
}

TEST(Gemm, ThreadsAndRoofline) {
  int before = blas_threads();
  set_blas_threads(1);
  EXPECT_EQ(blas_threads(), 1);
  set_blas_threads(before);
  EXPECT_THROW(set_blas_threads(0), moe::Error);
  EXPECT_GT(measure_peak_gflops(moe::Precision::kFp32, {64}, 2), 0.0);
}

TEST(Gemm, BlasCoresThisCpuCannotRunAreNamed) {
  // The generic core and names OpenBLAS does not know (it falls back) always run.
  EXPECT_EQ(blas_core_unsupported_reason("Prescott"), "");
  EXPECT_EQ(blas_core_unsupported_reason("NoSuchCore"), "");
  EXPECT_EQ(blas_core_unsupported_reason(nullptr), "");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  for (const char* core : {"SkylakeX", "skylakex", "Cooperlake", "SapphireRapids"}) {
    const std::string why = blas_core_unsupported_reason(core);
    EXPECT_EQ(why.empty(), avx512) << core << ": " << why;
    if (!avx512) {
      EXPECT_NE(why.find("AVX-512"), std::string::npos) << why;
    }
    if (!avx512 && avx2) {
      EXPECT_NE(why.find("use Haswell"), std::string::npos) << why;
    }
  }
  for (const char* core : {"Haswell", "Zen"}) {
    const std::string why = blas_core_unsupported_reason(core);
    EXPECT_EQ(why.empty(), avx2) << core << ": " << why;
  }
}

TEST(Rope, TableMatchesDirectFormula) {
  const int hd = 16;
  RopeTable t = make_rope_table(64, hd, 500000.0);
  ASSERT_EQ(t.half, hd / 2);
  ASSERT_EQ(t.cos.size(), 64u * (hd / 2));
  for (int p : {0, 1, 7, 63})
    for (int i = 0; i < hd / 2; ++i) {
      double angle = p / std::pow(500000.0, 2.0 * i / hd);
      EXPECT_NEAR(t.cos[p * t.half + i], std::cos(angle), 1e-7) << "p=" << p << " i=" << i;
      EXPECT_NEAR(t.sin[p * t.half + i], std::sin(angle), 1e-7) << "p=" << p << " i=" << i;
    }
  EXPECT_EQ(t.cos[0], 1.0f);
  EXPECT_EQ(t.sin[5], 0.0f);  // position 0 does not rotate
}

TEST(Rope, BackwardUndoesForwardAndChecksShapes) {
  Rng rng(3);
  RopeTable t = make_rope_table(6, 8, kTheta);
  Vec x = randn(rng, 2 * 6 * 3 * 8, 1.0), y = x;
  rope_forward(y.data(), t, 2, 6, 3, 8);
  rope_backward(y.data(), t, 2, 6, 3, 8);
  EXPECT_LE(norm_err(y, x), 1e-6);
  EXPECT_THROW(rope_forward(y.data(), t, 1, 7, 3, 8), moe::Error);  // T > max_pos
  EXPECT_THROW(rope_forward(y.data(), t, 1, 6, 3, 6), moe::Error);  // head_dim mismatch
  EXPECT_THROW(make_rope_table(4, 7, kTheta), moe::Error);          // odd head_dim
}

// YaRN's table against HF DeepseekV2YarnRotaryEmbedding's formulas written out in double: below
// the ramp the frequency is unscaled, above it divided by the factor, and cos/sin carry the
// mscale ratio.
TEST(Rope, YarnTableMatchesFormula) {
  const int d = 16;
  YarnParams y;
  y.factor = 8.0, y.mscale = 0.8, y.mscale_all_dim = 1.0, y.original_max_pos = 4096;
  const double theta = 10000.0, pi = 3.14159265358979323846;
  RopeTable t = make_yarn_rope_table(100, d, theta, y);
  auto corr = [&](double rot) { return d * std::log(4096 / (rot * 2 * pi)) / (2 * std::log(theta)); };
  const double low = std::max(std::floor(corr(32.0)), 0.0), high = std::min(std::ceil(corr(1.0)), d - 1.0);
  auto ms = [&](double m) { return 0.1 * m * std::log(8.0) + 1.0; };
  const double amp = ms(0.8) / ms(1.0);
  for (int p : {0, 3, 99})
    for (int i = 0; i < d / 2; ++i) {
      const double extra = std::pow(theta, -2.0 * i / d);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      const double f = extra / 8.0 * ramp + extra * (1 - ramp);
      EXPECT_NEAR(t.cos[p * t.half + i], std::cos(p * f) * amp, 1e-6) << "p=" << p << " i=" << i;
      EXPECT_NEAR(t.sin[p * t.half + i], std::sin(p * f) * amp, 1e-6) << "p=" << p << " i=" << i;
    }
  EXPECT_GT(low, 0.0);           // the ramp starts inside the dimensions...
  EXPECT_LT(high, d / 2 - 1.0);  // ...and ends inside them: both regimes are tested
}

// MLA's head assembly (layout against naive loops, backward against finite differences) is in
// the op table; a head width below dn + dr is refused.
TEST(Mla, HeadWidthBelowNopePlusRopeIsRefused) {
  MlaShape bad;
  bad.B = 1, bad.T = 2, bad.nh = 1, bad.dn = 4, bad.dr = 4, bad.dv = 4, bad.D = 6;  // D < dn + dr
  Vec x(64);
  const RopeTable table = make_rope_table(8, 4, kTheta);
  EXPECT_THROW(mla_heads_forward(x.data(), x.data(), x.data(), x.data(), x.data(), x.data(), table, bad, 1.0f),
               moe::Error);
}

// The flash kernel's own tests (naive double loops across block boundaries, the saved state,
// exp_poly): tests/test_attention.cpp.

TEST(CrossEntropy, MeanLossAndTargetCheck) {
  Rng rng(5);
  const int N = 3, V = 11;
  Vec logits = randn(rng, N * V, 3.0), losses(N), probs(N * V);
  std::vector<int32_t> targets = {0, 10, 4};
  double mean =
      cross_entropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  double ref = 0.0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0.0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[n * V + j]));
    for (int j = 0; j < V; ++j) s += std::exp(logits[n * V + j] - mx);
    ref += (mx + std::log(s) - logits[n * V + targets[n]]) / N;
    double psum = 0.0;
    for (int j = 0; j < V; ++j) psum += probs[n * V + j];
    EXPECT_NEAR(psum, 1.0, 1e-6);
  }
  EXPECT_NEAR(mean, ref, 1e-6);
  targets[1] = V;
  EXPECT_THROW(
      cross_entropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V),
      moe::Error);
}

// Grouped experts == the plain loop of swiglu_mlp per expert, forward and backward, on shapes big
// enough for BLAS to block (uneven segments, empty first, middle and last experts).
TEST(GroupedSwiglu, EqualsLoopOverExperts) {
  const int H = 48, F = 40, E = 7;
  const std::vector<int32_t> off = {0, 0, 37, 38, 38, 101, 160, 160};
  const int R = off.back();
  const size_t fh = static_cast<size_t>(F) * H;
  Rng rng(6);
  Vec x = randn(rng, R * H, 1.0), gate = randn(rng, E * fh, 0.2), up = randn(rng, E * fh, 0.2),
      down = randn(rng, E * fh, 0.2), dy = randn(rng, R * H, 1.0);
  MlpWeights w{gate.data(), up.data(), down.data()};

  Vec y(R * H), g(R * F), u(R * F), h(R * F), scratch(2 * R * F);
  // dx is written, not added to: whatever it held before must not show.
  Vec dx(R * H, 7.0f), dgate(E * fh), dup(E * fh), ddown(E * fh);
  grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), off.data(), E, w, H, F);
  grouped_swiglu_backward(dx.data(), {dgate.data(), dup.data(), ddown.data()}, dy.data(), x.data(),
                          g.data(), u.data(), h.data(), off.data(), E, w, H, F, scratch.data());

  Vec y2(R * H), dx2(R * H), dgate2(E * fh), dup2(E * fh), ddown2(E * fh);
  for (int e = 0; e < E; ++e) {
    int r0 = off[e], n = off[e + 1] - r0;
    if (n == 0) continue;
    Vec ge(n * F), ue(n * F), he(n * F), sc(2 * n * F);
    MlpWeights we{gate.data() + e * fh, up.data() + e * fh, down.data() + e * fh};
    swiglu_mlp_forward(y2.data() + r0 * H, ge.data(), ue.data(), he.data(), x.data() + r0 * H, we,
                       n, H, F);
    swiglu_mlp_backward(dx2.data() + r0 * H,
                        {dgate2.data() + e * fh, dup2.data() + e * fh, ddown2.data() + e * fh},
                        dy.data() + r0 * H, x.data() + r0 * H, ge.data(), ue.data(), he.data(), we,
                        n, H, F, sc.data());
  }
  EXPECT_LE(norm_err(y, y2), 1e-6);
  EXPECT_LE(norm_err(dx, dx2), 1e-6);
  EXPECT_LE(norm_err(dgate, dgate2), 1e-6);
  EXPECT_LE(norm_err(dup, dup2), 1e-6);
  EXPECT_LE(norm_err(ddown, ddown2), 1e-6);
  // Weights of empty experts get no gradient.
  for (size_t i = 0; i < fh; ++i) ASSERT_EQ(dgate[i], 0.0f);
  for (size_t i = 6 * fh; i < 7 * fh; ++i) ASSERT_EQ(ddown[i], 0.0f);

  std::vector<int32_t> bad = off;
  bad[3] = 30;  // offsets must not decrease
  EXPECT_THROW(grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), bad.data(),
                                      E, w, H, F),
               moe::Error);
}

// Two AdamW steps on two parameters, worked by hand (lr 0.1, betas 0.9/0.999, eps 1e-8, wd 0.1,
// grad_scale 0.5). Parameter 0, raw grads 1 then -2, so g' = 0.5 then -1:
//   step 1: p = 1·(1 - 0.01) = 0.99; m = 0.05; v = 0.001·0.25 = 2.5e-4;
//           denom = sqrt(2.5e-4)/sqrt(0.001) + 1e-8 = 0.50000001; p -= (0.1/0.1)·0.05/denom ->
//           0.890000002
//   step 2: p = 0.890000002·0.99; m = 0.045 - 0.1 = -0.055; v = 2.4975e-4 + 1e-3 = 1.24975e-3;
//           bc1 = 0.19, bc2 = 0.001999; denom = sqrt(v/bc2) + 1e-8 = 0.7906880609;
//           p -= (0.1/0.19)·(-0.055)/denom -> 0.9177103542
// Parameter 1 (raw grads -4 then 6) the same way: 1.0899999995, then 1.0543298180.
TEST(AdamW, TwoStepsByHand) {
  AdamWParams hp;
  hp.lr = 0.1f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  Vec p = {1.0f, 1.0f}, m(2, 0.0f), v(2, 0.0f);
  Vec g1 = {1.0f, -4.0f}, g2 = {-2.0f, 6.0f};
  adamw_update(p.data(), g1.data(), m.data(), v.data(), 2, hp, 1, 0.5f);
  EXPECT_NEAR(p[0], 0.8900000020, 1e-6);
  EXPECT_NEAR(p[1], 1.0899999995, 1e-6);
  EXPECT_NEAR(m[0], 0.05, 1e-8);
  EXPECT_NEAR(v[1], 0.004, 1e-9);
  adamw_update(p.data(), g2.data(), m.data(), v.data(), 2, hp, 2, 0.5f);
  EXPECT_NEAR(p[0], 0.9177103542, 1e-6);
  EXPECT_NEAR(p[1], 1.0543298180, 1e-6);
  EXPECT_NEAR(m[0], -0.055, 1e-8);
  EXPECT_NEAR(v[0], 1.24975e-3, 1e-9);
  EXPECT_THROW(adamw_update(p.data(), g2.data(), m.data(), v.data(), 2, hp, 0, 1.0f), moe::Error);
}

// The row sums run in 16 interleaved double lanes plus an in-order tail: every width, whole
// groups or not, against double loops (forward and backward, dx added into, dw summed over rows).
TEST(RmsNorm, LaneSumsAtEveryWidthMatchDoubleLoops) {
  Rng rng(77);
  for (int dim : {1, 5, 15, 16, 17, 40, 128, 131}) {
    const int rows = 3;
    Vec x(rows * dim), w(dim), dout(rows * dim), out(rows * dim), rstd(rows);
    for (float& e : x) e = static_cast<float>(rng.normal());
    for (float& e : w) e = static_cast<float>(1.0 + 0.3 * rng.normal());
    for (float& e : dout) e = static_cast<float>(rng.normal());
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    const Vec want = ref::rmsnorm(x, w, rows, dim, 1e-5);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], 3e-7 * (std::fabs(want[i]) + 1e-3)) << "dim " << dim << " at " << i;
    Vec dx(rows * dim, 0.5f), dw(dim, 0.25f);
    rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), rows, dim);
    std::vector<double> dw_want(dim, 0.25);
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * dim;
      const float* d = dout.data() + r * dim;
      double dot = 0;
      for (int j = 0; j < dim; ++j) dot += double(d[j]) * w[j] * xr[j];
      const double rs = rstd[r], c = dot * rs * rs * rs / dim;
      for (int j = 0; j < dim; ++j) {
        const double want_dx = 0.5 + rs * w[j] * d[j] - c * xr[j];
        ASSERT_NEAR(dx[r * dim + j], want_dx, 1e-6 * (std::fabs(want_dx) + std::fabs(c * xr[j]) + 1))
            << "dim " << dim << " row " << r << " col " << j;
        dw_want[j] += double(d[j]) * xr[j] * rs;
      }
    }
    for (int j = 0; j < dim; ++j) ASSERT_NEAR(dw[j], dw_want[j], 1e-5 * (std::fabs(dw_want[j]) + 1));
  }
}

}  // namespace
