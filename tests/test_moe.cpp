// Tests of the MoE layer: router (HF MoEGate semantics), layouts (hand-worked and against a naive
// loop), dispatch/combine (identity experts), the whole layer against a naive per-token loop and
// the dense MLP, padded vs padding-free agreement, and finite-difference gradients of everything.
// Legend: T tokens, H hidden, E experts, k slots, F expert ffn, Fs shared ffn, B sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/exec_context.h"
#include "kernels/swiglu_mlp.h"
#include "moe/dispatch.h"
#include "tools/bench_moe_layer.h"
#include "moe/layout.h"
#include "moe/moe_layer.h"
#include "moe/router.h"
#include "test_util.h"

namespace {

using namespace moe;
using namespace moe::mixture;
using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

// Each suite draws its tensors from its own stream of the seed.
Vec randn(size_t n, uint64_t seed, float stddev) { return test_util::randn(n, seed, 17, stddev); }
using test_util::to_vec;

// Random top-k routing: k distinct experts per token.
IVec random_topk(int T, int k, int E, uint64_t seed) {
  Rng rng(seed);
  IVec idx(static_cast<size_t>(T) * k);
  for (int t = 0; t < T; ++t) {
    IVec perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = 0; i < k; ++i) std::swap(perm[i], perm[i + rng.below(E - i)]);
    for (int j = 0; j < k; ++j) idx[static_cast<size_t>(t) * k + j] = perm[j];
  }
  return idx;
}

// ------------------------------------------------------------------------------------------------
// Layout

TEST(MoeLayout, HandWorkedT4K2E3WithAnEmptyExpert) {
  // token:      0      1      2      3
  // experts: (0,2)  (2,0)  (0,2)  (0,2)     pairs p = t·2 + j: e = 0 2 2 0 0 2 0 2
  IVec idx = {0, 2, 2, 0, 0, 2, 0, 2};
  DispatchLayout l = build_dispatch_layout(idx.data(), 4, 2, 3);
  EXPECT_EQ(l.num_rows, 8);
  EXPECT_EQ(l.num_dropped, 0);
  EXPECT_EQ(l.capacity, 0);
  EXPECT_EQ(to_vec(l.num_tokens_per_expert_E), (IVec{4, 0, 4}));
  EXPECT_EQ(to_vec(l.offsets_E1), (IVec{0, 4, 4, 8}));
  // expert 0 gets pairs 0,3,4,6 (in p order), expert 1 none, expert 2 pairs 1,2,5,7
  EXPECT_EQ(to_vec(l.slot_of_row_R), (IVec{0, 3, 4, 6, 1, 2, 5, 7}));
  EXPECT_EQ(to_vec(l.row_of_slot_TK), (IVec{0, 4, 5, 1, 2, 6, 3, 7}));
}

TEST(MoeLayout, AllTokensToOneExpert) {
  IVec idx = {1, 1, 1, 1, 1};  // T=5, k=1, E=3
  DispatchLayout l = build_dispatch_layout(idx.data(), 5, 1, 3);
  EXPECT_EQ(to_vec(l.num_tokens_per_expert_E), (IVec{0, 5, 0}));
  EXPECT_EQ(to_vec(l.offsets_E1), (IVec{0, 0, 5, 5}));
  EXPECT_EQ(to_vec(l.slot_of_row_R), (IVec{0, 1, 2, 3, 4}));
  EXPECT_EQ(to_vec(l.row_of_slot_TK), (IVec{0, 1, 2, 3, 4}));
  // Padded: C = ceil(5·1·1/3) = 2 (min_capacity 1): expert 1 keeps tokens 0,1; 3 dropped.
  PaddedLayout p = build_padded_layout(idx.data(), 5, 1, 3, 1.0f, 1);
  EXPECT_EQ(p.C, 2);
  EXPECT_EQ(p.num_kept, 2);
  EXPECT_EQ(p.num_dropped, 3);
  EXPECT_EQ(p.padding_rows(), 4u);
  EXPECT_EQ(to_vec(p.slot_of_pos_EC), (IVec{-1, -1, 0, 1, -1, -1}));
  EXPECT_EQ(to_vec(p.pos_of_slot_TK), (IVec{2, 3, -1, -1, -1}));
  EXPECT_EQ(to_vec(p.offsets_E1), (IVec{0, 2, 4, 6}));
}

TEST(MoeLayout, CapacityDropKeepsFirstPairsInTokenOrder) {
  IVec idx = {0, 2, 2, 0, 0, 2, 0, 2};  // as above: 4 pairs each to experts 0 and 2
  // C = max(ceil(4·2·0.75/3), 1) = 2: expert 0 keeps pairs 0,3 (drops 4,6); expert 2 keeps 1,2.
  DispatchLayout l = build_dispatch_layout(idx.data(), 4, 2, 3, 0.75f, 1);
  EXPECT_EQ(l.capacity, 2);
  EXPECT_EQ(l.num_rows, 4);
  EXPECT_EQ(l.num_dropped, 4);
  EXPECT_EQ(to_vec(l.num_tokens_per_expert_E), (IVec{2, 0, 2}));
  EXPECT_EQ(to_vec(l.offsets_E1), (IVec{0, 2, 2, 4}));
  EXPECT_EQ(to_vec(l.slot_of_row_R), (IVec{0, 3, 1, 2}));
  EXPECT_EQ(to_vec(l.row_of_slot_TK), (IVec{0, 2, 3, 1, -1, -1, -1, -1}));
  // Same keep rule in the padded layout: positions e·C + c, padding for expert 1.
  PaddedLayout p = build_padded_layout(idx.data(), 4, 2, 3, 0.75f, 1);
  EXPECT_EQ(p.C, 2);
  EXPECT_EQ(p.num_dropped, 4);
  EXPECT_EQ(to_vec(p.slot_of_pos_EC), (IVec{0, 3, -1, -1, 1, 2}));
  EXPECT_EQ(to_vec(p.pos_of_slot_TK), (IVec{0, 4, 5, 1, -1, -1, -1, -1}));
  // The default min_capacity (4) keeps everything here.
  EXPECT_EQ(build_dispatch_layout(idx.data(), 4, 2, 3, 0.75f).num_dropped, 0);
}

TEST(MoeLayout, CapacityFormula) {
  EXPECT_EQ(expert_capacity(4096, 6, 64, 1.0f), 384);
  EXPECT_EQ(expert_capacity(4096, 6, 64, 1.25f), 480);
  EXPECT_EQ(expert_capacity(10, 1, 8, 1.0f), 4);     // min_capacity
  EXPECT_EQ(expert_capacity(10, 2, 2, 100.0f), 10);  // never more than T
  EXPECT_THROW(expert_capacity(10, 2, 2, 0.0f), moe::Error);
  IVec bad = {0, 3};
  EXPECT_THROW(build_dispatch_layout(bad.data(), 2, 1, 3), moe::Error);
}

TEST(MoeLayout, MatchesNaiveLoopOnRandomRouting) {
  for (int trial = 0; trial < 20; ++trial) {
    int T = 1 + trial * 7, E = 1 + trial % 9, k = 1 + trial % std::min(E, 4);
    float cf = trial % 3 == 0 ? 0.0f : 0.3f + 0.2f * (trial % 5);
    int min_cap = trial % 2 ? 1 : 4;
    IVec idx = random_topk(T, k, E, 100 + trial);
    DispatchLayout l = build_dispatch_layout(idx.data(), T, k, E, cf, min_cap);
    PaddedLayout pl = build_padded_layout(idx.data(), T, k, E, cf > 0 ? cf : 1.0f, min_cap);
    int C = cf > 0 ? expert_capacity(T, k, E, cf, min_cap) : T * k;
    // Naive: for each expert, scan all pairs in order, keep the first C.
    IVec slot_of_row, counts(E, 0), row_of_slot(T * k, -1);
    for (int e = 0; e < E; ++e) {
      for (int p = 0; p < T * k; ++p) {
        if (idx[p] == e && counts[e] < C) {
          row_of_slot[p] = static_cast<int32_t>(slot_of_row.size());
          slot_of_row.push_back(p);
          ++counts[e];
        }
      }
    }
    EXPECT_EQ(to_vec(l.slot_of_row_R), slot_of_row) << "trial " << trial;
    EXPECT_EQ(to_vec(l.row_of_slot_TK), row_of_slot) << "trial " << trial;
    EXPECT_EQ(to_vec(l.num_tokens_per_expert_E), counts) << "trial " << trial;
    EXPECT_EQ(l.num_dropped, T * k - static_cast<int>(slot_of_row.size()));
    for (int e = 0; e < E; ++e) EXPECT_EQ(l.offsets_E1[e + 1] - l.offsets_E1[e], counts[e]);
    // Padded: same kept pairs, at e·C + (rank within expert).
    int Cp = pl.C;
    IVec fill(E, 0);
    for (int p = 0; p < T * k; ++p) {
      int e = idx[p];
      int want = fill[e] < Cp ? e * Cp + fill[e]++ : -1;
      ASSERT_EQ(pl.pos_of_slot_TK[p], want) << "trial " << trial << " p " << p;
      if (want >= 0) {
        ASSERT_EQ(pl.slot_of_pos_EC[want], p);
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Dispatch / combine with identity experts

// Row of each pair, -1 = dropped.
IVec rows_of_pairs(const DispatchLayout& l) { return to_vec(l.row_of_slot_TK); }
IVec rows_of_pairs(const PaddedLayout& l) { return to_vec(l.pos_of_slot_TK); }

template <class Layout, class Fwd, class Bwd, class Cmb, class CmbBwd>
void check_identity_roundtrip(const Layout& l, size_t N, int T, int k, int H, Fwd gather,
                              Bwd gather_bwd, Cmb combine, CmbBwd combine_bwd) {
  Vec x = randn(static_cast<size_t>(T) * H, 1, 1.0f);
  Vec dout = randn(static_cast<size_t>(T) * H, 2, 1.0f);
  Vec w(static_cast<size_t>(T) * k, 1.0f / k);
  Vec rows(N * static_cast<size_t>(H), 7.0f);  // garbage: gather must write every row
  gather(rows.data(), x.data(), l, H);
  // identity experts: y_rows = x_rows
  Vec out(x.size(), 3.0f);
  combine(out.data(), rows.data(), w.data(), l, H, false);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(out[i], x[i], 1e-6) << i;
  // backward: combine' then identity' then gather'
  // combine' writes every row a pair owns and every dweight: garbage in those must not show;
  // padding rows are the caller's to zero.
  Vec drows(rows.size(), 0.0f), dw(w.size(), 5.0f), dx(x.size(), 0.0f);
  const IVec pair_row = rows_of_pairs(l);
  for (int p = 0; p < T * k; ++p) {
    const int32_t r = pair_row[p];
    if (r >= 0) std::fill_n(drows.begin() + static_cast<size_t>(r) * H, H, 9.0f);
  }
  combine_bwd(drows.data(), dw.data(), dout.data(), rows.data(), w.data(), l, H);
  gather_bwd(dx.data(), drows.data(), l, H);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(dx[i], dout[i], 1e-6) << i;
  for (int t = 0; t < T; ++t) {
    double d = 0;
    for (int i = 0; i < H; ++i) d += static_cast<double>(x[t * H + i]) * dout[t * H + i];
    for (int j = 0; j < k; ++j) ASSERT_NEAR(dw[t * k + j], d, 1e-4);
  }
}

TEST(MoeDispatch, IdentityExpertsRoundTripPaddingFree) {
  const int T = 37, k = 3, E = 5, H = 19;
  IVec idx = random_topk(T, k, E, 5);
  DispatchLayout l = build_dispatch_layout(idx.data(), T, k, E);
  check_identity_roundtrip(l, l.num_rows, T, k, H, gather_rows_forward, gather_rows_backward,
                           combine_forward, combine_backward);
}

TEST(MoeDispatch, IdentityExpertsRoundTripPadded) {
  const int T = 37, k = 3, E = 5, H = 19;
  IVec idx = random_topk(T, k, E, 5);
  PaddedLayout l = build_padded_layout(idx.data(), T, k, E, 100.0f);
  ASSERT_EQ(l.num_dropped, 0);
  ASSERT_GT(l.padding_rows(), 0u);
  check_identity_roundtrip(l, l.num_rows(), T, k, H, padded_dispatch_forward,
                           padded_gather_backward, padded_combine_forward,
                           padded_combine_backward);
  // Padding rows are zero after dispatch, even over a dirty buffer.
  Vec x = randn(static_cast<size_t>(T) * H, 1, 1.0f), buf(l.num_rows() * H, 5.0f);
  padded_dispatch_forward(buf.data(), x.data(), l, H);
  for (size_t pos = 0; pos < l.num_rows(); ++pos) {
    if (l.slot_of_pos_EC[pos] >= 0) continue;
    for (int i = 0; i < H; ++i) ASSERT_EQ(buf[pos * H + i], 0.0f);
  }
}

// ------------------------------------------------------------------------------------------------
// Router

// HF MoEGate, written out naively in double: softmax, top-k (stable by index), renorm, aux.
struct NaiveRouting {
  std::vector<double> scores;
  IVec idx;
  std::vector<double> weight;
  double aux = 0;
};
NaiveRouting naive_router(const Vec& x, const Vec& gate, int T, int H, const RouterConfig& c,
                          int B) {
  const int E = c.num_experts, k = c.top_k;
  NaiveRouting r;
  r.scores.resize(static_cast<size_t>(T) * E);
  for (int t = 0; t < T; ++t) {
    std::vector<double> lg(E);
    double m = -1e300, s = 0;
    for (int e = 0; e < E; ++e) {
      double v = 0;
      for (int i = 0; i < H; ++i) v += static_cast<double>(x[t * H + i]) * gate[e * H + i];
      lg[e] = v;
      m = std::max(m, v);
    }
    for (int e = 0; e < E; ++e) s += std::exp(lg[e] - m);
    for (int e = 0; e < E; ++e) r.scores[t * E + e] = std::exp(lg[e] - m) / s;
    IVec order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return r.scores[t * E + a] > r.scores[t * E + b]; });
    double denom = 1e-20;
    for (int j = 0; j < k; ++j) denom += r.scores[t * E + order[j]];
    for (int j = 0; j < k; ++j) {
      r.idx.push_back(order[j]);
      double w = r.scores[t * E + order[j]];
      r.weight.push_back(k > 1 && c.norm_topk_prob ? w / denom : w);
    }
  }
  if (c.aux_loss_alpha > 0) {
    if (!c.seq_aux) {  // ce = mean one-hot; Pi = mean scores; fi = ce·E; aux = alpha·sum Pi·fi
      std::vector<double> ce(E, 0), Pi(E, 0);
      for (int p = 0; p < T * k; ++p) ce[r.idx[p]] += 1.0 / (T * k);
      for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) Pi[e] += r.scores[t * E + e] / T;
      for (int e = 0; e < E; ++e) r.aux += Pi[e] * ce[e] * E;
    } else {  // ce[b,e] = count / (S·k/E); aux = mean_b sum_e ce·mean_t scores
      const int S = T / B;
      for (int b = 0; b < B; ++b) {
        std::vector<double> ce(E, 0), ms(E, 0);
        for (int t = b * S; t < (b + 1) * S; ++t) {
          for (int j = 0; j < k; ++j) ce[r.idx[t * k + j]] += 1.0;
          for (int e = 0; e < E; ++e) ms[e] += r.scores[t * E + e] / S;
        }
        for (int e = 0; e < E; ++e) r.aux += ce[e] / (S * k / static_cast<double>(E)) * ms[e] / B;
      }
    }
    r.aux *= c.aux_loss_alpha;
  }
  return r;
}

TEST(MoeRouter, MatchesNaiveHfMoEGate) {
  const int T = 12, H = 7, B = 3;
  for (int variant = 0; variant < 6; ++variant) {
    RouterConfig c;
    c.num_experts = 5;
    c.top_k = variant == 5 ? 1 : 3;
    c.norm_topk_prob = variant % 2 == 1;
    c.aux_loss_alpha = variant >= 2 ? 0.01f : 0.0f;
    c.seq_aux = variant >= 4;
    Vec x = randn(T * H, 11, 1.0f), gate = randn(c.num_experts * H, 12, 0.5f);
    Routing r;
    MemTracker tr;
    router_forward(r, x.data(), gate.data(), T, H, c, B, &tr);
    NaiveRouting n = naive_router(x, gate, T, H, c, B);
    for (size_t i = 0; i < n.scores.size(); ++i) ASSERT_NEAR(r.scores_TE[i], n.scores[i], 1e-6);
    EXPECT_EQ(to_vec(r.topk_idx_TK), n.idx) << "variant " << variant;
    for (size_t i = 0; i < n.weight.size(); ++i)
      ASSERT_NEAR(r.topk_weight_TK[i], n.weight[i], 1e-6);
    EXPECT_NEAR(r.aux_loss, n.aux, 1e-7 + 1e-5 * std::fabs(n.aux)) << "variant " << variant;
    EXPECT_EQ(tr.current(), r.scores_TE.bytes() + r.topk_idx_TK.bytes() +
                                r.topk_weight_TK.bytes() + r.aux_coef_BE.bytes());
  }
}

TEST(MoeRouter, TiesGoToTheLowerIndex) {
  RouterConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  Vec x = {1.0f}, gate = {0.5f, 1.0f, 1.0f, 1.0f};  // logits 0.5, 1, 1, 1
  Routing r;
  router_forward(r, x.data(), gate.data(), 1, 1, c, 1, nullptr);
  EXPECT_EQ(to_vec(r.topk_idx_TK), (IVec{1, 2}));
}

// L = sum_tj R_tj · topk_weight_tj + aux_grad · aux; router_backward against central differences.
TEST(MoeRouter, BackwardMatchesFiniteDifferences) {
  const int T = 8, H = 6, B = 2;
  for (int variant = 0; variant < 6; ++variant) {
    RouterConfig c;
    c.num_experts = 5;
    c.top_k = variant == 5 ? 1 : 2;
    c.norm_topk_prob = variant % 2 == 1;
    c.aux_loss_alpha = variant >= 2 ? 0.3f : 0.0f;
    c.seq_aux = variant >= 4;
    const float aux_grad = 1.7f;
    Vec x = randn(T * H, 21 + variant, 1.0f), gate = randn(c.num_experts * H, 22, 0.7f);
    Vec R = randn(T * c.top_k, 23, 1.0f);
    Routing base;
    router_forward(base, x.data(), gate.data(), T, H, c, B, nullptr);
    IVec base_idx = to_vec(base.topk_idx_TK);
    auto loss = [&](bool& same) {
      Routing r;
      router_forward(r, x.data(), gate.data(), T, H, c, B, nullptr);
      same = to_vec(r.topk_idx_TK) == base_idx;
      double L = aux_grad * r.aux_loss;
      for (size_t i = 0; i < R.size(); ++i) L += static_cast<double>(R[i]) * r.topk_weight_TK[i];
      return L;
    };
    Vec dx(x.size(), 0.0f), dgate(gate.size(), 0.0f);
    router_backward(dx.data(), dgate.data(), R.data(), aux_grad, base, x.data(), gate.data(), H,
                    c);
    int skipped = 0, checked = 0;
    for (auto [param, grad] : {std::pair{&x, &dx}, std::pair{&gate, &dgate}}) {
      for (size_t i = 0; i < param->size(); ++i) {
        const float eps = 2e-3f, v = (*param)[i];
        bool s1, s2;
        (*param)[i] = v + eps;
        double lp = loss(s1);
        (*param)[i] = v - eps;
        double lm = loss(s2);
        (*param)[i] = v;
        if (!s1 || !s2) {
          ++skipped;
          continue;
        }
        ++checked;
        double fd = (lp - lm) / (2.0 * eps);
        ASSERT_NEAR((*grad)[i], fd, 2e-3 + 2e-2 * std::fabs(fd))
            << "variant " << variant << " index " << i;
      }
    }
    EXPECT_LT(skipped, checked / 10) << "variant " << variant;
  }
}

// ------------------------------------------------------------------------------------------------
// The whole layer

struct Model {
  MoeConfig cfg;
  int T = 0, num_seqs = 1;
  Vec x, gate, eg, eu, ed, sg, su, sd;
  MoeWeights weights() const {
    return {gate.data(), {eg.data(), eu.data(), ed.data()}, {sg.data(), su.data(), sd.data()}};
  }
};

Model make_model(const MoeConfig& cfg, int T, int num_seqs, uint64_t seed, float gate_std = 0.7f,
                 float w_std = 0.4f) {
  Model m;
  m.cfg = cfg;
  m.T = T;
  m.num_seqs = num_seqs;
  const size_t H = cfg.hidden, F = cfg.ffn, E = cfg.num_experts, Fs = cfg.shared_ffn;
  m.x = randn(T * H, seed, 1.0f);
  m.gate = randn(E * H, seed + 1, gate_std);
  m.eg = randn(E * F * H, seed + 2, w_std);
  m.eu = randn(E * F * H, seed + 3, w_std);
  m.ed = randn(E * H * F, seed + 4, w_std);
  m.sg = randn(Fs * H, seed + 5, w_std);
  m.su = randn(Fs * H, seed + 6, w_std);
  m.sd = randn(H * Fs, seed + 7, w_std);
  return m;
}

struct Grads {
  Vec dx, dgate, deg, deu, ded, dsg, dsu, dsd;
  explicit Grads(const Model& m)
      : dx(m.x.size()), dgate(m.gate.size()), deg(m.eg.size()), deu(m.eu.size()),
        ded(m.ed.size()), dsg(m.sg.size()), dsu(m.su.size()), dsd(m.sd.size()) {}
  MoeGrads view() {
    return {dgate.data(), {deg.data(), deu.data(), ded.data()}, {dsg.data(), dsu.data(), dsd.data()}};
  }
};

struct RunResult {
  Vec y;
  double aux = 0;
  IVec idx;
};

RunResult run_forward(const Model& m, MoeActivations& act, MemTracker* tr = nullptr) {
  RunResult r;
  r.y.assign(m.x.size(), 123.0f);  // forward must overwrite y, not add to it
  moe_forward(r.y.data(), act, m.x.data(), m.weights(), m.cfg, m.T, m.num_seqs, tr);
  r.aux = act.aux_loss;
  r.idx = to_vec(act.routing.topk_idx_TK);
  return r;
}

// Forward + backward with upstream dy and aux_grad; returns outputs and all gradients.
std::pair<RunResult, Grads> run_both(const Model& m, const Vec& dy, float aux_grad) {
  MoeActivations act;
  RunResult r = run_forward(m, act);
  Grads g(m);
  MoeGrads gv = g.view();
  moe_backward(g.dx.data(), gv, dy.data(), aux_grad, act, m.x.data(), m.weights(), m.cfg, m.T,
               m.num_seqs);
  return {r, g};
}

MoeConfig tiny_config(int E, int k, int shared_ffn) {
  MoeConfig c;
  c.hidden = 8;
  c.ffn = 6;
  c.num_experts = E;
  c.top_k = k;
  c.shared_ffn = shared_ffn;
  return c;
}

// Naive per-token reference: y_t = sum_j w_tj · expert_{e_tj}(x_t) + shared(x_t), in double.
Vec naive_moe(const Model& m, const IVec& idx, const Vec& w, const IVec& row_kept) {
  const int H = m.cfg.hidden, F = m.cfg.ffn, k = m.cfg.top_k, Fs = m.cfg.shared_ffn;
  auto mlp = [&](const float* x, const float* G, const float* U, const float* D, int f,
                 std::vector<double>& out, double scale) {
    std::vector<double> h(f);
    for (int i = 0; i < f; ++i) {
      double g = 0, u = 0;
      for (int c = 0; c < H; ++c) {
        g += static_cast<double>(G[i * H + c]) * x[c];
        u += static_cast<double>(U[i * H + c]) * x[c];
      }
      h[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int c = 0; c < H; ++c) {
      double s = 0;
      for (int i = 0; i < f; ++i) s += static_cast<double>(D[c * f + i]) * h[i];
      out[c] += scale * s;
    }
  };
  Vec y(m.x.size());
  for (int t = 0; t < m.T; ++t) {
    std::vector<double> acc(H, 0.0);
    const float* xt = m.x.data() + static_cast<size_t>(t) * H;
    for (int j = 0; j < k; ++j) {
      if (!row_kept[t * k + j]) continue;
      size_t e = idx[t * k + j], fh = static_cast<size_t>(F) * H;
      mlp(xt, m.eg.data() + e * fh, m.eu.data() + e * fh, m.ed.data() + e * fh, F, acc,
          w[t * k + j]);
    }
    if (Fs > 0) mlp(xt, m.sg.data(), m.su.data(), m.sd.data(), Fs, acc, 1.0);
    for (int c = 0; c < H; ++c) y[t * H + c] = static_cast<float>(acc[c]);
  }
  return y;
}

TEST(MoeLayer, ForwardMatchesNaivePerTokenLoop) {
  for (int variant = 0; variant < 4; ++variant) {
    MoeConfig c = tiny_config(6, 3, variant % 2 ? 5 : 0);
    c.norm_topk_prob = true;
    c.padded = variant >= 2;
    c.capacity_factor = variant == 3 ? 0.5f : 0.0f;  // variant 3 drops pairs
    Model m = make_model(c, 24, 1, 31 + variant);
    MoeActivations act;
    MemTracker tr;
    RunResult r = run_forward(m, act, &tr);
    IVec kept(m.T * c.top_k, 1);
    const Buffer<int32_t>& pos = c.padded ? act.padded_layout.pos_of_slot_TK
                                          : act.layout.row_of_slot_TK;
    for (size_t p = 0; p < kept.size(); ++p) kept[p] = pos[p] >= 0;
    if (variant == 3) {
      EXPECT_GT(act.padded_layout.num_dropped, 0);
    }
    Vec ref = naive_moe(m, r.idx, to_vec(act.routing.topk_weight_TK), kept);
    EXPECT_LT(test_util::max_rel_err(r.y, ref), 1e-5) << "variant " << variant;
    // Every byte held for backward is charged to the tracker.
    size_t held = act.routing.scores_TE.bytes() + act.routing.topk_idx_TK.bytes() +
                  act.routing.topk_weight_TK.bytes() + act.routing.aux_coef_BE.bytes() +
                  act.layout.num_tokens_per_expert_E.bytes() + act.layout.offsets_E1.bytes() +
                  act.layout.slot_of_row_R.bytes() + act.layout.row_of_slot_TK.bytes() +
                  act.padded_layout.slot_of_pos_EC.bytes() +
                  act.padded_layout.pos_of_slot_TK.bytes() + act.padded_layout.offsets_E1.bytes() +
                  act.x_rows.bytes() + act.g.bytes() + act.u.bytes() + act.h.bytes() +
                  act.y_rows.bytes() + act.shared_g.bytes() + act.shared_u.bytes() +
                  act.shared_h.bytes();
    EXPECT_EQ(tr.current(), held);
  }
}

TEST(MoeLayer, OneExpertTopOneEqualsDenseMlp) {
  MoeConfig c = tiny_config(1, 1, 0);
  c.aux_loss_alpha = 0.1f;  // one expert: aux is a constant alpha·1, with zero gradient
  Model m = make_model(c, 10, 1, 41);
  const int T = m.T, H = c.hidden, F = c.ffn;
  Vec dy = randn(m.x.size(), 42, 1.0f);
  auto [r, g] = run_both(m, dy, 1.0f);
  EXPECT_NEAR(r.aux, 0.1, 1e-7);

  Vec y(m.x.size()), gg(T * F), uu(T * F), hh(T * F), scratch(2 * T * F);
  kernels::MlpWeights w{m.eg.data(), m.eu.data(), m.ed.data()};
  kernels::swiglu_mlp_forward(y.data(), gg.data(), uu.data(), hh.data(), m.x.data(), w, T, H, F);
  Vec dx(m.x.size()), dg(m.eg.size()), du(m.eu.size()), dd(m.ed.size());
  kernels::swiglu_mlp_backward(dx.data(), {dg.data(), du.data(), dd.data()}, dy.data(),
                               m.x.data(), gg.data(), uu.data(), hh.data(), w, T, H, F,
                               scratch.data());
  EXPECT_LT(test_util::max_rel_err(r.y, y), 1e-6);
  EXPECT_LT(test_util::max_rel_err(g.dx, dx), 1e-6);
  EXPECT_LT(test_util::max_rel_err(g.deg, dg), 1e-6);
  EXPECT_LT(test_util::max_rel_err(g.deu, du), 1e-6);
  EXPECT_LT(test_util::max_rel_err(g.ded, dd), 1e-6);
  for (float v : g.dgate) EXPECT_EQ(v, 0.0f);  // softmax over one expert has zero derivative
}

void expect_same(const std::pair<RunResult, Grads>& a, const std::pair<RunResult, Grads>& b,
                 double tol, const char* what) {
  EXPECT_EQ(a.first.idx, b.first.idx) << what;
  EXPECT_LT(test_util::max_rel_err(a.first.y, b.first.y), tol) << what << " y";
  EXPECT_NEAR(a.first.aux, b.first.aux, 1e-12) << what;
  const Grads &ga = a.second, &gb = b.second;
  EXPECT_LT(test_util::max_rel_err(ga.dx, gb.dx), tol) << what << " dx";
  EXPECT_LT(test_util::max_rel_err(ga.dgate, gb.dgate), tol) << what << " dgate";
  EXPECT_LT(test_util::max_rel_err(ga.deg, gb.deg), tol) << what << " d expert gate";
  EXPECT_LT(test_util::max_rel_err(ga.deu, gb.deu), tol) << what << " d expert up";
  EXPECT_LT(test_util::max_rel_err(ga.ded, gb.ded), tol) << what << " d expert down";
  EXPECT_LT(test_util::max_rel_err(ga.dsg, gb.dsg), tol) << what << " d shared gate";
  EXPECT_LT(test_util::max_rel_err(ga.dsu, gb.dsu), tol) << what << " d shared up";
  EXPECT_LT(test_util::max_rel_err(ga.dsd, gb.dsd), tol) << what << " d shared down";
}

TEST(MoeLayer, PaddedAgreesWithPaddingFree) {
  for (float cf : {100.0f, 0.5f}) {
    MoeConfig c = tiny_config(4, 2, 5);
    c.norm_topk_prob = true;
    c.aux_loss_alpha = 0.05f;
    c.capacity_factor = cf;
    Model m = make_model(c, 32, 2, 51);
    Vec dy = randn(m.x.size(), 52, 1.0f);
    auto pft = run_both(m, dy, 1.0f);
    m.cfg.padded = true;
    auto pad = run_both(m, dy, 1.0f);
    MoeActivations act;
    run_forward(m, act);
    if (cf < 1.0f) {
      EXPECT_GT(act.padded_layout.num_dropped, 0);
    } else {
      EXPECT_EQ(act.padded_layout.num_dropped, 0);
    }
    EXPECT_EQ(act.padded_layout.num_dropped, act.layout.num_dropped);
    expect_same(pft, pad, 1e-5, cf < 1.0f ? "with drops" : "dropless");
  }
}

TEST(MoeLayer, ReusedActivationsGiveTheSameResult) {
  // A second forward into the same MoeActivations (buffers reused, not re-zeroed) must equal a
  // fresh one, for both layouts (padding rows must be re-zeroed by dispatch).
  for (bool padded : {false, true}) {
    MoeConfig c = tiny_config(4, 2, 0);
    c.padded = padded;
    c.capacity_factor = 2.0f;
    Model a = make_model(c, 16, 1, 61), b = make_model(c, 16, 1, 62);
    MoeActivations act;
    run_forward(a, act);
    RunResult reused = run_forward(b, act);
    MoeActivations fresh_act;
    RunResult fresh = run_forward(b, fresh_act);
    EXPECT_EQ(reused.y, fresh.y) << "padded=" << padded;
  }
}

// Central differences of L = sum(y · R) + aux_grad · aux w.r.t. every input and parameter.
void check_layer_gradients(const MoeConfig& cfg, int T, int num_seqs, uint64_t seed,
                           const char* what) {
  Model m = make_model(cfg, T, num_seqs, seed);
  Vec R = randn(m.x.size(), seed + 100, 1.0f);
  const float aux_grad = 1.3f;
  auto [base, g] = run_both(m, R, aux_grad);
  auto loss = [&](bool& same) {
    MoeActivations act;
    RunResult r = run_forward(m, act);
    same = r.idx == base.idx;
    double L = aux_grad * r.aux;
    for (size_t i = 0; i < R.size(); ++i) L += static_cast<double>(R[i]) * r.y[i];
    return L;
  };
  struct Param {
    const char* name;
    Vec* p;
    const Vec* g;
  };
  // clang-format off
  const Param params[] = {{"x", &m.x, &g.dx},           {"router", &m.gate, &g.dgate},
                          {"expert gate", &m.eg, &g.deg}, {"expert up", &m.eu, &g.deu},
                          {"expert down", &m.ed, &g.ded}, {"shared gate", &m.sg, &g.dsg},
                          {"shared up", &m.su, &g.dsu},   {"shared down", &m.sd, &g.dsd}};
  // clang-format on
  int skipped = 0, checked = 0;
  for (const Param& prm : params) {
    for (size_t i = 0; i < prm.p->size(); ++i) {
      const float eps = 1e-2f, v = (*prm.p)[i];
      bool s1, s2;
      (*prm.p)[i] = v + eps;
      double lp = loss(s1);
      (*prm.p)[i] = v - eps;
      double lm = loss(s2);
      (*prm.p)[i] = v;
      if (!s1 || !s2) {  // a top-k choice flipped: not differentiable there
        ++skipped;
        continue;
      }
      ++checked;
      double fd = (lp - lm) / (2.0 * eps);
      ASSERT_NEAR((*prm.g)[i], fd, 3e-3 + 1e-2 * std::fabs(fd))
          << what << ": d " << prm.name << "[" << i << "]";
    }
  }
  EXPECT_LT(skipped, checked / 20) << what;
}

TEST(MoeLayer, GradientsMatchFiniteDifferences) {
  struct Case {
    const char* what;
    bool norm, seq_aux, padded;
    float alpha, cf;
    int k;
  };
  const Case cases[] = {
      {"plain, no aux", false, false, false, 0.0f, 0.0f, 2},
      {"norm_topk_prob", true, false, false, 0.0f, 0.0f, 2},
      {"aux per batch", false, false, false, 0.2f, 0.0f, 2},
      {"aux per batch + norm", true, false, false, 0.2f, 0.0f, 2},
      {"seq_aux", false, true, false, 0.2f, 0.0f, 2},
      {"seq_aux + norm", true, true, false, 0.2f, 0.0f, 3},
      {"top-1 + aux", false, false, false, 0.2f, 0.0f, 1},
      {"capacity drops + aux", true, false, false, 0.2f, 0.5f, 2},
      {"padded with drops + seq_aux", true, true, true, 0.2f, 0.5f, 2},
  };
  for (const Case& cs : cases) {
    MoeConfig c = tiny_config(4, cs.k, 5);
    c.norm_topk_prob = cs.norm;
    c.seq_aux = cs.seq_aux;
    c.padded = cs.padded;
    c.aux_loss_alpha = cs.alpha;
    c.capacity_factor = cs.cf;
    check_layer_gradients(c, 16, 2, 71, cs.what);
  }
}

TEST(MoeLayer, RejectsBadConfig) {
  MoeConfig c = tiny_config(4, 5, 0);  // k > E
  Model m = make_model(tiny_config(4, 2, 0), 4, 1, 81);
  MoeActivations act;
  Vec y(m.x.size());
  EXPECT_THROW(moe_forward(y.data(), act, m.x.data(), m.weights(), c, 4, 1, nullptr), moe::Error);
  c = tiny_config(4, 2, 0);
  c.aux_loss_alpha = 0.1f;
  c.seq_aux = true;
  EXPECT_THROW(moe_forward(y.data(), act, m.x.data(), m.weights(), c, 4, 3, nullptr), moe::Error);
}

// The per-step breakdown (bench moe-layer --breakdown): recording changes no result, the steps
// add up to the layer's wall time (nothing big goes untimed), the expert parts sit inside their
// steps, and a layer whose config names no recorder records nothing.
TEST(MoeStepTimes, BreakdownAddsUpAndRecordsOnlyWhenNamed) {
  MoeConfig c = tiny_config(4, 2, 48);
  c.hidden = 64;
  c.ffn = 96;
  const Model m = make_model(c, 512, 1, 91, 0.7f, 0.05f);
  const Vec dy = randn(m.x.size(), 92, 1.0f);
  const std::pair<RunResult, Grads> plain = run_both(m, dy, 1.0f);

  MoeStepTimes times;
  Model recorded = make_model(c, 512, 1, 91, 0.7f, 0.05f);  // the same layer, recording
  recorded.cfg.step_times = &times;
  const auto t0 = std::chrono::steady_clock::now();
  const std::pair<RunResult, Grads> timed = run_both(recorded, dy, 1.0f);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The expert parts' recorder was installed on the execution context only inside the layer.
  EXPECT_EQ(kernels::current_context().mlp_step_times(), nullptr);
  EXPECT_EQ(timed.first.y, plain.first.y);
  EXPECT_EQ(timed.second.dx, plain.second.dx);
  EXPECT_EQ(timed.second.deg, plain.second.deg);

  const kernels::MlpStepTimes& p = times.expert_parts;
  for (double part : {p.gate_up, p.down, p.down_bwd, p.gate_up_bwd, times.route, times.experts,
                      times.shared, times.experts_bwd, times.shared_bwd})
    EXPECT_GT(part, 0.0);
  EXPECT_LE(p.gate_up + p.swiglu + p.down, times.experts);
  EXPECT_LE(p.down_bwd + p.swiglu_bwd + p.gate_up_bwd, times.experts_bwd);
  const double steps = times.forward() + times.backward();
  EXPECT_LE(steps, wall);
  EXPECT_GT(steps, 0.5 * wall) << "more than half of the layer's time is in no step";

  const MoeStepTimes before = times;
  run_both(m, dy, 1.0f);
  EXPECT_EQ(times.forward() + times.backward(), before.forward() + before.backward());
  EXPECT_EQ(times.expert_parts.gemm(), before.expert_parts.gemm());
}

}  // namespace
