// Group-limited (node-limited) routing: DeepSeek-V2's group_limited_greedy (softmax, a group
// scores its max) and V3's noaux_tc with n_group > 1 (sigmoid + bias, a group scores the sum of
// its top 2). The router's choice against a naive loop written here (sort the groups, keep the
// best topk_group, sort their experts), hand-worked cases, the "at most topk_group groups a token"
// property, the backward against finite differences, and the config checks and round trip.
// Legend: T tokens, H hidden, E experts, k slots, G experts per group.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/config.h"
#include "moe/router.h"
#include "plan/plan_model.h"

namespace {

using namespace moe;
using namespace moe::mixture;
using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

// Each suite draws its tensors from its own stream of the seed.
Vec randn(size_t n, uint64_t seed, float stddev) { return test_util::randn(n, seed, 29, stddev); }

using test_util::error_of;

// Indices [0, n) sorted by value descending, ties to the lower index.
IVec ranked(const std::vector<float>& value) {
  IVec order(value.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return value[a] > value[b]; });
  return order;
}

// The experts one token chooses from its scores s [E] (the router's own float scores, so the
// comparison can be exact): selection values v = s + bias; group score = the max of v in the group
// (softmax) or the sum of its two largest (sigmoid); keep the topk_group best groups; the k best
// experts of those. n_group = 1: plain top-k.
IVec naive_choice(const float* s, const float* bias, const RouterConfig& c) {
  const int E = c.num_experts, G = E / c.n_group;
  std::vector<float> v(E);
  for (int e = 0; e < E; ++e) v[e] = bias ? s[e] + bias[e] : s[e];
  std::vector<float> group_score(c.n_group);
  for (int g = 0; g < c.n_group; ++g) {
    std::vector<float> members(v.begin() + g * G, v.begin() + (g + 1) * G);
    std::sort(members.begin(), members.end(), std::greater<float>());
    group_score[g] = c.sigmoid ? members[0] + members[1] : members[0];
  }
  const IVec groups = ranked(group_score);
  std::vector<float> candidate(E, -INFINITY);
  for (int i = 0; i < c.topk_group; ++i)
    for (int e = groups[i] * G; e < (groups[i] + 1) * G; ++e) candidate[e] = v[e];
  IVec order = ranked(candidate);
  order.resize(c.top_k);
  return order;
}

RouterConfig group_config(bool sigmoid, int E, int k, int n_group, int topk_group,
                          const float* bias) {
  RouterConfig c;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.sigmoid = sigmoid;
  c.score_bias_E = sigmoid ? bias : nullptr;
  // The real models' combinations: V3 renormalises and scales by 2.5, V2 scales raw softmax
  // weights by 16.
  c.norm_topk_prob = sigmoid;
  c.routed_scaling_factor = sigmoid ? 2.5f : 16.0f;
  return c;
}

Routing route(const Vec& x, const Vec& gate, int T, int H, const RouterConfig& c) {
  Routing r;
  router_forward(r, x.data(), gate.data(), T, H, c, 1, nullptr);
  return r;
}

struct Shape {
  int E, k, n_group, topk_group;
};
const Shape kShapes[] = {{16, 4, 4, 2}, {16, 2, 8, 3}, {12, 3, 3, 1}, {32, 8, 8, 4}, {8, 4, 2, 1}};

TEST(RouterGroups, ChoiceMatchesNaiveLoopAndWeightsAreTheChosenScores) {
  const int T = 64, H = 8;
  int rerouted = 0;
  for (bool sigmoid : {false, true}) {
    for (const Shape& sh : kShapes) {
      const Vec x = randn(T * H, 1 + sh.E, 1.0f), gate = randn(sh.E * H, 2 + sh.k, 0.8f);
      const Vec bias = randn(sh.E, 3, 0.05f);
      const RouterConfig c = group_config(sigmoid, sh.E, sh.k, sh.n_group, sh.topk_group, bias.data());
      RouterConfig plain = c;
      plain.n_group = plain.topk_group = 1;
      const Routing r = route(x, gate, T, H, c), p = route(x, gate, T, H, plain);
      for (int t = 0; t < T; ++t) {
        const float* s = r.scores_TE.data() + t * sh.E;
        const IVec want = naive_choice(s, c.score_bias_E, c);
        const IVec got(r.topk_idx_TK.data() + t * sh.k, r.topk_idx_TK.data() + (t + 1) * sh.k);
        ASSERT_EQ(got, want) << (sigmoid ? "sigmoid" : "softmax") << " E=" << sh.E << " t=" << t;
        // Weights: the chosen unbiased scores, renormalised (V3), times the scale; unchanged by
        // groups.
        float denom = c.norm_topk_prob ? 1e-20f : 1.0f;
        for (int j = 0; j < sh.k && c.norm_topk_prob; ++j) denom += s[want[j]];
        for (int j = 0; j < sh.k; ++j)
          ASSERT_FLOAT_EQ(r.topk_weight_TK[t * sh.k + j], s[want[j]] / denom * c.routed_scaling_factor);
        const IVec free(p.topk_idx_TK.data() + t * sh.k, p.topk_idx_TK.data() + (t + 1) * sh.k);
        rerouted += std::set<int>(free.begin(), free.end()) != std::set<int>(got.begin(), got.end());
      }
    }
  }
  EXPECT_GT(rerouted, 50) << "the group limit must change some tokens' experts, or this tests nothing";
}

TEST(RouterGroups, ATokensExpertsFallInAtMostTopkGroupGroups) {
  const int T = 200, H = 6;
  for (bool sigmoid : {false, true}) {
    for (const Shape& sh : kShapes) {
      const Vec x = randn(T * H, 7, 1.5f), gate = randn(sh.E * H, 8, 1.0f), bias = randn(sh.E, 9, 0.1f);
      const RouterConfig c = group_config(sigmoid, sh.E, sh.k, sh.n_group, sh.topk_group, bias.data());
      const Routing r = route(x, gate, T, H, c);
      const int G = sh.E / sh.n_group;
      for (int t = 0; t < T; ++t) {
        std::set<int> groups, experts;
        for (int j = 0; j < sh.k; ++j) {
          groups.insert(r.topk_idx_TK[t * sh.k + j] / G);
          experts.insert(r.topk_idx_TK[t * sh.k + j]);
        }
        ASSERT_LE(static_cast<int>(groups.size()), sh.topk_group) << "t=" << t;
        ASSERT_EQ(static_cast<int>(experts.size()), sh.k) << "t=" << t;
      }
    }
  }
}

// Logits (3, -3, 1, 1), two groups of two, one kept, k = 2. Plain top-2 is {0, 2}. Softmax (V2):
// group 0 holds the max score, so {0, 1}. Sigmoid (V3): top-2 sums 0.953 + 0.047 = 1.0 against
// 0.731 + 0.731 = 1.46, so group 1: {2, 3}.
TEST(RouterGroups, HandWorkedV2AndV3GroupScores) {
  const Vec x = {1.0f}, gate = {3.0f, -3.0f, 1.0f, 1.0f};
  const Routing v2 = route(x, gate, 1, 1, group_config(false, 4, 2, 2, 1, nullptr));
  EXPECT_EQ(IVec(v2.topk_idx_TK.data(), v2.topk_idx_TK.data() + 2), (IVec{0, 1}));
  const Routing v3 = route(x, gate, 1, 1, group_config(true, 4, 2, 2, 1, nullptr));
  EXPECT_EQ(IVec(v3.topk_idx_TK.data(), v3.topk_idx_TK.data() + 2), (IVec{2, 3}));
  // The bias moves the group choice too: +0.5 on expert 1 lifts group 0's sum to 1.5 > 1.46, so
  // {0, 1} (plain top-2 of the biased values would be {0, 2}).
  const Vec bias = {0.0f, 0.5f, 0.0f, 0.0f};
  const Routing biased = route(x, gate, 1, 1, group_config(true, 4, 2, 2, 1, bias.data()));
  EXPECT_EQ(IVec(biased.topk_idx_TK.data(), biased.topk_idx_TK.data() + 2), (IVec{0, 1}));
}

TEST(RouterGroups, TiedGroupsGoToTheLowerGroup) {
  const Vec x = {1.0f}, gate = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};  // three equal groups of two
  for (bool sigmoid : {false, true}) {
    const Routing r = route(x, gate, 1, 1, group_config(sigmoid, 6, 3, 3, 2, nullptr));
    EXPECT_EQ(IVec(r.topk_idx_TK.data(), r.topk_idx_TK.data() + 3), (IVec{0, 1, 2}));
  }
}

// L = sum_tj R_tj · topk_weight_tj + aux; the backward against central differences (where the
// choice stays put), and experts outside the chosen ones get no gradient with sigmoid scores.
TEST(RouterGroups, BackwardMatchesFiniteDifferences) {
  const int T = 10, H = 5, E = 8, k = 2;
  for (bool sigmoid : {false, true}) {
    const Vec bias = randn(E, 31, 0.05f);
    RouterConfig c = group_config(sigmoid, E, k, 4, 2, bias.data());
    c.aux_loss_alpha = sigmoid ? 0.0f : 0.2f;
    Vec x = randn(T * H, 32, 1.0f), gate = randn(E * H, 33, 0.8f);
    const Vec R = randn(T * k, 34, 1.0f);
    const Routing base = route(x, gate, T, H, c);
    const IVec base_idx(base.topk_idx_TK.data(), base.topk_idx_TK.data() + T * k);
    auto loss = [&](bool& same) {
      const Routing r = route(x, gate, T, H, c);
      same = IVec(r.topk_idx_TK.data(), r.topk_idx_TK.data() + T * k) == base_idx;
      double L = r.aux_loss;
      for (size_t i = 0; i < R.size(); ++i) L += static_cast<double>(R[i]) * r.topk_weight_TK[i];
      return L;
    };
    Vec dx(x.size(), 0.0f), dgate(gate.size(), 0.0f);
    router_backward(dx.data(), dgate.data(), R.data(), 1.0f, base, x.data(), gate.data(), H, c);
    int checked = 0;
    for (auto [param, grad] : {std::pair{&x, &dx}, std::pair{&gate, &dgate}}) {
      for (size_t i = 0; i < param->size(); ++i) {
        const float eps = 2e-3f, v = (*param)[i];
        bool s1, s2;
        (*param)[i] = v + eps;
        const double lp = loss(s1);
        (*param)[i] = v - eps;
        const double lm = loss(s2);
        (*param)[i] = v;
        if (!s1 || !s2) continue;
        ++checked;
        const double fd = (lp - lm) / (2.0 * eps);
        ASSERT_NEAR((*grad)[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "i=" << i;
      }
    }
    EXPECT_GT(checked, static_cast<int>(x.size() + gate.size()) / 2);
    if (sigmoid) {
      // d gate row e = sum_t dlogit[t,e] · x_t: zero for an expert no token chose.
      std::set<int> chosen(base_idx.begin(), base_idx.end());
      for (int e = 0; e < E; ++e) {
        if (chosen.count(e)) continue;
        for (int i = 0; i < H; ++i) EXPECT_EQ(dgate[e * H + i], 0.0f) << "expert " << e;
      }
    }
  }
}

TEST(RouterGroups, RouterRejectsGroupsThatCannotHoldK) {
  const Vec x = {1.0f}, gate(8, 1.0f);
  auto err = [&](int n_group, int topk_group, int k) {
    return error_of([&] { route(x, gate, 1, 1, group_config(false, 8, k, n_group, topk_group, nullptr)); });
  };
  EXPECT_NE(err(3, 1, 2).find("n_group=3 must divide num_experts=8"), std::string::npos);
  EXPECT_NE(err(4, 5, 2).find("topk_group=5 must be in [1, n_group=4]"), std::string::npos);
  EXPECT_NE(err(4, 1, 3).find("topk_group=1 groups of 2 experts cannot hold top_k=3"), std::string::npos);
}

// ---- Config ----

nlohmann::json group_json() {
  nlohmann::json j = model::config_to_json(model::preset("test-moe-group"));
  return j;
}
std::string config_error(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = group_json();
  edit(j);
  return error_of([&] { model::config_from_json(j, "c.json"); });
}

TEST(RouterGroups, ConfigReadsWritesAndRoundTripsTheGroupFields) {
  const model::ModelConfig c = model::preset("test-moe-group");
  EXPECT_EQ(c.n_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  const nlohmann::json j = model::config_to_json(c);
  EXPECT_EQ(j.at("n_group"), 4);
  EXPECT_EQ(j.at("topk_group"), 2);
  const model::ModelConfig back = model::config_from_json(j, "c.json");
  EXPECT_EQ(back.n_group, 4);
  EXPECT_EQ(back.topk_group, 2);
  EXPECT_EQ(model::config_to_json(back), j);
  const model::ModelConfig v2 = model::preset("test-moe-v2group");
  EXPECT_EQ(model::config_from_json(model::config_to_json(v2), "c.json").topk_method,
            "group_limited_greedy");
  // Defaults stay out of the file: a config (and a checkpoint manifest) from before is unchanged.
  EXPECT_FALSE(model::config_to_json(model::preset("test-moe")).contains("n_group"));
  EXPECT_FALSE(model::config_to_json(model::preset("test-moe")).contains("topk_group"));
}

TEST(RouterGroups, ConfigRejectsBadGroupsWithOneLineNamingTheValue) {
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["topk_group"] = 5; }),
            "c.json: topk_group (5) exceeds n_group (4)");
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["n_group"] = 3; j["topk_group"] = 1; }),
            "c.json: n_group (3) does not divide n_routed_experts (16)");
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["topk_group"] = 0; }),
            "c.json: \"topk_group\" must be >= 1, got 0");
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["n_group"] = 0; }),
            "c.json: \"n_group\" must be >= 1, got 0");
  EXPECT_EQ(config_error([](nlohmann::json& j) {
              j["scoring_func"] = "softmax";
              j["topk_method"] = "greedy";
            }),
            "c.json: n_group = 4 needs topk_method \"group_limited_greedy\" (softmax) or "
            "\"noaux_tc\" (sigmoid); \"greedy\" ignores groups");
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["topk_group"] = 1; j["num_experts_per_tok"] = 5; }),
            "c.json: topk_group (1) * n_routed_experts / n_group (4) = 4 experts cannot hold "
            "num_experts_per_tok (5)");
  EXPECT_EQ(config_error([](nlohmann::json& j) { j["n_group"] = 16; j["topk_group"] = 4; }),
            "c.json: n_group (16) leaves 1 expert per group, but noaux_tc scores a group by its top "
            "2 experts");
  // DeepSeek-V2's 1-expert groups are fine: a group's max needs one expert.
  EXPECT_EQ(config_error([](nlohmann::json& j) {
              j["scoring_func"] = "softmax";
              j["topk_method"] = "group_limited_greedy";
              j["n_group"] = 16;
              j["topk_group"] = 4;
            }),
            "");
}

// DeepSeek-V3's router fields (n_group 8, topk_group 4, noaux_tc) read for training
// (model_type deepseek) and still read by the planner (model_type deepseek_v3, its own reader).
TEST(RouterGroups, DeepSeekV3RouterFieldsAreReadAndThePlannerStillReadsV3) {
  nlohmann::json j = group_json();
  j["n_routed_experts"] = 256;
  j["num_experts_per_tok"] = 8;
  j["n_group"] = 8;
  j["topk_group"] = 4;
  const model::ModelConfig c = model::config_from_json(j, "v3router.json");
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  const std::string path = moe::test_util::scratch_path("groups", "v3.json").string();
  // clang-format off
  nlohmann::json v3 = {{"model_type", "deepseek_v3"}, {"vocab_size", 129280}, {"hidden_size", 7168},
                       {"num_hidden_layers", 61}, {"num_attention_heads", 128}, {"intermediate_size", 18432},
                       {"moe_intermediate_size", 2048}, {"n_routed_experts", 256}, {"n_shared_experts", 1},
                       {"num_experts_per_tok", 8}, {"first_k_dense_replace", 3}, {"q_lora_rank", 1536},
                       {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128}, {"qk_rope_head_dim", 64},
                       {"v_head_dim", 128}, {"max_position_embeddings", 163840}, {"n_group", 8},
                       {"topk_group", 4}, {"topk_method", "noaux_tc"}, {"scoring_func", "sigmoid"},
                       {"routed_scaling_factor", 2.5}, {"norm_topk_prob", true}};
  // clang-format on
  std::ofstream(path) << v3.dump();
  EXPECT_EQ(plan::read_hf_config(path).num_moe_layers(), 58);
  std::filesystem::remove(path);
}

}  // namespace
