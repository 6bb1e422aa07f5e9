// The named model presets (config.h's preset): one table, one entry a preset.
#include <string>
#include <vector>

#include "core/error.h"
#include "model/config.h"

namespace moe::model {
namespace {
// DeepSeek-V2's multi-head latent attention on a preset: the latents and the head widths.
void set_mla(ModelConfig& c, int q_lora_rank, int kv_lora_rank, int nope, int rope, int v) {
  c.model_type = "deepseek_v2";
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = kv_lora_rank;
  c.qk_nope_head_dim = nope;
  c.qk_rope_head_dim = rope;
  c.v_head_dim = v;
}
// DeepSeek-V3 on an MLA preset: sigmoid routing with the selection bias (renormalised weights x
// 2.5) limited to topk_group of n_group groups, and one multi-token-prediction module.
void set_v3(ModelConfig& c, int n_group, int topk_group) {
  c.model_type = "deepseek_v3";
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.num_nextn_predict_layers = 1;
}
// DeepSeek's group-limited routing at test size: E experts in n_group groups, each token keeps
// topk_group groups for its k experts.
void set_group_limit(ModelConfig& c, int experts, int k, int n_group, int topk_group) {
  c.n_routed_experts = experts;
  c.num_experts_per_tok = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
}

// The sizes of a preset built from scratch (designated initialisers name each one); a field left
// out keeps ModelConfig's default (0).
struct Sizes {
  int hidden = 0, layers = 0, heads = 0, intermediate = 0, moe_intermediate = 0;
  int experts = 0, shared = 0, top_k = 0, first_dense = 0;
  int max_position = 0;
};
void set_sizes(ModelConfig& c, const Sizes& s) {
  c.hidden_size = s.hidden;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.intermediate_size = s.intermediate;
  c.moe_intermediate_size = s.moe_intermediate;
  c.n_routed_experts = s.experts;
  c.n_shared_experts = s.shared;
  c.num_experts_per_tok = s.top_k;
  c.first_k_dense_replace = s.first_dense;
  c.max_position_embeddings = s.max_position;
}

// The other families' PyTorch reference configs (model/family.h): grouped-query attention
// (4 heads over 2 key/value heads), E=8, k=2, the aux loss on (output_router_logits).
void family_reference(ModelConfig& c) {
  // clang-format off
  set_sizes(c, {.hidden = 32, .layers = 3, .heads = 4, .intermediate = 48, .moe_intermediate = 16,
                .experts = 8, .top_k = 2, .max_position = 256});
  // clang-format on
  c.num_key_value_heads = 2;
  c.aux_loss_alpha = 0.02f;
  c.output_router_logits = true;
}

// The default training job: learns byte-level KJV to < 2 nats/byte in minutes on 2 cores.
void set_tiny(ModelConfig& c) {
  // clang-format off
  set_sizes(c, {.hidden = 128, .layers = 4, .heads = 4, .intermediate = 384, .moe_intermediate = 96,
                .experts = 8, .shared = 1, .top_k = 2, .first_dense = 1, .max_position = 1024});
  // clang-format on
  c.aux_loss_alpha = 0.01f;
}

// tiny with aux-loss-free balancing instead of the aux loss (DeepSeek-V3): sigmoid, noaux_tc,
// gamma 1e-3, no balance loss.
void set_tiny_noaux(ModelConfig& c) {
  c = preset("tiny");
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.aux_loss_alpha = 0.0f;
}

// The PyTorch reference config: 1 dense + 2 MoE layers, E=8, k=2, one shared expert, aux on.
void set_test_moe(ModelConfig& c) {
  // clang-format off
  set_sizes(c, {.hidden = 32, .layers = 3, .heads = 4, .intermediate = 48, .moe_intermediate = 16,
                .experts = 8, .shared = 1, .top_k = 2, .first_dense = 1, .max_position = 256});
  // clang-format on
  c.aux_loss_alpha = 0.01f;
}

// test-moe with the other router branches: renormalised top-k weights, per-sequence aux loss.
void set_test_moe_seqaux(ModelConfig& c) {
  c = preset("test-moe");
  c.norm_topk_prob = true;
  c.seq_aux = true;
}

// test-moe with DeepSeek-V3's router: sigmoid scores, selection bias (noaux_tc), renormalised
// weights times routed_scaling_factor 2.5, and the optional sequence-wise balance loss kept.
// gamma 0.01 so that 10 reference steps move the bias enough to change routing.
void set_test_moe_noaux(ModelConfig& c) {
  c = preset("test-moe");
  c.scoring_func = "sigmoid";
  c.topk_method = "noaux_tc";
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 2.5f;
  c.bias_update_speed = 0.01f;
  c.seq_aux = true;
  c.aux_loss_alpha = 0.01f;
}

// test-moe-noaux with DeepSeek-V3's group limit at test size: E=16 in 4 groups of 4, each token
// keeps 2 groups (8 candidates) for its k=4 (V3: 256 in 8 groups of 32, keeps 4, k=8).
void set_test_moe_group(ModelConfig& c) {
  c = preset("test-moe-noaux");
  set_group_limit(c, 16, 4, 4, 2);
}

// test-moe with DeepSeek-V2's group_limited_greedy (softmax; group score = its max score):
// E=16 in 4 groups of 4, 2 kept, k=4, weights times routed_scaling_factor, batch aux loss.
void set_test_moe_v2group(ModelConfig& c) {
  c = preset("test-moe");
  c.topk_method = "group_limited_greedy";
  c.routed_scaling_factor = 2.0f;  // V2 scales unnormalised softmax weights (V2: 16)
  set_group_limit(c, 16, 4, 4, 2);
}

// test-moe with 4 layers (1 dense + 3 MoE): a layer per stage at pp = 4.
void set_test_moe4(ModelConfig& c) {
  c = preset("test-moe");
  c.num_hidden_layers = 4;
}

void set_test_dense(ModelConfig& c) {
  set_sizes(c, {.hidden = 32, .layers = 2, .heads = 2, .intermediate = 48, .max_position = 256});
}

// test-moe with DeepSeek-V2's multi-head latent attention: a query latent of 16, a key/value
// latent of 16, 8 nope + 4 rotary query/key columns and 8 value columns per head.
void set_test_mla(ModelConfig& c) {
  c = preset("test-moe");
  set_mla(c, 16, 16, 8, 4, 8);
}

// test-mla without the query latent (V2-Lite), a value wider than the query (16 > 12: the
// padding on the other side), and YaRN scaling (factor 4, mscale_all_dim 1: the softmax scale
// and the rotary table both change).
void set_test_mla_noq(ModelConfig& c) {
  c = preset("test-mla");
  c.q_lora_rank = 0;
  c.v_head_dim = 16;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.mscale = 1.0;
  c.rope_scaling.mscale_all_dim = 1.0;
  c.rope_scaling.original_max_position_embeddings = 64;
}

// DeepSeek-V3 at test size: MLA, sigmoid routing with the selection bias in 4 groups (2 kept),
// and one multi-token-prediction module.
void set_test_v3(ModelConfig& c) {
  c = preset("test-mla");
  set_v3(c, 4, 2);
  c.bias_update_speed = 0.01f;
  c.seq_aux = true;
  set_group_limit(c, 16, 4, 4, 2);
}

// tiny with DeepSeek-V3's architecture: MLA (latents 64, heads of 32 nope + 16 rotary query/key
// columns and 32 value columns), sigmoid routing with the selection bias in 4 groups of 2 (2
// kept), the dense first layer, and multi-token prediction of depth 1.
void set_tiny_v3(ModelConfig& c) {
  c = preset("tiny");
  set_mla(c, 64, 64, 32, 16, 32);
  set_v3(c, 4, 2);
  c.aux_loss_alpha = 0.0f;
}

// Every layer MoE, experts intermediate_size wide, top-k weights renormalised.
void set_test_mixtral(ModelConfig& c) {
  family_reference(c);
  c.model_type = "mixtral";
  c.intermediate_size = c.moe_intermediate_size;
  c.norm_topk_prob = true;
  c.rope_theta = 1e6f;
  c.rms_norm_eps = 1e-5f;
}

// Layer 0 dense (mlp_only_layers), q/k/v biases, a gated shared expert 24 wide, raw softmax
// weights (norm_topk_prob false, as Qwen1.5-MoE and Qwen2-57B-A14B).
void set_test_qwen2moe(ModelConfig& c) {
  family_reference(c);
  c.model_type = "qwen2_moe";
  c.mlp_only_layers = {0};
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 24;
}

// head_dim 16, not hidden_size / heads = 8 (as Qwen3-30B-A3B: 32 heads of 128 on 2048),
// QK-norm, renormalised weights, every layer MoE.
void set_test_qwen3moe(ModelConfig& c) {
  family_reference(c);
  c.model_type = "qwen3_moe";
  c.head_dim_field = 16;
  c.norm_topk_prob = true;
}

struct Preset {
  const char* name;
  // Sets the preset's fields on a config that starts at ModelConfig's defaults (vocab_size 256,
  // rope_theta 1e4, rms_norm_eps 1e-6); a variant starts from its base preset instead.
  void (*set)(ModelConfig& c);
};

// In preset_names() order.
const Preset kPresets[] = {
    {"tiny", set_tiny},
    {"tiny-noaux", set_tiny_noaux},
    {"test-moe", set_test_moe},
    {"test-moe-seqaux", set_test_moe_seqaux},
    {"test-moe-noaux", set_test_moe_noaux},
    {"test-moe-group", set_test_moe_group},
    {"test-moe-v2group", set_test_moe_v2group},
    {"test-moe4", set_test_moe4},
    {"test-dense", set_test_dense},
    {"test-mla", set_test_mla},
    {"test-mla-noq", set_test_mla_noq},
    {"test-v3", set_test_v3},
    {"tiny-v3", set_tiny_v3},
    {"test-mixtral", set_test_mixtral},
    {"test-qwen2moe", set_test_qwen2moe},
    {"test-qwen3moe", set_test_qwen3moe},
};

}  // namespace

ModelConfig preset(const std::string& name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.vocab_size = 256;
    c.rope_theta = 10000.0f;
    c.rms_norm_eps = 1e-6f;
    p.set(c);
    c.validate("preset " + name);
    return c;
  }
  std::string known;
  for (auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(str_cat("unknown model preset \"", name, "\" (known: ", known, ")"));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

}  // namespace moe::model
