// The other families (model/family.h): Mixtral, Qwen2-MoE and Qwen3-MoE config.json files of the
// published models read with their own field names and written back with them; the errors for
// what the trainer cannot honour; the tensor names through an exported folder and back.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/family.h"
#include "model/model.h"
#include "model/weights_io.h"
#include "test_util.h"
#include "train/generate.h"

using namespace moe;
using nlohmann::json;

namespace {

// config.json of mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen2-57B-A14B and Qwen/Qwen3-30B-A3B as
// published (the fields the trainer does not use included).
const char* kMixtral = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";
const char* kQwen2Moe = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "decoder_sparse_step": 1, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2_moe", "moe_intermediate_size": 2560,
  "norm_topk_prob": false, "num_attention_heads": 28, "num_experts": 64, "num_experts_per_tok": 8,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "output_router_logits": false,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "shared_expert_intermediate_size": 20480, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";
const char* kQwen3Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

// The fields each family's reader uses: written back with the same names and values.
const std::vector<std::string> kCommon = {
    "model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "intermediate_size", "num_experts_per_tok", "router_aux_loss_coef",
    "output_router_logits", "rope_theta", "rms_norm_eps", "max_position_embeddings",
    "initializer_range", "sliding_window", "hidden_act", "tie_word_embeddings"};
const std::vector<std::string> kQwen = {"num_experts", "moe_intermediate_size", "norm_topk_prob",
                                        "decoder_sparse_step", "use_sliding_window"};

using test_util::error_of;

void expect_written_back(const json& in, const std::vector<std::string>& fields) {
  const json out = model::config_to_json(model::config_from_json(in, "in"));
  for (const std::string& f : fields) {
    ASSERT_TRUE(out.contains(f)) << in["model_type"] << ": " << f << " not written back";
    if (in[f].is_number_float() || out[f].is_number_float())
      EXPECT_DOUBLE_EQ(out[f].get<double>(), in[f].get<double>()) << f;
    else
      EXPECT_EQ(out[f], in[f]) << in["model_type"] << ": " << f;
  }
  // Read back, the written config is the same config (and writes the same file).
  EXPECT_EQ(model::config_to_json(model::config_from_json(out, "out")), out);
  for (const char* deepseek : {"n_routed_experts", "n_shared_experts", "first_k_dense_replace", "aux_loss_alpha"})
    EXPECT_FALSE(out.contains(deepseek)) << in["model_type"] << " written with DeepSeek's " << deepseek;
}

}  // namespace

TEST(Families, PublishedConfigsReadAndWriteBackWithTheirNames) {
  const json mixtral = json::parse(kMixtral), qwen2 = json::parse(kQwen2Moe), qwen3 = json::parse(kQwen3Moe);
  const model::ModelConfig m = model::config_from_json(mixtral, "mixtral");
  EXPECT_EQ(m.n_routed_experts, 8);
  EXPECT_EQ(m.moe_intermediate_size, 14336);  // intermediate_size is the expert width
  EXPECT_EQ(m.kv_heads(), 8);
  EXPECT_EQ(m.head_dim(), 128);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(m.num_moe_layers(), 32);
  EXPECT_EQ(m.shared_ffn(), 0);
  EXPECT_EQ(m.router_aux_alpha(), 0.0f);  // output_router_logits false: HF adds no aux loss
  // 46.7B parameters, 12.9B active (the published figures).
  EXPECT_NEAR(model::count_params(m).total / 1e9, 46.70, 0.01);
  EXPECT_NEAR(model::count_params(m).active / 1e9, 12.88, 0.01);
  expect_written_back(mixtral, kCommon);
  EXPECT_TRUE(model::config_to_json(m).contains("num_local_experts"));

  const model::ModelConfig q2 = model::config_from_json(qwen2, "qwen2");
  EXPECT_EQ(q2.n_routed_experts, 64);
  EXPECT_EQ(q2.shared_ffn(), 20480);
  EXPECT_TRUE(q2.qkv_bias() && q2.gated_shared_expert() && !q2.qk_norm());
  EXPECT_EQ(q2.kv_heads(), 4);
  EXPECT_EQ(model::attention_window(q2), 0);                    // sliding_window set, use_sliding_window false
  EXPECT_NEAR(model::count_params(q2).total / 1e9, 57.4, 0.1);  // Qwen2-57B-A14B
  EXPECT_NEAR(model::count_params(q2).active / 1e9, 14.2, 0.1);
  std::vector<std::string> q2_fields = kCommon;
  q2_fields.insert(q2_fields.end(), kQwen.begin(), kQwen.end());
  q2_fields.push_back("shared_expert_intermediate_size");
  expect_written_back(qwen2, q2_fields);

  const model::ModelConfig q3 = model::config_from_json(qwen3, "qwen3");
  EXPECT_EQ(q3.head_dim(), 128);  // not 2048 / 32 = 64
  EXPECT_TRUE(q3.qk_norm() && !q3.qkv_bias() && !q3.gated_shared_expert());
  EXPECT_EQ(q3.num_moe_layers(), 48);
  EXPECT_NEAR(model::count_params(q3).total / 1e9, 30.5, 0.1);  // Qwen3-30B-A3B
  EXPECT_NEAR(model::count_params(q3).active / 1e9, 3.3, 0.1);
  std::vector<std::string> q3_fields = kCommon;
  q3_fields.insert(q3_fields.end(), kQwen.begin(), kQwen.end());
  q3_fields.insert(q3_fields.end(), {"head_dim", "mlp_only_layers", "attention_bias", "rope_scaling"});
  expect_written_back(qwen3, q3_fields);

  // The aux loss when asked for: HF's coef per layer is a DeepSeek alpha of coef · k / MoE layers.
  json on = qwen3;
  on["output_router_logits"] = true;
  EXPECT_FLOAT_EQ(model::config_from_json(on, "on").router_aux_alpha(), 0.001f * 8 / 48);
}

TEST(Families, QwenLayersFollowSparseStepAndMlpOnlyLayers) {
  json j = json::parse(kQwen3Moe);
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = json::array({3});
  const model::ModelConfig c = model::config_from_json(j, "q");
  std::vector<bool> moe;
  for (int l = 0; l < 6; ++l) moe.push_back(c.is_moe_layer(l));
  // (i + 1) % 2 == 0: layers 1, 3, 5; layer 3 listed dense.
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(model::config_to_json(c)["mlp_only_layers"], json::array({3}));
}

TEST(Families, WhatTheTrainerCannotHonourIsAnErrorNamingIt) {
  auto err = [](const char* base, const std::function<void(json&)>& edit) {
    json j = json::parse(base);
    edit(j);
    return error_of([&] { model::config_from_json(j, "config.json"); });
  };
  auto has = [](const std::string& e, const std::string& what) {
    EXPECT_NE(e.find(what), std::string::npos) << "error: " << e << "\nexpected: " << what;
  };
  has(err(kMixtral, [](json& j) { j["model_type"] = "llama"; }),
      "model_type \"llama\" is not supported for training (supported: deepseek, deepseek_v2, deepseek_v3, mixtral, qwen2_moe, qwen3_moe)");
  has(err(kMixtral, [](json& j) { j.erase("num_key_value_heads"); }), "missing field \"num_key_value_heads\"");
  has(err(kMixtral, [](json& j) { j["num_key_value_heads"] = 5; }),
      "num_attention_heads (32) is not a multiple of num_key_value_heads (5)");
  has(err(kMixtral, [](json& j) { j["tie_word_embeddings"] = true; }), "tie_word_embeddings = true is not supported");
  has(err(kMixtral, [](json& j) { j["attention_bias"] = true; }), "attention_bias = true is not supported (mixtral has no attention biases)");
  has(err(kQwen3Moe, [](json& j) { j["attention_bias"] = true; }), "attention_bias = true is not supported");
  has(err(kQwen3Moe, [](json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4}}; }), "rope_scaling = ");
  has(err(kQwen3Moe, [](json& j) { j.erase("head_dim"); }), "missing field \"head_dim\"");
  has(err(kQwen3Moe, [](json& j) { j["hidden_act"] = "gelu"; }), "hidden_act \"gelu\" is not supported");
  has(err(kQwen3Moe, [](json& j) { j["mlp_only_layers"] = json::array({48}); }), "mlp_only_layers holds 48, outside the model's layers [0, 48)");
  has(err(kQwen3Moe, [](json& j) { j["num_experts_per_tok"] = 1; }), "num_experts_per_tok = 1 with renormalised weights");
  has(err(kQwen2Moe, [](json& j) { j["router_aux_loss_coef"] = -1; }), "\"router_aux_loss_coef\" must be >= 0");
  has(err(kQwen2Moe, [](json& j) { j["decoder_sparse_step"] = 0; }), "\"decoder_sparse_step\" must be >= 1");
  has(err(kMixtral, [](json& j) { j["router_jitter_noise"] = 0.01; }), "router_jitter_noise = 0.01 is not supported");
  has(err(kQwen2Moe, [](json& j) { j["attention_dropout"] = 0.1; }), "attention_dropout = 0.1 is not supported");

  // A sliding window shorter than the sequence: refused when the sequence is seen.
  model::ModelConfig c = model::preset("test-mixtral");
  c.sliding_window = 8;
  model::Model m(c);
  m.init_weights(1);
  std::vector<int32_t> tok(2 * 17, 3);
  has(error_of([&] { m.forward(tok.data(), 2, 16); }), "sequence length 16 exceeds sliding_window 8 (mixtral)");
  tok.resize(2 * 9);
  EXPECT_NO_THROW(m.forward(tok.data(), 2, 8));
}

// The family's tensor names out (an exported folder: config.json + model.safetensors) and in
// (generate's and eval's loader): every tensor comes back by name, bit for bit, and the file holds
// the Hugging Face names.
TEST(Families, ExportedFolderLoadsBackByName) {
  // clang-format off
  const std::map<std::string, std::vector<std::string>> names = {
      {"test-mixtral", {"model.layers.2.block_sparse_moe.gate.weight", "model.layers.0.block_sparse_moe.experts.7.w1.weight",
                        "model.layers.1.block_sparse_moe.experts.0.w3.weight", "model.layers.1.block_sparse_moe.experts.5.w2.weight"}},
      {"test-qwen2moe", {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.gate.weight",
                         "model.layers.2.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.shared_expert.down_proj.weight",
                         "model.layers.2.mlp.shared_expert_gate.weight", "model.layers.0.self_attn.k_proj.bias"}},
      {"test-qwen3moe", {"model.layers.0.self_attn.q_norm.weight", "model.layers.2.self_attn.k_norm.weight",
                         "model.layers.0.mlp.experts.6.gate_proj.weight"}}};
  // clang-format on
  for (const auto& [preset, want] : names) {
    const model::ModelConfig c = model::preset(preset);
    model::Model m(c);
    m.init_weights(5);
    const std::string dir = test_util::fresh_scratch_dir("families", "export_" + preset);
    model::save_config(c, dir + "/config.json");
    model::save_weights(m, dir + "/model.safetensors");
    for (const std::string& n : want) EXPECT_TRUE(m.layout().contains(n)) << preset << ": " << n;
    const train::LoadedModel back = train::load_model_for_inference(dir);
    EXPECT_EQ(back.model->config().model_type, c.model_type);
    ASSERT_EQ(back.model->num_params(), m.num_params()) << preset;
    for (const model::ParamSpec& s : m.layout().specs()) {
      const model::ParamSpec& t = back.model->layout().find(s.name);
      EXPECT_EQ(0, std::memcmp(back.model->params() + t.offset, m.params() + s.offset, s.numel * sizeof(float)))
          << preset << ": " << s.name;
    }
  }
}
