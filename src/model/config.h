// ModelConfig: the Hugging Face DeepSeek-MoE config.json fields the model uses, named as in
// config.json, plus named presets. Validation errors name the field and the offending value.
// Mixtral, Qwen2-MoE and Qwen3-MoE configs are read and written with their own field names by
// model/family.h; their extra fields are below ("Other families").
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::model {

struct ModelConfig {
  std::string model_type = "deepseek";
  int vocab_size = 256;
  int hidden_size = 0;        // H
  int num_hidden_layers = 0;  // L
  int num_attention_heads = 0;
  int intermediate_size = 0;      // dense SwiGLU width
  int moe_intermediate_size = 0;  // F, per routed / shared expert
  int n_routed_experts = 0;       // E; 0 = every layer dense
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;    // k
  int first_k_dense_replace = 0;  // layers [0, this) are dense
  int moe_layer_freq = 1;         // layer i >= first_k_dense is MoE when i % freq == 0
  bool norm_topk_prob = false;
  std::string scoring_func = "softmax";  // "softmax" | "sigmoid" (DeepSeek-V3, with noaux_tc)
  // "greedy": top-k of the scores. "noaux_tc" (DeepSeek-V3, aux-loss-free balancing): top-k of
  // scores + e_score_correction_bias, a per-expert fp32 state (not a parameter) that the trainer
  // moves by bias_update_speed · sign(mean load - load) after each step. noaux_tc <=> sigmoid.
  // "group_limited_greedy" (DeepSeek-V2, softmax): greedy within the token's topk_group groups.
  std::string topk_method = "greedy";
  // Group-limited (node-limited) routing: the experts form n_group groups of E / n_group
  // consecutive experts and a token picks its k experts inside its topk_group best groups
  // (group_limited_greedy: by the max score of a group; noaux_tc: by the sum of its two largest
  // biased scores). n_group 1 = no limit. Names as in HF DeepSeek-V2/V3 config.json.
  int n_group = 1;
  int topk_group = 1;
  // Multiplies the k gate values: always with sigmoid (V3); with softmax (V2) unless
  // norm_topk_prob renormalises them.
  float routed_scaling_factor = 1.0f;
  float bias_update_speed = 1e-3f;  // noaux_tc: gamma (moetrain's field; --balance.bias-rate)
  float aux_loss_alpha = 0.0f;
  bool seq_aux = false;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 2048;
  float initializer_range = 0.02f;
  // moetrain's field: the fingerprint of the tokenizer whose ids the model was trained on
  // (io/token_corpus.h, tokenizer_fingerprint); "" when unknown (a config written before, or one
  // typed by hand). Stored in checkpoints and exports with the rest of the config; compared by
  // train --resume, eval and generate.
  std::string tokenizer_fingerprint;

  // ---- DeepSeek-V2/V3 (model_type deepseek_v2 / deepseek_v3) ----
  // Multi-head latent attention (MLA): queries through a low-rank latent of q_lora_rank (0 or
  // null in config.json: one q_proj), keys and values through one shared latent of kv_lora_rank
  // that kv_b_proj expands per head into qk_nope_head_dim key and v_head_dim value columns; the
  // qk_rope_head_dim rotary key columns are one per token, shared by every head.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // rope_scaling {"type": "yarn", ...} (DeepSeek-V3's long-context extension): the rotary table's
  // frequencies blended by YaRN's ramp, cos/sin times mscale / mscale_all_dim's, and the softmax
  // scale times mscale_all_dim's squared. type "" = none (null in config.json).
  struct RopeScaling {
    std::string type;
    double factor = 1.0;
    double mscale = 1.0;
    double mscale_all_dim = 0.0;
    double beta_fast = 32.0;
    double beta_slow = 1.0;
    int original_max_position_embeddings = 4096;
  } rope_scaling;
  // Multi-token prediction (DeepSeek-V3): modules that predict token t+1+d from the main model's
  // last hidden state and the embedding of token t+d. Depth 0 or 1 here.
  int num_nextn_predict_layers = 0;

  bool uses_mla() const { return model_type == "deepseek_v2" || model_type == "deepseek_v3"; }
  // The width of one head's query and key, and of its value (MLA: nope + rope, and v_head_dim).
  int qk_head_dim() const { return uses_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim(); }
  int value_head_dim() const { return uses_mla() ? v_head_dim : head_dim(); }
  // The attention's softmax scale: 1/sqrt(qk_head_dim), times YaRN's mscale(factor,
  // mscale_all_dim)^2 when rope_scaling asks for it.
  double softmax_scale() const;

  // Other families (model/family.h: model_type mixtral, qwen2_moe, qwen3_moe). DeepSeek keeps the
  // defaults: multi-head attention of hidden_size / num_attention_heads, no gate on the shared
  // experts, the aux loss as configured.
  int num_key_value_heads = 0;              // grouped-query attention; 0 = num_attention_heads
  int head_dim_field = 0;                   // config.json "head_dim"; 0 = hidden_size / num_attention_heads
  int shared_expert_intermediate_size = 0;  // qwen2_moe: the gated shared expert's width
  int decoder_sparse_step = 1;              // qwen: layer i is MoE when (i + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;         // ... and i is not listed here
  bool output_router_logits = false;        // mixtral / qwen: HF adds the aux loss only when true
  int sliding_window = 0;                   // attention window (mixtral; qwen when use_sliding_window); 0 = null
  bool use_sliding_window = false;          // qwen

  int head_dim() const { return head_dim_field > 0 ? head_dim_field : hidden_size / num_attention_heads; }
  int kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  // DeepSeek-MoE, -V2 and -V3 (model_type deepseek, deepseek_v2, deepseek_v3): config.cpp's fields.
  bool is_deepseek() const { return model_type == "deepseek" || uses_mla(); }
  bool qkv_bias() const { return model_type == "qwen2_moe"; }             // q/k/v projections have biases
  bool qk_norm() const { return model_type == "qwen3_moe"; }              // RMSNorm on each q and k head
  bool gated_shared_expert() const { return model_type == "qwen2_moe"; }  // sigmoid(x·g) · shared
  // Width of the shared experts' concatenated FFN (0: none).
  int shared_ffn() const {
    return gated_shared_expert() ? shared_expert_intermediate_size * n_shared_experts
                                 : moe_intermediate_size * n_shared_experts;
  }
  // The alpha each MoE layer's router applies (model/family.h: the families' aux loss as a
  // per-layer DeepSeek aux loss).
  float router_aux_alpha() const;
  bool is_moe_layer(int layer) const;
  int num_moe_layers() const;
  bool aux_free_balancing() const { return topk_method == "noaux_tc"; }
  // Throws moe::Error naming the field (and `source`, e.g. the config.json path) on a bad value.
  void validate(const std::string& source = "config") const;
};

// Parses a Hugging Face config.json object. Unknown fields are ignored; a missing required field
// or a field of the wrong type is an error naming it and `source`.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
// in_folder: a config.json found inside a folder (an export, a run): a symbolic link, a FIFO or a
// device there is refused (io/data_file.h); a path the user typed (--config) is followed.
ModelConfig load_config(const std::string& path, bool in_folder = false);
nlohmann::json config_to_json(const ModelConfig& c);
// Written through io::write_file_atomic: path is new or a regular file, never a link or device.
void save_config(const ModelConfig& c, const std::string& path);

// Named presets: "tiny" (the default training job), "test-moe" (1 dense + 2 MoE layers, E=8, k=2,
// one shared expert: the PyTorch reference config), "test-dense", ... (presets.cpp: one table)
ModelConfig preset(const std::string& name);
std::vector<std::string> preset_names();

// Parameter counts: total, and active per token (k routed + shared experts, not E).
struct ParamCounts {
  long long total = 0;
  long long active = 0;
};
ParamCounts count_params(const ModelConfig& c);

}  // namespace moe::model
