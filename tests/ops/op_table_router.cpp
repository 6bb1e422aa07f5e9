// The op table's router kernels (op_table.h, kernels/router_ops.h): top-k selection with its
// scorings (softmax, sigmoid with a selection bias and a scale, group-limited), its backward with
// the aux-loss term, and the aux statistics. Top-k ids are compared exactly.
#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "kernels/element_math.h"
#include "kernels/router_ops.h"
#include "ops/op_table.h"
#ifdef MOETRAIN_OP_DEVICE
#include "ops/op_device.h"
#endif

namespace moe::ops {

using namespace moe::kernels;
using test_util::uniform;
using IVec = std::vector<int32_t>;

namespace {

bool is_sigmoid(Scoring s) {
  return s == Scoring::kSigmoidBias || s == Scoring::kGroupsSigmoidBias;
}
bool is_grouped(Scoring s) {
  return s == Scoring::kGroupsSoftmax || s == Scoring::kGroupsSigmoidBias;
}
// 4 groups, enough of them kept for k.
int kept_groups(int E, int k) {
  const int G = E / 4;
  return std::min(4, std::max(2, (k + G - 1) / G));
}

// One row of the router in double: scores (softmax, or sigmoid), the selection on score + bias,
// restricted to the topk_group best groups (a group's score its max, or its top-2 sum with
// sigmoid), ties to the lower index; weights = the unbiased scores of the chosen, renormalised,
// times the scale.
void ref_router_row(std::vector<double>& s, IVec& idx, std::vector<double>& w, const float* logits,
                    int E, int k, bool renorm, Scoring scoring, const float* bias, double scale) {
  const bool sig = is_sigmoid(scoring);
  s.assign(E, 0.0);
  double mx = -1e300, sum = 0.0;
  for (int e = 0; e < E; ++e) mx = std::max(mx, double(logits[e]));
  for (int e = 0; e < E; ++e) {
    s[e] = sig ? 1.0 / (1.0 + std::exp(-double(logits[e]))) : std::exp(logits[e] - mx);
    sum += s[e];
  }
  if (!sig)
    for (double& x : s) x /= sum;
  std::vector<double> sel(E);
  for (int e = 0; e < E; ++e) sel[e] = s[e] + (sig ? bias[e] : 0.0);
  std::vector<bool> allowed(E, true);
  if (is_grouped(scoring)) {
    const int n_group = 4, G = E / n_group, keep = kept_groups(E, k);
    std::vector<double> gscore(n_group);
    for (int g = 0; g < n_group; ++g) {
      std::vector<double> v(sel.begin() + g * G, sel.begin() + (g + 1) * G);
      std::sort(v.rbegin(), v.rend());
      gscore[g] = sig ? v[0] + v[1] : v[0];
    }
    std::vector<bool> kept(n_group, false);
    for (int n = 0; n < keep; ++n) {
      int best = -1;
      for (int g = 0; g < n_group; ++g)
        if (!kept[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
      kept[best] = true;
    }
    for (int e = 0; e < E; ++e) allowed[e] = kept[e / G];
  }
  idx.assign(k, -1);
  w.assign(k, 0.0);
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e)
      if (allowed[e] && (best < 0 || sel[e] > sel[best])) best = e;
    allowed[best] = false;
    idx[j] = best;
    w[j] = s[best];
  }
  if (renorm) {
    double denom = math::kRouterNormEps;
    for (double x : w) denom += x;
    for (double& x : w) x /= denom;
  }
  for (double& x : w) x *= scale;
}

}  // namespace

// Output [weights (T·k) | aux (1, with aux) | ids (T·k, exact)]. Forward ~ (5 + k)·E per token
// (scores, then k passes of the selection); backward ~ 4·E per token.
Op router_topk_op(int T, int E, int k, bool renorm, Scoring scoring, bool aux) {
  Op op;
  op.name = "router_topk";
  const bool sig = is_sigmoid(scoring), grouped = is_grouped(scoring);
  op.shape = str_cat("T=", T, " E=", E, " k=", k, renorm ? " renorm" : "",
                     sig ? " sigmoid+bias" : " softmax",
                     grouped ? str_cat(" n_group=4 topk_group=", kept_groups(E, k)) : "",
                     aux ? " aux" : "");
  op.fwd_flops = (5.0 + k) * T * E;
  op.bwd_flops = op.fwd_flops + 4.0 * T * E;
  const int B = T % 2 == 0 ? 2 : 1, S = T / B;
  Rng rng(140 + E);
  auto bias = std::make_shared<const Vec>(randn(rng, E, 0.5));
  auto coef = std::make_shared<const Vec>(randn(rng, size_t(B) * E));
  const float scale = sig ? 2.5f : 1.0f;
  const math::GroupLimit groups = grouped ? math::GroupLimit{4, kept_groups(E, k), sig}
                                          : math::GroupLimit{};
  auto scoring_of = [=]() {
    return math::RouterScoring{sig, sig ? bias->data() : nullptr, scale, groups};
  };
  const size_t TK = size_t(T) * k;
  // The kernel's forward; scores and ids kept for the backward.
  auto run = [=](const Vec& logits, Vec& s, IVec& idx, Vec& w) {
    s = logits;
    idx.assign(TK, -1);
    w.assign(TK, 0.0f);
    router_topk(s.data(), idx.data(), w.data(), T, E, k, renorm, scoring_of());
  };
  op.make_inputs = [=](Rng& r) { return Tensors{randn(r, size_t(T) * E, 2.0)}; };
  op.forward = [=](const Tensors& in) {
    Vec s, w;
    IVec idx;
    run(in[0], s, idx, w);
    Vec out = w;
    if (aux) {  // Σ_t Σ_e c[t/S, e]·s'[t, e], s' = s (softmax) or s / row_sum(s) (sigmoid)
      double a = 0.0;
      for (int t = 0; t < T; ++t) {
        const float* st = s.data() + size_t(t) * E;
        const double z = sig ? math::row_sum(st, E) : 1.0;
        for (int e = 0; e < E; ++e) a += double((*coef)[size_t(t / S) * E + e]) * st[e] / z;
      }
      out.push_back(static_cast<float>(a));
    }
    append(out, idx);
    return out;
  };
  op.reference = [=](const Tensors& in) {
    Vec w, ids;
    double a = 0.0;
    std::vector<double> s, wr;
    IVec idx;
    for (int t = 0; t < T; ++t) {
      ref_router_row(s, idx, wr, in[0].data() + size_t(t) * E, E, k, renorm, scoring,
                     bias->data(), scale);
      append(w, wr);
      append(ids, idx);
      double z = 0.0;
      for (double x : s) z += sig ? x : 0.0;
      for (int e = 0; e < E; ++e) a += (*coef)[size_t(t / S) * E + e] * (sig ? s[e] / z : s[e]);
    }
    if (aux) w.push_back(static_cast<float>(a));
    w.insert(w.end(), ids.begin(), ids.end());
    return w;
  };
  op.exact_tail = TK;
  // dL/dw from dout's first T·k, the aux term's factor dL/daux from the next (the ids have none).
  op.backward = [=](Tensors& d, const Tensors& in, const Vec& dout) {
    Vec s, w, dlogits(size_t(T) * E);
    IVec idx;
    run(in[0], s, idx, w);
    router_topk_backward(dlogits.data(), s.data(), idx.data(), dout.data(), T, E, k, renorm,
                         aux ? coef->data() : nullptr, S, aux ? dout[TK] : 0.0f, scoring_of());
    add_into(d[0], dlogits);
  };
  op.fd_h = 1e-3;
#ifdef MOETRAIN_OP_DEVICE
  if (scoring == Scoring::kSoftmax) {
    op.device.push_back({"router_topk", 1e-10, [=](Checker& c) {
                           Rng rng(100 + E);
                           Vec scores = randn(rng, size_t(T) * E, 2.0), w(TK);
                           IVec idx(w.size(), -1);
                           auto d_scores = dev(scores), d_w = dev(w);
                           auto d_idx = dev(idx);
                           router_topk(scores.data(), idx.data(), w.data(), T, E, k, renorm);
                           cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), T, E, k,
                                             renorm);
                           c.same("topk_idx", host(d_idx), idx);
                           c.close("scores", host(d_scores), scores);
                           c.close("weights", host(d_w), w);
                         }});
    for (bool with_aux : {false, true}) {
      op.device.push_back(
          {with_aux ? "router_topk_backward aux" : "router_topk_backward", 1e-10,
           [=](Checker& c) {
             Rng rng(110 + E);
             const int Bs = with_aux && T % 2 == 0 ? 2 : 1, S_len = T / Bs;
             Vec scores = randn(rng, size_t(T) * E, 2.0), w(TK);
             IVec idx(w.size());
             router_topk(scores.data(), idx.data(), w.data(), T, E, k, renorm);
             Vec dw = randn(rng, w.size()), cf = randn(rng, size_t(Bs) * E),
                 dlogits = randn(rng, scores.size());  // overwritten
             auto d_scores = dev(scores), d_dw = dev(dw), d_coef = dev(cf),
                  d_dlogits = dev(dlogits);
             auto d_idx = dev(idx);
             router_topk_backward(dlogits.data(), scores.data(), idx.data(), dw.data(), T, E, k,
                                  renorm, with_aux ? cf.data() : nullptr, S_len, 0.01f);
             cuda::router_topk_backward(d_dlogits.data(), d_scores.data(), d_idx.data(),
                                        d_dw.data(), T, E, k, renorm,
                                        with_aux ? d_coef.data() : nullptr, S_len, 0.01f);
             c.close("dlogits", host(d_dlogits), dlogits);
           }});
    }
  } else if (scoring == Scoring::kSigmoidBias) {
    // DeepSeek-V3 (noaux_tc): sigmoid scores, a selection bias on the device, a scale; its
    // backward with the normalised-score aux term; the aux statistics of s / sum(s).
    op.device.push_back(
        {"router_topk + aux_stats + backward", 1e-10, [=](Checker& c) {
           Rng rng(140 + E);
           Vec scores = randn(rng, size_t(T) * E, 2.0), w(TK), bs = randn(rng, E, 0.5);
           IVec idx(w.size(), -1);
           auto d_scores = dev(scores), d_w = dev(w), d_bias = dev(bs);
           auto d_idx = dev(idx);
           math::RouterScoring hs{true, bs.data(), 2.5f, {}}, ds{true, d_bias.data(), 2.5f, {}};
           router_topk(scores.data(), idx.data(), w.data(), T, E, k, renorm, hs);
           cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), T, E, k, renorm, ds);
           c.same("topk_idx", host(d_idx), idx);
           c.close("scores", host(d_scores), scores);
           c.close("weights", host(d_w), w);
           const size_t be = size_t(B) * E;
           std::vector<double> cnt(be), sum(be), d_cnt(be), d_sum(be);
           router_aux_stats(cnt.data(), sum.data(), idx.data(), scores.data(), T, E, k, B,
                            /*normalise=*/true);
           cuda::router_aux_stats(d_cnt.data(), d_sum.data(), d_idx.data(), d_scores.data(), T, E,
                                  k, B, /*normalise=*/true);
           c.same("count", d_cnt, cnt);
           // expf differs between the devices in the last bit: close, not the same bits.
           c.close("score_sum normalised", Vec(d_sum.begin(), d_sum.end()),
                   Vec(sum.begin(), sum.end()));
           Vec dw = randn(rng, w.size()), cf = randn(rng, be), dlogits(scores.size());
           auto d_dw = dev(dw), d_coef = dev(cf), d_dlogits = dev(dlogits);
           router_topk_backward(dlogits.data(), scores.data(), idx.data(), dw.data(), T, E, k,
                                renorm, cf.data(), T / B, 0.01f, hs);
           cuda::router_topk_backward(d_dlogits.data(), d_scores.data(), d_idx.data(), d_dw.data(),
                                      T, E, k, renorm, d_coef.data(), T / B, 0.01f, ds);
           c.close("dlogits", host(d_dlogits), dlogits);
         }});
  } else {
    // Group-limited selection: softmax scores the groups by their max (DeepSeek-V2), sigmoid +
    // bias by their top-2 sum (V3).
    op.device.push_back(
        {"router_topk", 1e-10,
         [=](Checker& c) {
           Rng rng(150 + E + sig);
           Vec scores = randn(rng, size_t(T) * E, 2.0), w(TK), bs = randn(rng, E, 0.5);
           IVec idx(w.size(), -1);
           auto d_scores = dev(scores), d_w = dev(w), d_bias = dev(bs);
           auto d_idx = dev(idx);
           math::RouterScoring hs{sig, sig ? bs.data() : nullptr, scale, groups},
               ds{sig, sig ? d_bias.data() : nullptr, scale, groups};
           router_topk(scores.data(), idx.data(), w.data(), T, E, k, renorm, hs);
           cuda::router_topk(d_scores.data(), d_idx.data(), d_w.data(), T, E, k, renorm, ds);
           c.same("topk_idx", host(d_idx), idx);
           c.close("scores", host(d_scores), scores);
           c.close("weights", host(d_w), w);
         }});
  }
#endif
  return op;
}

// Output [score_sum (B·E) | count (B·E), exact], B = 2 sequences when T is even; the ids come
// from the router (renorm only changes how they were drawn on the device).
Op router_aux_stats_op(int T, int E, int k, bool renorm, bool normalise) {
  Op op;
  op.name = "router_aux_stats";
  op.shape = str_cat("T=", T, " E=", E, " k=", k, normalise ? " normalise" : "");
  const int B = T % 2 == 0 ? 2 : 1, S = T / B;
  const size_t be = size_t(B) * E;
  Rng rng(120 + E);
  auto idx = std::make_shared<const IVec>(topk_ids(rng, T, k, E, -1));
  op.fwd_flops = 2.0 * T * E;
  op.make_inputs = [=](Rng& r) { return Tensors{uniform(r, size_t(T) * E, 0.05, 1.0)}; };
  op.forward = [=](const Tensors& in) {
    std::vector<double> cnt(be, -1.0), sum(be, -1.0);
    router_aux_stats(cnt.data(), sum.data(), idx->data(), in[0].data(), T, E, k, B, normalise);
    Vec out;
    append(out, sum);
    append(out, cnt);
    return out;
  };
  op.reference = [=](const Tensors& in) {
    std::vector<double> cnt(be, 0.0), sum(be, 0.0);
    for (int t = 0; t < T; ++t) {
      const float* s = in[0].data() + size_t(t) * E;
      double z = 0.0;
      for (int e = 0; e < E; ++e) z += s[e];
      for (int e = 0; e < E; ++e) sum[size_t(t / S) * E + e] += normalise ? s[e] / z : s[e];
      for (int j = 0; j < k; ++j) cnt[size_t(t / S) * E + (*idx)[size_t(t) * k + j]] += 1.0;
    }
    Vec out;
    append(out, sum);
    append(out, cnt);
    return out;
  };
  op.exact_tail = be;
#ifdef MOETRAIN_OP_DEVICE
  // Same double sums in the same order: bit-identical.
  op.device = {{"router_aux_stats", 0.0, [=](Checker& c) {
                  Rng rng(120 + E);
                  Vec scores = randn(rng, size_t(T) * E, 2.0), w(size_t(T) * k);
                  IVec ids(w.size());
                  router_topk(scores.data(), ids.data(), w.data(), T, E, k, renorm);
                  auto d_scores = dev(scores);
                  auto d_idx = dev(ids);
                  std::vector<double> cnt(be), sum(be), d_cnt(be), d_sum(be);
                  router_aux_stats(cnt.data(), sum.data(), ids.data(), scores.data(), T, E, k, B,
                                   normalise);
                  cuda::router_aux_stats(d_cnt.data(), d_sum.data(), d_idx.data(),
                                         d_scores.data(), T, E, k, B, normalise);
                  c.same("count", d_cnt, cnt);
                  c.same("score_sum", d_sum, sum);
                }}};
#endif
  return op;
}

}  // namespace moe::ops
