// Aux-loss-free balancing (DeepSeek-V3, topk_method noaux_tc): the sigmoid router with its
// selection bias against a naive loop, its backward against central differences, the bias update,
// the bias state's checkpoint form, and the config's router fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/model.h"
#include "moe/router.h"
#include "train/checkpoint_manifest.h"
#include "train/score_bias.h"
#include "test_util.h"

namespace {

using namespace moe;
using namespace moe::mixture;
using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

// Each suite draws its tensors from its own stream of the seed.
Vec randn(size_t n, uint64_t seed, float stddev) { return test_util::randn(n, seed, 31, stddev); }
using test_util::to_vec;

using moe::test_util::error_of;

RouterConfig sigmoid_config(int variant, const float* bias) {
  RouterConfig c;
  c.num_experts = 6;
  c.top_k = variant == 3 ? 1 : 2;
  c.norm_topk_prob = variant % 2 == 1;
  c.sigmoid = true;
  c.score_bias_E = bias;
  c.routed_scaling_factor = 2.5f;
  c.aux_loss_alpha = variant >= 2 ? 0.3f : 0.0f;
  c.seq_aux = variant == 2;
  return c;
}

// DeepSeek-V3 MoEGate (noaux_tc), written out: s = sigmoid(x·W^T); the k largest of s + b
// (ties to the lower index); w = s of those, / (sum + 1e-20) if renormalised, times the scale;
// aux over s' = s / sum(s).
TEST(ScoreBiasRouter, MatchesNaiveV3Gate) {
  const int T = 10, H = 5, B = 2, E = 6;
  Vec bias = randn(E, 3, 0.3f);
  for (int variant = 0; variant < 4; ++variant) {
    RouterConfig c = sigmoid_config(variant, bias.data());
    const int k = c.top_k;
    Vec x = randn(T * H, 11 + variant, 1.0f), gate = randn(E * H, 12, 0.5f);
    Routing r;
    router_forward(r, x.data(), gate.data(), T, H, c, B, nullptr);
    double aux = 0.0;
    std::vector<std::vector<double>> count(B, std::vector<double>(E)), mean_s(B, std::vector<double>(E));
    const int S = c.seq_aux ? T / B : T;
    for (int t = 0; t < T; ++t) {
      std::vector<double> s(E), choice(E);
      double z = 0.0;
      for (int e = 0; e < E; ++e) {
        double l = 0.0;
        for (int h = 0; h < H; ++h) l += static_cast<double>(x[t * H + h]) * gate[e * H + h];
        s[e] = 1.0 / (1.0 + std::exp(-l));
        choice[e] = s[e] + bias[e];
        z += s[e];
        ASSERT_NEAR(r.scores_TE[t * E + e], s[e], 1e-6);
      }
      IVec order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
      double denom = 1e-20;
      for (int j = 0; j < k; ++j) denom += s[order[j]];
      const int b = c.seq_aux ? t / S : 0;
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(r.topk_idx_TK[t * k + j], order[j]) << "variant " << variant << " token " << t;
        const double w = (c.norm_topk_prob && k > 1 ? s[order[j]] / denom : s[order[j]]) * 2.5;
        ASSERT_NEAR(r.topk_weight_TK[t * k + j], w, 1e-5);
        count[b][order[j]] += 1.0;
      }
      for (int e = 0; e < E; ++e) mean_s[b][e] += s[e] / z / S;
    }
    if (c.aux_loss_alpha > 0) {
      const int nb = c.seq_aux ? B : 1;
      for (int b = 0; b < nb; ++b)
        for (int e = 0; e < E; ++e) aux += count[b][e] * E / (S * k) * mean_s[b][e] / nb;
      aux *= c.aux_loss_alpha;
    }
    EXPECT_NEAR(r.aux_loss, aux, 1e-7 + 1e-5 * aux) << "variant " << variant;
  }
}

// The bias chooses, and only chooses: a bias that makes expert 4 everyone's first choice changes
// the experts, not the weights of the experts chosen either way.
TEST(ScoreBiasRouter, BiasSelectsButNeverWeighs) {
  const int T = 6, H = 4, E = 6;
  Vec x = randn(T * H, 5, 1.0f), gate = randn(E * H, 6, 0.5f);
  Vec zero(E, 0.0f), push(E, 0.0f);
  push[4] = 10.0f;
  RouterConfig c0 = sigmoid_config(0, zero.data()), c1 = sigmoid_config(0, push.data());
  Routing r0, r1;
  router_forward(r0, x.data(), gate.data(), T, H, c0, 1, nullptr);
  router_forward(r1, x.data(), gate.data(), T, H, c1, 1, nullptr);
  EXPECT_EQ(to_vec(r0.scores_TE), to_vec(r1.scores_TE));
  for (int t = 0; t < T; ++t) {
    EXPECT_EQ(r1.topk_idx_TK[t * 2], 4);
    EXPECT_FLOAT_EQ(r1.topk_weight_TK[t * 2], 2.5f * r1.scores_TE[t * E + 4]);
  }
  // A bias with softmax scoring is refused (it would silently do nothing in HF).
  RouterConfig bad = c1;
  bad.sigmoid = false;
  EXPECT_NE(error_of([&] { router_forward(r0, x.data(), gate.data(), T, H, bad, 1, nullptr); })
                .find("needs sigmoid scoring"),
            std::string::npos);
}

// L = sum_tj R_tj · topk_weight_tj + aux_grad · aux; router_backward against central differences
// (the bias gets no gradient: it is not an input of the loss but through the discrete choice).
TEST(ScoreBiasRouter, BackwardMatchesFiniteDifferences) {
  const int T = 8, H = 6, B = 2, E = 6;
  Vec bias = randn(E, 4, 0.2f);
  for (int variant = 0; variant < 4; ++variant) {
    RouterConfig c = sigmoid_config(variant, bias.data());
    const float aux_grad = 1.7f;
    Vec x = randn(T * H, 21 + variant, 1.0f), gate = randn(E * H, 22, 0.7f);
    Vec R = randn(T * c.top_k, 23, 1.0f);
    Routing base;
    router_forward(base, x.data(), gate.data(), T, H, c, B, nullptr);
    const IVec base_idx = to_vec(base.topk_idx_TK);
    auto loss = [&](bool& same) {
      Routing r;
      router_forward(r, x.data(), gate.data(), T, H, c, B, nullptr);
      same = to_vec(r.topk_idx_TK) == base_idx;
      double L = aux_grad * r.aux_loss;
      for (size_t i = 0; i < R.size(); ++i) L += static_cast<double>(R[i]) * r.topk_weight_TK[i];
      return L;
    };
    Vec dx(x.size(), 0.0f), dgate(gate.size(), 0.0f);
    router_backward(dx.data(), dgate.data(), R.data(), aux_grad, base, x.data(), gate.data(), H, c);
    int skipped = 0, checked = 0;
    for (auto [param, grad] : {std::pair{&x, &dx}, std::pair{&gate, &dgate}}) {
      for (size_t i = 0; i < param->size(); ++i) {
        const float eps = 2e-3f, v = (*param)[i];
        bool s1, s2;
        (*param)[i] = v + eps;
        const double lp = loss(s1);
        (*param)[i] = v - eps;
        const double lm = loss(s2);
        (*param)[i] = v;
        if (!s1 || !s2) {
          ++skipped;
          continue;
        }
        ++checked;
        const double fd = (lp - lm) / (2.0 * eps);
        ASSERT_NEAR((*grad)[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "variant " << variant << " index " << i;
      }
    }
    EXPECT_LT(skipped, checked / 10) << "variant " << variant;
  }
}

TEST(ScoreBiasUpdate, SignOfMeanMinusLoad) {
  // mean 2: expert 0 over (down), 1 under (up), 2 and 3 at the mean (unchanged).
  Vec b = {0.5f, -0.25f, 1.0f, 0.0f};
  const std::vector<int64_t> c = {3, 1, 2, 2};
  update_score_bias(b.data(), c.data(), 4, 0.125f);
  EXPECT_EQ(b, (Vec{0.375f, -0.125f, 1.0f, 0.0f}));
  // A mean that is not a whole number: sum 7 over 3 experts; 2 < 7/3 < 3.
  Vec b3 = {0.0f, 0.0f, 0.0f};
  const std::vector<int64_t> c3 = {2, 3, 2};
  update_score_bias(b3.data(), c3.data(), 3, 1e-3f);
  EXPECT_EQ(b3, (Vec{1e-3f, -1e-3f, 1e-3f}));
  const std::vector<int64_t> neg = {1, -1, 0};
  EXPECT_NE(error_of([&] { update_score_bias(b3.data(), neg.data(), 3, 1e-3f); }).find("negative load -1"),
            std::string::npos);
}

TEST(ScoreBiasState, CheckpointFormIsExactAndCheckedOnLoad) {
  const model::ModelConfig cfg = model::preset("test-moe-noaux");  // MoE layers 1 and 2, E = 8
  train::ScoreBias s(cfg, std::nullopt);
  ASSERT_TRUE(s.active());
  EXPECT_EQ(s.rate(), 0.01f);
  // Loads that move every expert, many times: values no short decimal writes exactly.
  std::vector<int64_t> loads(2 * 8);
  for (int step = 0; step < 37; ++step) {
    for (size_t i = 0; i < loads.size(); ++i) loads[i] = static_cast<int64_t>((i * 7 + step * 3) % 11);
    s.update(loads);
  }
  const nlohmann::json j = nlohmann::json::parse(s.to_json().dump());  // through text, as on disk
  train::ScoreBias back(cfg, 0.5f);
  back.load_json(j, "m.json: field \"router_bias\"");
  for (int i = 0; i < 2; ++i)
    for (int e = 0; e < 8; ++e) EXPECT_EQ(back.layer(i)[e], s.layer(i)[e]);
  // The model takes them (its MoE layers 1 and 2).
  model::Model m(cfg);
  back.apply(m);
  EXPECT_EQ(m.score_bias(2), Vec(back.layer(1), back.layer(1) + 8));

  const std::string where = "m.json: field \"router_bias\"";
  auto err = [&](auto mutate) {
    nlohmann::json bad = j;
    mutate(bad);
    return error_of([&] { train::ScoreBias(cfg, std::nullopt).load_json(bad, where); });
  };
  EXPECT_NE(err([](nlohmann::json& b) { b = nullptr; }).find(where + " must be an object"), std::string::npos);
  EXPECT_NE(err([](nlohmann::json& b) { b.erase("2"); }).find("has 1 layers, the model has 2"), std::string::npos);
  EXPECT_NE(err([](nlohmann::json& b) { b["7"] = b["2"]; b.erase("2"); }).find("no entry for MoE layer 2"),
            std::string::npos);
  EXPECT_NE(err([](nlohmann::json& b) { b["1"].erase(0); }).find("[\"1\"] must be an array of 8 numbers"),
            std::string::npos);
  EXPECT_NE(err([](nlohmann::json& b) { b["1"][3] = "x"; }).find("[\"1\"][3] = \"x\" is not a finite float"),
            std::string::npos);
  EXPECT_NE(err([](nlohmann::json& b) { b["1"][3] = 1e300; }).find("is not a finite float"), std::string::npos);

  // The flag: checked, and refused for a model without noaux_tc.
  EXPECT_NE(error_of([&] { train::ScoreBias(cfg, -1.0f); }).find("--balance.bias-rate must be a finite number >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { train::ScoreBias(model::preset("test-moe"), 1e-3f); })
                .find("topk_method \"greedy\""),
            std::string::npos);
  EXPECT_FALSE(train::ScoreBias(model::preset("test-moe"), std::nullopt).active());
}

// The manifest carries router_bias as given (checked against the model on resume); anything but
// an object or null is refused while parsing, naming the manifest and the field.
TEST(ScoreBiasState, ManifestFieldParsed) {
  // clang-format off
  nlohmann::json m = {{"format", train::kCheckpointFormat}, {"step", 2}, {"data_rng_state", "1"},
                      {"seed", "2"}, {"bad_steps", 0}, {"config", {{"hidden_size", 32}}},
                      {"tensors", {{"w", "shard-00000.safetensors"}}},
                      {"shards", {{"shard-00000.safetensors", {{"bytes", 100}, {"fnv1a64", "0123456789abcdef"}}}}}};
  // clang-format on
  EXPECT_TRUE(train::parse_manifest(m.dump(), "ck/manifest.json").meta.router_bias.is_null());
  m["router_bias"] = {{"1", {0.5, -0.25}}};
  EXPECT_EQ(train::parse_manifest(m.dump(), "ck/manifest.json").meta.router_bias, m["router_bias"]);
  m["router_bias"] = "zero";
  EXPECT_EQ(error_of([&] { train::parse_manifest(m.dump(), "ck/manifest.json"); }),
            "ck/manifest.json: field \"router_bias\" must be a JSON object {\"layer\": [E numbers]} or null");
}

TEST(ScoreBiasConfig, RouterFieldsReadWriteAndRefuse) {
  const model::ModelConfig c = model::preset("test-moe-noaux");
  const model::ModelConfig back = model::config_from_json(model::config_to_json(c), "c.json");
  EXPECT_EQ(back.scoring_func, "sigmoid");
  EXPECT_EQ(back.topk_method, "noaux_tc");
  EXPECT_EQ(back.routed_scaling_factor, 2.5f);
  EXPECT_EQ(back.bias_update_speed, 0.01f);
  auto err = [&](auto mutate) {
    nlohmann::json j = model::config_to_json(c);
    mutate(j);
    return error_of([&] { model::config_from_json(j, "c.json"); });
  };
  EXPECT_EQ(err([](nlohmann::json& j) { j["topk_method"] = "sparse_magic"; }),
            "c.json: topk_method \"sparse_magic\" is not supported (supported: greedy, group_limited_greedy, noaux_tc)");
  EXPECT_NE(err([](nlohmann::json& j) { j["scoring_func"] = "softmax"; })
                .find("scoring_func \"softmax\" is not supported with topk_method \"noaux_tc\""),
            std::string::npos);
  EXPECT_NE(err([](nlohmann::json& j) { j["routed_scaling_factor"] = 0; }).find("\"routed_scaling_factor\" must be positive"),
            std::string::npos);
  EXPECT_NE(err([](nlohmann::json& j) { j["bias_update_speed"] = -1; }).find("\"bias_update_speed\" must be >= 0"),
            std::string::npos);
}

}  // namespace
