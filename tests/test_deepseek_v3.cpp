// DeepSeek-V2/V3 configs (issue 40): the real config.json files read with their field names and
// written back with them, their parameter counts, and the errors of fields the trainer cannot honour.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/params.h"
#include "test_util.h"

using namespace moe;
using nlohmann::json;
using moe::test_util::error_of;

namespace {

// deepseek-ai/DeepSeek-V3's config.json as published (the fp8 quantization block and auto_map
// left out: fields the trainer ignores).
json v3_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
}

// deepseek-ai/DeepSeek-V2-Lite's: no query latent (q_lora_rank null), softmax greedy routing.
json v2_lite_config() {
  return json::parse(R"({
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "aux_loss_alpha": 0.001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
    "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": null,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
    "vocab_size": 102400})");
}

}  // namespace

TEST(DeepSeekV3Config, ReadsTheRealFieldsAndCountsItsParameters) {
  const model::ModelConfig c = model::config_from_json(v3_config(), "DeepSeek-V3/config.json");
  EXPECT_TRUE(c.uses_mla());
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.value_head_dim(), 128);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 40.0);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  // 1/sqrt(192) times YaRN's mscale(40, 1)^2 = (0.1 ln 40 + 1)^2.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.softmax_scale(), m * m / std::sqrt(192.0), 1e-12);
  // DeepSeek-V3's report: 671B parameters, 37B activated per token (the main model; the MTP
  // module's 14B are not counted).
  const model::ParamCounts p = model::count_params(c);
  EXPECT_NEAR(p.total / 1e9, 671.0, 1.0) << p.total;
  EXPECT_NEAR(p.active / 1e9, 37.5, 0.6) << p.active;
}

TEST(DeepSeekV3Config, WritesItBackWithTheSameNames) {
  for (const json& in : {v3_config(), v2_lite_config()}) {
    const model::ModelConfig c = model::config_from_json(in, "config.json");
    const json out = model::config_to_json(c);
    for (const char* f : {"model_type", "architectures", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                          "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts",
                          "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
                          "scoring_func", "hidden_size", "num_hidden_layers", "vocab_size"})
      EXPECT_EQ(out.at(f), in.at(f)) << in.at("model_type") << ": " << f;
    for (const char* f : {"type", "factor", "mscale", "mscale_all_dim", "beta_fast", "beta_slow",
                          "original_max_position_embeddings"})
      EXPECT_DOUBLE_EQ(out.at("rope_scaling").at(f).is_string() ? 0.0 : out.at("rope_scaling").at(f).get<double>(),
                       in.at("rope_scaling").at(f).is_string() ? 0.0 : in.at("rope_scaling").at(f).get<double>())
          << f;
    EXPECT_EQ(out.at("rope_scaling").at("type"), "yarn");
    // And reads back to the same config.
    const model::ModelConfig again = model::config_from_json(out, "written");
    EXPECT_EQ(model::config_to_json(again), out);
  }
  const json v3 = model::config_to_json(model::config_from_json(v3_config(), "v3"));
  for (const char* f : {"topk_method", "n_group", "topk_group", "routed_scaling_factor", "num_nextn_predict_layers"})
    EXPECT_EQ(v3.at(f), v3_config().at(f)) << f;
  EXPECT_TRUE(model::config_to_json(model::config_from_json(v2_lite_config(), "v2")).at("q_lora_rank").is_null());
}

TEST(DeepSeekV3Config, MtpModuleIsLayerLOfTheLastStage) {
  model::ModelConfig c = model::preset("test-v3");
  const model::ParamLayout whole(c);
  const std::string L = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  for (const char* t : {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
                        "self_attn.kv_a_proj_with_mqa.weight", "mlp.experts.15.down_proj.weight"})
    EXPECT_TRUE(whole.contains(L + t)) << t;
  EXPECT_FALSE(whole.find(L + "mlp.experts.0.up_proj.weight").is_expert);  // held whole by every rank
  model::StageSpec first;
  first.num_layers = 1;
  first.head = false;
  EXPECT_FALSE(model::ParamLayout(c, {}, first).contains(L + "enorm.weight"));
}

TEST(DeepSeekV3Config, ErrorsNameTheField) {
  auto with = [](const std::function<void(json&)>& f) {
    json j = v3_config();
    f(j);
    return error_of([&] { model::config_from_json(j, "cfg.json"); });
  };
  EXPECT_NE(with([](json& j) { j.erase("kv_lora_rank"); }).find("missing field \"kv_lora_rank\""), std::string::npos);
  EXPECT_NE(with([](json& j) { j["rope_scaling"]["type"] = "linear"; }).find("rope_scaling type \"linear\""),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j["num_nextn_predict_layers"] = 2; }).find("num_nextn_predict_layers\" = 2"),
            std::string::npos);
  EXPECT_NE(with([](json& j) { j["qk_rope_head_dim"] = 63; }).find("qk_rope_head_dim\" = 63"), std::string::npos);
  EXPECT_NE(with([](json& j) { j["rope_scaling"] = 5; }).find("\"rope_scaling\" must be an object"),
            std::string::npos);
  EXPECT_NE(with([](json& j) {
              j["model_type"] = "deepseek";
              j["hidden_size"] = 7168;
            }).find("need model_type deepseek_v2 or deepseek_v3"),
            std::string::npos);
}
