// Whole-model tests: config parsing and its errors, parameter naming, finite-difference gradients
// of the full model, save/load round trip, determinism of training.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/memory_sizes.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "train/optimizer.h"
#include "test_util.h"

using namespace moe;
using nlohmann::json;

namespace {

using moe::test_util::error_of;

std::vector<int32_t> random_tokens(int B, int T, int V, uint64_t seed) {
  Rng r(seed);
  std::vector<int32_t> t(static_cast<size_t>(B) * (T + 1));
  for (auto& x : t) x = static_cast<int32_t>(r.below(V));
  return t;
}

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("moetrain_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace

TEST(Config, PresetsValidateAndRoundTripThroughJson) {
  for (const std::string& name : model::preset_names()) {
    model::ModelConfig c = model::preset(name);
    model::ModelConfig back = model::config_from_json(model::config_to_json(c), name);
    EXPECT_EQ(model::config_to_json(back), model::config_to_json(c)) << name;
  }
}

TEST(Config, ErrorsNameTheProblem) {
  EXPECT_NE(error_of([] { model::preset("huge"); }).find("unknown model preset \"huge\""), std::string::npos);
  json good = model::config_to_json(model::preset("test-moe"));
  auto err = [&](auto mutate) {
    json j = good;
    mutate(j);
    return error_of([&] { model::config_from_json(j, "cfg.json"); });
  };
  EXPECT_NE(err([](json& j) { j.erase("hidden_size"); }).find("cfg.json: missing field \"hidden_size\""),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["hidden_size"] = "32"; }).find("\"hidden_size\" must be an integer"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["norm_topk_prob"] = 1; }).find("\"norm_topk_prob\" must be true or false"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_experts_per_tok"] = 9; }).find("num_experts_per_tok (9) exceeds n_routed_experts (8)"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_attention_heads"] = 5; j["num_key_value_heads"] = 5; }).find("hidden_size (32) is not divisible by num_attention_heads (5)"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["scoring_func"] = "sigmoid"; }).find("scoring_func \"sigmoid\""),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["model_type"] = "llama"; }).find("model_type \"llama\""),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j.erase("moe_intermediate_size"); }).find("missing field \"moe_intermediate_size\""),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["vocab_size"] = -3; }).find("\"vocab_size\" must be positive, got -3"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["num_key_value_heads"] = 2; }).find("grouped-query attention"),
            std::string::npos);
  auto dir = temp_dir("cfg");
  std::ofstream(dir / "bad.json") << "{ not json";
  EXPECT_NE(error_of([&] { model::load_config((dir / "bad.json").string()); }).find("bad.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model::load_config((dir / "none.json").string()); }).find("none.json: cannot open"),
            std::string::npos);
}

TEST(Params, HuggingFaceNamesAndCounts) {
  model::ModelConfig c = model::preset("test-moe");
  model::ParamLayout layout(c);
  EXPECT_EQ(layout.total(), static_cast<size_t>(model::count_params(c).total));
  EXPECT_TRUE(layout.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(layout.contains("model.layers.1.mlp.gate.weight"));
  EXPECT_TRUE(layout.contains("model.layers.2.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(layout.contains("model.layers.2.mlp.shared_experts.up_proj.weight"));
  EXPECT_FALSE(layout.contains("model.layers.0.mlp.gate.weight"));
  // Experts of one projection are stacked back to back: [E,F,H].
  const auto& e0 = layout.find("model.layers.1.mlp.experts.0.up_proj.weight");
  const auto& e1 = layout.find("model.layers.1.mlp.experts.1.up_proj.weight");
  EXPECT_EQ(e1.offset, e0.offset + e0.numel);
  EXPECT_FALSE(layout.find("model.norm.weight").decay);
  EXPECT_TRUE(layout.find("lm_head.weight").decay);
}

// Finite differences of the total loss (CE + aux) w.r.t. a sample of every parameter tensor.
TEST(Model, GradientsMatchFiniteDifferences) {
  model::ModelConfig c = model::preset("test-moe");
  c.initializer_range = 0.2f;  // larger weights: routing well separated, gradients well above noise
  model::Model m(c);
  m.init_weights(3);
  const int B = 2, T = 8;
  auto tok = random_tokens(B, T, c.vocab_size, 11);
  m.zero_grads();
  m.forward(tok.data(), B, T);
  auto loads0 = m.expert_loads();
  m.backward();
  std::vector<float> g(m.grads(), m.grads() + m.num_params());
  Rng pick(5);
  double worst = 0.0;
  int checked = 0;
  for (const model::ParamSpec& s : m.layout().specs()) {
    for (int rep = 0; rep < 2; ++rep) {
      size_t i = s.offset + pick.below(s.numel);
      float* p = m.params() + i;
      const float orig = *p, h = 1e-2f;
      *p = orig + h;
      double lp = m.evaluate(tok.data(), B, T).total;
      bool same_routing = m.expert_loads() == loads0;
      *p = orig - h;
      double lm = m.evaluate(tok.data(), B, T).total;
      same_routing = same_routing && m.expert_loads() == loads0;
      *p = orig;
      if (!same_routing) continue;  // a top-k flip makes the loss non-differentiable here
      double num = (lp - lm) / (2 * h);
      double err = std::abs(num - g[i]) / std::max(1e-3, std::abs(num) + std::abs(g[i]));
      worst = std::max(worst, err);
      EXPECT_LT(err, 2e-2) << s.name << " index " << i - s.offset << " analytic " << g[i]
                           << " numeric " << num;
      ++checked;
    }
  }
  EXPECT_GT(checked, static_cast<int>(m.layout().specs().size()));
}

TEST(Model, ActivationsAreReleasedAfterBackward) {
  model::Model m(model::preset("test-moe"));
  m.init_weights(1);
  auto tok = random_tokens(2, 8, 256, 2);
  m.forward(tok.data(), 2, 8);
  EXPECT_GT(m.activation_memory().current(), 0u);
  m.backward();
  EXPECT_EQ(m.activation_memory().current(), 0u);
  EXPECT_GT(m.activation_memory().peak(), 0u);
}

TEST(Model, BackwardAccumulatesIntoGradients) {
  model::Model m(model::preset("test-moe"));
  m.init_weights(1);
  auto tok = random_tokens(2, 8, 256, 2);
  m.zero_grads();
  m.forward(tok.data(), 2, 8);
  m.backward();
  std::vector<float> once(m.grads(), m.grads() + m.num_params());
  m.forward(tok.data(), 2, 8);
  m.backward();
  for (size_t i = 0; i < once.size(); i += 97) EXPECT_FLOAT_EQ(m.grads()[i], 2 * once[i]);
}

TEST(Model, SaveLoadRoundTripAndShapeErrors) {
  auto dir = temp_dir("weights");
  model::ModelConfig c = model::preset("test-moe");
  model::Model a(c), b(c);
  a.init_weights(9);
  model::save_weights(a, (dir / "w.safetensors").string());
  model::load_weights(b, (dir / "w.safetensors").string());
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.num_params() * sizeof(float)));
  model::ModelConfig other = c;
  other.moe_intermediate_size = 8;
  model::Model d(other);
  std::string e = error_of([&] { model::load_weights(d, (dir / "w.safetensors").string()); });
  EXPECT_NE(e.find("w.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("experts.0.gate_proj.weight"), std::string::npos) << e;
}

TEST(Train, SameSeedSameLossesBitForBit) {
  auto run = [] {
    model::Model m(model::preset("test-moe"));
    m.init_weights(5);
    train::OptimConfig oc;
    oc.total_steps = 5;
    oc.warmup_steps = 2;
    train::AdamW opt(m.layout(), oc);
    std::vector<double> losses;
    for (int s = 0; s < 5; ++s) {
      auto tok = random_tokens(2, 8, 256, 100 + s);
      m.zero_grads();
      losses.push_back(m.forward(tok.data(), 2, 8).total);
      m.backward();
      opt.step(m.params(), m.grads(), s);
    }
    return losses;
  };
  auto a = run(), b = run();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]);
  EXPECT_LT(a.back(), a.front());
}

TEST(Train, LearningRateSchedule) {
  train::OptimConfig o;
  o.lr = 1.0f;
  o.min_lr = 0.1f;
  o.warmup_steps = 4;
  o.total_steps = 14;
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 0), 0.25);
  EXPECT_DOUBLE_EQ(train::learning_rate(o, 3), 1.0);
  EXPECT_NEAR(train::learning_rate(o, 4), 1.0, 1e-12);
  EXPECT_NEAR(train::learning_rate(o, 9), 0.55, 1e-7);
  EXPECT_NEAR(train::learning_rate(o, 14), 0.1, 1e-7);
  EXPECT_NEAR(train::learning_rate(o, 100), 0.1, 1e-7);
}

namespace {
// Loss and gradients (by parameter name) of one forward+backward.
struct LossAndGrads {
  double loss;
  std::map<std::string, std::vector<float>> grads;
  size_t act_peak;
};
LossAndGrads run_whole(Recompute r, const std::vector<int32_t>& tok, int B, int T,
                       const char* preset = "test-moe") {
  model::Model m(model::preset(preset), {}, nullptr, {}, r);
  m.init_weights(21);
  m.zero_grads();
  LossAndGrads out;
  out.loss = m.forward(tok.data(), B, T).total;
  m.backward();
  out.act_peak = m.activation_memory().peak();
  for (const auto& s : m.layout().specs())
    out.grads[s.name].assign(m.grads() + s.offset, m.grads() + s.offset + s.numel);
  return out;
}
}  // namespace

// Activation checkpointing recomputes exactly what forward computed: bit-identical loss and
// gradients, and less activation memory held between forward and backward.
TEST(Model, RecomputeIsBitIdenticalAndHoldsLess) {
  auto tok = random_tokens(2, 16, 256, 31);
  // The families too: QK-norm's kept q and k, the gated shared expert (model/family.h).
  for (const char* preset : {"test-moe", "test-qwen2moe", "test-qwen3moe"}) {
    LossAndGrads none = run_whole(Recompute::kNone, tok, 2, 16, preset);
    LossAndGrads moe_r = run_whole(Recompute::kMoe, tok, 2, 16, preset);
    LossAndGrads full = run_whole(Recompute::kFull, tok, 2, 16, preset);
    for (const LossAndGrads* o : {&moe_r, &full}) {
      EXPECT_EQ(o->loss, none.loss) << preset;
      for (const auto& [name, g] : none.grads)
        EXPECT_EQ(0, std::memcmp(g.data(), o->grads.at(name).data(), g.size() * sizeof(float))) << name;
    }
    EXPECT_LT(moe_r.act_peak, none.act_peak) << preset;
    EXPECT_LT(full.act_peak, moe_r.act_peak) << preset;
  }
}

// Two stages chained by hand (the pipeline's data path without MPI) equal the whole model.
TEST(Model, StagesChainedEqualTheWholeModel) {
  model::ModelConfig c = model::preset("test-moe");
  const int B = 2, T = 8, N = B * T, H = c.hidden_size;
  auto tok = random_tokens(B, T, 256, 41);
  model::Model whole(c);
  whole.init_weights(5);
  whole.zero_grads();
  double loss = whole.forward(tok.data(), B, T).total;
  whole.backward();
  model::StageSpec s0{0, 2, true, false}, s1{2, -1, false, true};
  model::Model a(c, {}, nullptr, s0), b(c, {}, nullptr, s1);
  a.init_weights(5);
  b.init_weights(5);
  a.zero_grads();
  b.zero_grads();
  auto ma = a.new_micro_batch(), mb = b.new_micro_batch();
  std::vector<float> x(static_cast<size_t>(N) * H), dx(x.size());
  model::LossParts la = a.forward(*ma, tok.data(), nullptr, x.data(), B, T);
  model::LossParts lb = b.forward(*mb, tok.data(), x.data(), nullptr, B, T);
  EXPECT_DOUBLE_EQ(la.aux + lb.total, loss);
  b.backward(*mb, nullptr, dx.data(), 1.0f);
  a.backward(*ma, dx.data(), nullptr, 1.0f);
  for (const model::Model* st : {&a, &b})
    for (const auto& s : st->layout().specs()) {
      const auto& w = whole.layout().find(s.name);
      std::vector<float> got(const_cast<model::Model*>(st)->grads() + s.offset,
                             const_cast<model::Model*>(st)->grads() + s.offset + s.numel);
      EXPECT_EQ(0, std::memcmp(got.data(), whole.grads() + w.offset, s.numel * sizeof(float))) << s.name;
    }
  EXPECT_FALSE(a.layout().contains("lm_head.weight"));
  EXPECT_FALSE(b.layout().contains("model.embed_tokens.weight"));
  EXPECT_EQ(a.layout().total() + b.layout().total(), whole.layout().total());
}

// The planner's size functions are the allocations: the activation high-water mark of a whole
// model equals their sum to the byte, for every recompute mode.
TEST(Model, MemorySizeFunctionsMatchTheAllocations) {
  // test-moe; DeepSeek-V2/V3's multi-head latent attention with and without a query latent, and
  // test-v3's multi-token-prediction module on the head stage; test-qwen3moe: QK-norm's kept q, k;
  // test-qwen2moe: the gated shared expert's output and gate.
  for (const char* preset : {"test-moe", "test-mla", "test-mla-noq", "test-v3", "test-qwen2moe", "test-qwen3moe"}) {
    model::ModelConfig c = model::preset(preset);
    const int B = 2, T = 16;
    auto tok = random_tokens(B, T, 256, 3);
    for (Recompute rc : {Recompute::kNone, Recompute::kMoe, Recompute::kFull}) {
      model::Model m(c, {}, nullptr, {}, rc);
      m.init_weights(1);
      m.forward(tok.data(), B, T);
      size_t elems = model::head_kept_elems(c, B, T);
      for (int l = 0; l < c.num_hidden_layers; ++l)
        elems += model::layer_kept_elems(c, l, B, T, static_cast<size_t>(B) * T * c.num_experts_per_tok, rc);
      EXPECT_EQ(m.activation_memory().peak(), 4 * elems) << preset << " " << rc;
      m.backward();
    }
  }
}
