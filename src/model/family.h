// Model families beside DeepSeek-MoE: Mixtral (model_type "mixtral"), Qwen2-MoE ("qwen2_moe") and
// Qwen3-MoE ("qwen3_moe"). This is the one place that knows a family's Hugging Face config.json
// field names (read and written back with them) and its tensor names (ParamLayout asks here), and
// the small rules that differ: which layers are MoE, the aux loss's form, the attention's shape.
// The math is the model's (model.h): each family is a DeepSeek-MoE model with some of these on:
//   grouped-query attention (num_key_value_heads), an explicit head_dim, biases on q/k/v
//   (qwen2_moe), RMSNorm of each q and k head before RoPE (qwen3_moe), one shared expert scaled by
//   sigmoid(x · shared_expert_gate) (qwen2_moe), renormalised top-k weights (mixtral always).
// docs/families.md lists the fields, the names and the documented differences from HF.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"

namespace moe::model {

bool is_supported_model_type(const std::string& model_type);
std::string supported_model_types();  // "deepseek, mixtral, qwen2_moe, qwen3_moe"

// config.json of a non-DeepSeek family -> ModelConfig (validated), and back with the family's
// own field names. An unknown model_type, or a field this trainer cannot honour (tied
// embeddings, rope_scaling, attention biases the family does not have, another activation), is
// an error naming the field and its value.
ModelConfig family_config_from_json(const nlohmann::json& j, const std::string& src);
nlohmann::json family_config_to_json(const ModelConfig& c);
void validate_family(const ModelConfig& c, const std::string& src);

// Layer rules of the families (ModelConfig::is_moe_layer and router_aux_alpha call these).
// Mixtral: every layer. Qwen: (layer + 1) % decoder_sparse_step == 0 and not in mlp_only_layers.
bool family_is_moe_layer(const ModelConfig& c, int layer);
// HF's load_balancing_loss_func (Mixtral, Qwen2-MoE, Qwen3-MoE), added only when
// output_router_logits, as coef · E · sum_e f_e · P_e with f_e = the fraction of the T·k
// (token, slot) pairs that chose e and P_e the mean softmax score. HF pools f and P over the
// tokens of ALL layers; moetrain takes the mean over MoE layers of the per-layer value (equal
// when there is one MoE layer, or when every layer routes alike; docs/families.md). As a
// DeepSeek per-layer aux loss (router.h: alpha · sum_e count_e·E/(T·k) · P_e) that is
// alpha = coef · k / (number of MoE layers).
float family_router_aux_alpha(const ModelConfig& c);
// The attention window that applies (0: none): mixtral's sliding_window, qwen's when
// use_sliding_window. A sequence longer than it is refused (the model has full causal attention).
int attention_window(const ModelConfig& c);

// Parameters of one layer's attention (q, k, v, o, biases, q/k norms; not the layer norms), and of
// an MoE layer's shared expert(s) with their gate, checked for overflow.
int64_t family_attention_params(const ModelConfig& c);
int64_t family_shared_params(const ModelConfig& c);

// Tensor names of an MoE layer (every family). DeepSeek: mlp.gate, mlp.experts.E.{gate,up,down}_proj,
// mlp.shared_experts.*; Mixtral: block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2};
// Qwen2-MoE: mlp.gate, mlp.experts.E.*_proj, mlp.shared_expert.*_proj, mlp.shared_expert_gate.
// The rest (embedding, attention, norms, dense MLP, head) is named alike in every family.
enum class Proj {
  kGate,
  kUp,
  kDown
};
std::string router_name(const ModelConfig& c, int layer);
std::string expert_name(const ModelConfig& c, int layer, int expert, Proj p);
std::string shared_name(const ModelConfig& c, int layer, Proj p);
std::string shared_gate_name(const ModelConfig& c, int layer);  // qwen2_moe only

}  // namespace moe::model
