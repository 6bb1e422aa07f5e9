// The flash-style causal attention kernel (kernels/attention.cpp) against naive double-precision
// loops written independently of it (full softmax rows, the textbook softmax backward), at shapes
// that cross its query/key block boundaries and at head_dim 16..128; its saved state (row
// log-sum-exp and out copy) and its size, which the memory model counts; and exp_poly, the
// vectorisable exp its softmax uses (element_math.h, shared with the CUDA kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/element_math.h"
#include "model/config.h"
#include "model/memory_sizes.h"
#include "test_util.h"

namespace {

using namespace moe;
using namespace moe::kernels;
using Vec = std::vector<float>;
using Ref = std::vector<double>;

struct Shape {
  int B, T, nh, hd;
  double q_scale;  // a larger q spreads the scores (rows with one dominant key)
};

struct Reference {
  Ref out, lse, dq, dk, dv;
};

// out_t = Σ_{s<=t} P_ts v_s, P = softmax_s(q_t·k_s / sqrt(hd)); with dP_ts = dout_t·v_s:
// dv_s = Σ_t P_ts dout_t, dS_ts = P_ts (dP_ts - Σ_u P_tu dP_tu) / sqrt(hd), dq_t = Σ_s dS_ts k_s,
// dk_s = Σ_t dS_ts q_t. Everything in double.
Reference naive_attention(const Vec& q, const Vec& k, const Vec& v, const Vec& dout, const Shape& s) {
  const int C = s.nh * s.hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hd));
  const size_t n = static_cast<size_t>(s.B) * s.T * C;
  Reference r{Ref(n), Ref(static_cast<size_t>(s.B) * s.nh * s.T), Ref(n), Ref(n), Ref(n)};
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.nh; ++h) {
      auto at = [&](int t, int j) { return (static_cast<size_t>(b) * s.T + t) * C + h * s.hd + j; };
      for (int t = 0; t < s.T; ++t) {
        Ref p(t + 1), dp(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          double d = 0.0;
          for (int j = 0; j < s.hd; ++j) d += static_cast<double>(q[at(t, j)]) * k[at(u, j)];
          p[u] = d * scale;
          mx = std::max(mx, p[u]);
        }
        double sum = 0.0;
        for (int u = 0; u <= t; ++u) sum += p[u] = std::exp(p[u] - mx);
        for (int u = 0; u <= t; ++u) p[u] /= sum;
        r.lse[(static_cast<size_t>(b) * s.nh + h) * s.T + t] = mx + std::log(sum);
        for (int j = 0; j < s.hd; ++j) {
          double o = 0.0;
          for (int u = 0; u <= t; ++u) o += p[u] * v[at(u, j)];
          r.out[at(t, j)] = o;
        }
        double pdp = 0.0;
        for (int u = 0; u <= t; ++u) {
          double d = 0.0;
          for (int j = 0; j < s.hd; ++j) d += static_cast<double>(dout[at(t, j)]) * v[at(u, j)];
          dp[u] = d;
          pdp += p[u] * d;
        }
        for (int u = 0; u <= t; ++u) {
          const double ds = p[u] * (dp[u] - pdp) * scale;
          for (int j = 0; j < s.hd; ++j) {
            r.dv[at(u, j)] += p[u] * dout[at(t, j)];
            r.dq[at(t, j)] += ds * k[at(u, j)];
            r.dk[at(u, j)] += ds * q[at(t, j)];
          }
        }
      }
    }
  return r;
}

// ||a - offset - ref|| / max(||ref||, 1): relative, and absolute where the reference is ~0 (T = 1:
// a lone key's softmax has zero gradient).
double rel_err(const Vec& a, const Ref& ref, float offset = 0.0f) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - offset - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1.0));
}

using moe::test_util::randn;

// Rows per block are 64: T = 63, 64, 65 sit at the first boundary, 130 and 200 span three and four
// blocks with a partial last one; hd 16..128.
TEST(FlashAttention, MatchesNaiveDoubleLoops) {
  // clang-format off
  const Shape shapes[] = {{2, 1, 2, 16, 1.0},  {2, 5, 3, 16, 1.0},   {1, 63, 2, 32, 1.0},
                          {2, 64, 2, 32, 1.0}, {1, 65, 2, 64, 1.0},  {1, 130, 2, 32, 4.0},
                          {2, 130, 1, 16, 1.0}, {1, 200, 1, 128, 1.0}, {1, 200, 2, 64, 8.0}};
  // clang-format on
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " nh=" << s.nh
                                      << " hd=" << s.hd << " q_scale=" << s.q_scale);
    Rng rng(1000 + s.T * 7 + s.hd);
    const size_t n = static_cast<size_t>(s.B) * s.T * s.nh * s.hd;
    const Vec q = randn(rng, n, s.q_scale), k = randn(rng, n, 1.0), v = randn(rng, n, 1.0),
              dout = randn(rng, n, 1.0);
    const Reference ref = naive_attention(q, k, v, dout, s);
    Vec out(n), att(attention_saved_floats(s.B, s.T, s.nh, s.hd));
    attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.nh, s.hd);
    // Gradients are added into what the buffers hold (the kernels' += convention).
    const float kPrior = 0.25f;
    Vec dq(n, kPrior), dk(n, kPrior), dv(n, kPrior);
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                       att.data(), s.B, s.T, s.nh, s.hd, nullptr);
    // Measured: out, dq, dk, dv within 1e-6 relative of the double loops (float rounding).
    EXPECT_LE(rel_err(out, ref.out), 2e-6);
    EXPECT_LE(rel_err(dq, ref.dq, kPrior), 4e-6);
    EXPECT_LE(rel_err(dk, ref.dk, kPrior), 4e-6);
    EXPECT_LE(rel_err(dv, ref.dv, kPrior), 2e-6);
    // The saved state: att = [lse (B, nh, T) | out (B, T, nh·hd)].
    const size_t rows = ref.lse.size();
    double lse_err = 0.0;
    for (size_t i = 0; i < rows; ++i)
      lse_err = std::max(lse_err, std::fabs(att[i] - ref.lse[i]) / std::max(1.0, std::fabs(ref.lse[i])));
    EXPECT_LE(lse_err, 1e-6);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), att.begin() + rows));
  }
}

// The CPU kernel's instruction sets (AVX-512 + FMA, AVX2 + FMA, baseline with std::fma) give the
// same bits, so results (the golden loss curves) do not depend on the CPU: every set this CPU has
// is run on shapes with partial blocks and head dims that are not whole vectors.
TEST(FlashAttention, EveryInstructionSetGivesTheSameBits) {
  const int top = attention_cpu_isa();
  const Shape shapes[] = {{2, 130, 2, 32, 2.0}, {1, 70, 1, 24, 1.0}, {1, 65, 2, 64, 1.0}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "T=" << s.T << " hd=" << s.hd);
    Rng rng(77 + s.T);
    const size_t n = static_cast<size_t>(s.B) * s.T * s.nh * s.hd;
    const Vec q = randn(rng, n, s.q_scale), k = randn(rng, n, 1.0), v = randn(rng, n, 1.0),
              dout = randn(rng, n, 1.0);
    std::vector<Vec> runs;
    for (int isa = top; isa >= 0; --isa) {
      force_attention_cpu_isa(isa);
      Vec out(n), att(attention_saved_floats(s.B, s.T, s.nh, s.hd)), dq(n), dk(n), dv(n);
      attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s.B, s.T, s.nh, s.hd);
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                         v.data(), att.data(), s.B, s.T, s.nh, s.hd, nullptr);
      Vec all = att;
      for (const Vec* x : {&dq, &dk, &dv}) all.insert(all.end(), x->begin(), x->end());
      runs.push_back(std::move(all));
    }
    force_attention_cpu_isa(-1);
    for (size_t i = 1; i < runs.size(); ++i)
      EXPECT_TRUE(runs[i] == runs[0]) << "instruction set " << top - static_cast<int>(i)
                                      << " differs from " << top;
  }
  EXPECT_THROW(force_attention_cpu_isa(top + 1), Error);
  EXPECT_EQ(attention_cpu_isa(), top);
}

// The saved state is O(T) per head, the same formula on every device, and the memory model's
// (model/memory_sizes.h) attention_state is exactly it; backward needs no scratch.
TEST(FlashAttention, SavedStateIsLinearInTAndTheMemoryModelsTerm) {
  EXPECT_EQ(attention_saved_floats(3, 2048, 4, 32), 3u * 4 * 2048 * (1 + 32));
  EXPECT_EQ(attention_scratch_floats(2048), 0u);
  const model::ModelConfig c = model::preset("tiny");
  for (int T : {16, 128, 1000}) {
    const int B = 3;
    const model::LayerActivationSizes s = model::layer_activation_elems(c, B, T, 0);
    EXPECT_EQ(s.attention_state, attention_saved_floats(B, T, c.num_attention_heads, c.head_dim()))
        << "T=" << T;
  }
}

// Bad shapes are one clear error naming the numbers, not a crash.
TEST(FlashAttention, RejectsBadShapes) {
  Vec buf(64);
  const std::string e = test_util::error_of([&] {
    attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), 1, -3, 2, 4);
  });
  EXPECT_NE(e.find("attention_forward: B=1 T=-3 n_head=2 head_dim=4"), std::string::npos) << e;
  EXPECT_NE(test_util::error_of([&] {
              attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                 buf.data(), buf.data(), buf.data(), 1, 4, 0, 4, nullptr);
            }).find("n_head=0"),
            std::string::npos);
}

// exp_poly against the double-precision exp on its whole range: relative error below 2.5e-7
// (measured 8e-8), exact at 0, and clamped (finite, positive) outside [-87, 88].
TEST(FlashAttention, ExpPolyIsAccurate) {
  double worst = 0.0;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 400000.0f;
    const double e = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(math::exp_poly(x) - e) / e);
  }
  EXPECT_LE(worst, 2.5e-7);
  EXPECT_EQ(math::exp_poly(0.0f), 1.0f);
  EXPECT_GT(math::exp_poly(-1000.0f), 0.0f);
  EXPECT_LE(math::exp_poly(-1000.0f), 2e-38f);
  EXPECT_TRUE(std::isfinite(math::exp_poly(1000.0f)));
  EXPECT_EQ(math::online_softmax_rescale(-INFINITY, 3.0f), 0.0f);
  EXPECT_EQ(math::online_softmax_rescale(3.0f, 3.0f), 1.0f);
}

}  // namespace
