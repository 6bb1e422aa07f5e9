// Mixtral, Qwen2-MoE and Qwen3-MoE: config.json fields, layer rules and tensor names. See family.h.
#include "model/family.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/error.h"
#include "io/json_file.h"
#include "model/config_fields.h"

namespace moe::model {

using nlohmann::json;

namespace {

bool is_mixtral(const ModelConfig& c) { return c.model_type == "mixtral"; }
bool is_qwen(const ModelConfig& c) { return c.model_type == "qwen2_moe" || c.model_type == "qwen3_moe"; }

// A boolean field that must not be true (a feature this trainer does not have).
void refuse_true(const json& j, const char* name, const std::string& src, const char* why) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return;
  MOE_CHECK(it->is_boolean(), src, ": field \"", name, "\" must be true or false, got ", io::excerpt(*it));
  MOE_CHECK(!it->get<bool>(), src, ": ", name, " = true is not supported (", why, ")");
}

}  // namespace

bool is_supported_model_type(const std::string& t) {
  return t == "deepseek" || t == "deepseek_v2" || t == "deepseek_v3" || t == "mixtral" || t == "qwen2_moe" ||
         t == "qwen3_moe";
}

std::string supported_model_types() {
  return "deepseek, deepseek_v2, deepseek_v3, mixtral, qwen2_moe, qwen3_moe";
}

ModelConfig family_config_from_json(const json& j, const std::string& src) {
  ModelConfig c;
  read_field(j, "model_type", c.model_type, true, src);
  MOE_CHECK(is_supported_model_type(c.model_type), src, ": model_type ", io::quoted(c.model_type, 64),
            " is not supported for training (supported: ", supported_model_types(), ")");
  const bool mixtral = is_mixtral(c), qwen3 = c.model_type == "qwen3_moe";
  // The defaults are the HF config classes' (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig) where
  // a real config may leave a field out; the fields whose class defaults differ between families
  // and versions (num_key_value_heads, qwen3's head_dim) are required.
  c.rope_theta = mixtral ? 1e6f : 1e4f;
  c.rms_norm_eps = mixtral ? 1e-5f : 1e-6f;
  c.max_position_embeddings = mixtral ? 4096 * 32 : 32768;
  c.aux_loss_alpha = 0.001f;
  read_field(j, "vocab_size", c.vocab_size, true, src);
  read_field(j, "hidden_size", c.hidden_size, true, src);
  read_field(j, "num_hidden_layers", c.num_hidden_layers, true, src);
  read_field(j, "num_attention_heads", c.num_attention_heads, true, src);
  read_field(j, "num_key_value_heads", c.num_key_value_heads, true, src);
  read_field(j, "head_dim", c.head_dim_field, qwen3, src);
  read_field(j, "intermediate_size", c.intermediate_size, true, src);
  read_field(j, "num_experts_per_tok", c.num_experts_per_tok, true, src);
  read_field(j, "router_aux_loss_coef", c.aux_loss_alpha, false, src);
  read_field(j, "output_router_logits", c.output_router_logits, false, src);
  read_field(j, "rope_theta", c.rope_theta, false, src);
  read_field(j, "rms_norm_eps", c.rms_norm_eps, false, src);
  read_field(j, "max_position_embeddings", c.max_position_embeddings, false, src);
  read_field(j, "initializer_range", c.initializer_range, false, src);
  read_field(j, "sliding_window", c.sliding_window, false, src);
  read_tokenizer_fingerprint(j, src, c.tokenizer_fingerprint);
  if (mixtral) {
    // Every layer is sparse; intermediate_size is each expert's width; top-k weights always
    // renormalised (MixtralSparseMoeBlock: routing_weights /= routing_weights.sum()).
    read_field(j, "num_local_experts", c.n_routed_experts, true, src);
    c.moe_intermediate_size = c.intermediate_size;
    c.norm_topk_prob = true;
  } else {
    read_field(j, "num_experts", c.n_routed_experts, true, src);
    read_field(j, "moe_intermediate_size", c.moe_intermediate_size, c.n_routed_experts > 0, src);
    read_field(j, "norm_topk_prob", c.norm_topk_prob, false, src);
    read_field(j, "decoder_sparse_step", c.decoder_sparse_step, false, src);
    read_field(j, "use_sliding_window", c.use_sliding_window, false, src);
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      MOE_CHECK(it->is_array(), src, ": field \"mlp_only_layers\" must be a list of layer indices, got ",
                io::excerpt(*it));
      for (const json& v : *it) {
        MOE_CHECK(v.is_number_integer(), src, ": field \"mlp_only_layers\" must hold layer indices, got ",
                  io::excerpt(v));
        const int64_t l = v.get<int64_t>();
        MOE_CHECK(l >= 0 && l < c.num_hidden_layers, src, ": mlp_only_layers holds ", l,
                  ", outside the model's layers [0, ", c.num_hidden_layers, ")");
        c.mlp_only_layers.push_back(static_cast<int>(l));
      }
    }
    if (c.model_type == "qwen2_moe") {
      read_field(j, "shared_expert_intermediate_size", c.shared_expert_intermediate_size,
                 c.n_routed_experts > 0, src);
      c.n_shared_experts = c.shared_expert_intermediate_size > 0 ? 1 : 0;
    }
  }
  // What the families' HF code has but this trainer does not.
  refuse_true(j, "tie_word_embeddings", src, "the head has its own weights");
  if (c.model_type != "qwen2_moe")  // qwen2_moe has q/k/v biases whatever the field says
    refuse_true(j, "attention_bias", src, str_cat(c.model_type, " has no attention biases").c_str());
  for (const char* f : {"attention_dropout", "router_jitter_noise"}) {  // training-time noise
    float v = 0.0f;
    read_field(j, f, v, false, src);
    MOE_CHECK(v == 0.0f, src, ": ", f, " = ", v, " is not supported (moetrain trains without it)");
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null())
    throw Error(str_cat(src, ": rope_scaling = ", io::excerpt(*it), " is not supported (plain RoPE only)"));
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    MOE_CHECK(it->is_string() && it->get<std::string>() == "silu", src, ": hidden_act ",
              io::excerpt(*it), " is not supported (supported: silu)");
  }
  c.validate(src);
  return c;
}

json family_config_to_json(const ModelConfig& c) {
  const bool mixtral = is_mixtral(c), qwen2 = c.model_type == "qwen2_moe";
  const char* arch = mixtral ? "MixtralForCausalLM" : (qwen2 ? "Qwen2MoeForCausalLM" : "Qwen3MoeForCausalLM");
  json j = {{"architectures", {arch}},
            {"model_type", c.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"num_hidden_layers", c.num_hidden_layers},
            {"num_attention_heads", c.num_attention_heads},
            {"num_key_value_heads", c.kv_heads()},
            {"intermediate_size", mixtral ? c.moe_intermediate_size : c.intermediate_size},
            {"num_experts_per_tok", c.num_experts_per_tok},
            {"router_aux_loss_coef", float_json(c.aux_loss_alpha)},
            {"output_router_logits", c.output_router_logits},
            {"rope_theta", float_json(c.rope_theta)},
            {"rms_norm_eps", float_json(c.rms_norm_eps)},
            {"max_position_embeddings", c.max_position_embeddings},
            {"initializer_range", float_json(c.initializer_range)},
            {"sliding_window", c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr)},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"rope_scaling", nullptr},
            {"torch_dtype", "float32"}};
  if (c.head_dim_field > 0) j["head_dim"] = c.head_dim_field;
  if (mixtral) {
    j["num_local_experts"] = c.n_routed_experts;
  } else {
    j["num_experts"] = c.n_routed_experts;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["use_sliding_window"] = c.use_sliding_window;
    if (qwen2) {
      j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
    } else {
      j["attention_bias"] = false;
    }
  }
  if (!c.tokenizer_fingerprint.empty()) j["moetrain_tokenizer_fingerprint"] = c.tokenizer_fingerprint;
  return j;
}

void validate_family(const ModelConfig& c, const std::string& src) {
  const int nh = c.num_attention_heads, kv = c.kv_heads();
  MOE_CHECK(c.num_key_value_heads >= 0, src, ": \"num_key_value_heads\" must be positive, got ",
            c.num_key_value_heads);
  MOE_CHECK(nh % kv == 0, src, ": num_attention_heads (", nh, ") is not a multiple of num_key_value_heads (",
            kv, ")");
  MOE_CHECK(c.head_dim_field >= 0, src, ": \"head_dim\" must be positive, got ", c.head_dim_field);
  MOE_CHECK(static_cast<int64_t>(nh) * c.head_dim() <= INT_MAX / 4, src, ": num_attention_heads (", nh,
            ") * head_dim (", c.head_dim(), ") is too large");
  MOE_CHECK(c.aux_loss_alpha >= 0.0f, src, ": \"router_aux_loss_coef\" must be >= 0, got ", c.aux_loss_alpha);
  MOE_CHECK(c.sliding_window >= 0, src, ": \"sliding_window\" must be positive or null, got ", c.sliding_window);
  MOE_CHECK(c.decoder_sparse_step >= 1, src, ": \"decoder_sparse_step\" must be >= 1, got ",
            c.decoder_sparse_step);
  for (int l : c.mlp_only_layers)
    MOE_CHECK(l >= 0 && l < c.num_hidden_layers, src, ": mlp_only_layers holds ", l,
              ", outside the model's layers [0, ", c.num_hidden_layers, ")");
  // The DeepSeek-only router options keep their defaults (the families' HF code has none of them).
  MOE_CHECK(c.scoring_func == "softmax" && c.topk_method == "greedy" && c.n_group == 1 && !c.seq_aux &&
                c.routed_scaling_factor == 1.0f && c.first_k_dense_replace == 0 && c.moe_layer_freq == 1,
            src, ": model_type ", c.model_type, " routes by softmax, greedy top-k, one group, batch aux loss");
  MOE_CHECK(c.n_shared_experts == (c.gated_shared_expert() && c.shared_expert_intermediate_size > 0 ? 1 : 0),
            src, ": model_type ", c.model_type, " has ",
            c.gated_shared_expert() ? "one shared expert (shared_expert_intermediate_size)" : "no shared experts",
            ", got n_shared_experts = ", c.n_shared_experts);
  MOE_CHECK(c.shared_expert_intermediate_size >= 0, src, ": \"shared_expert_intermediate_size\" must be >= 0, got ",
            c.shared_expert_intermediate_size);
  // HF renormalises a single top-1 weight to 1 (w / w); moetrain's router, as DeepSeek's, skips
  // k = 1. No real config of these families routes to one expert.
  MOE_CHECK(c.num_moe_layers() == 0 || c.num_experts_per_tok > 1 || !c.norm_topk_prob, src,
            ": num_experts_per_tok = 1 with renormalised weights (", c.model_type,
            (is_mixtral(c) ? "" : ", norm_topk_prob"), ") is not supported");
  MOE_CHECK(!is_mixtral(c) || c.moe_intermediate_size == c.intermediate_size, src,
            ": mixtral's experts are intermediate_size wide");
}

bool family_is_moe_layer(const ModelConfig& c, int layer) {
  if (is_mixtral(c)) return true;
  // An unvalidated step (validate_family refuses < 1) must not divide by zero.
  return c.decoder_sparse_step >= 1 && (layer + 1) % c.decoder_sparse_step == 0 &&
         std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), layer) == c.mlp_only_layers.end();
}

float family_router_aux_alpha(const ModelConfig& c) {
  const int moe_layers = c.num_moe_layers();
  if (!c.output_router_logits || moe_layers == 0) return 0.0f;
  return c.aux_loss_alpha * static_cast<float>(c.num_experts_per_tok) / static_cast<float>(moe_layers);
}

int attention_window(const ModelConfig& c) {
  if (is_mixtral(c)) return c.sliding_window;
  if (is_qwen(c)) return c.use_sliding_window ? c.sliding_window : 0;
  return 0;
}

int64_t family_attention_params(const ModelConfig& c) {
  const std::string what = "the attention parameters of a layer";
  auto mul = [&](int64_t a, int64_t b) { return mul_or_throw<int64_t>(a, b, what); };
  auto add = [&](int64_t a, int64_t b) { return add_or_throw<int64_t>(a, b, what); };
  const int64_t A = mul(c.num_attention_heads, c.head_dim()), Akv = mul(c.kv_heads(), c.head_dim());
  int64_t n = mul(mul(2, c.hidden_size), add(A, Akv));  // q, o: [A,H], [H,A]; k, v: [Akv,H]
  if (c.qkv_bias()) n = add(n, add(A, mul(2, Akv)));
  if (c.qk_norm()) n = add(n, mul(2, c.head_dim()));
  return n;
}

int64_t family_shared_params(const ModelConfig& c) {
  const std::string what = "the shared expert parameters of a layer";
  const int64_t n = mul_or_throw<int64_t>(mul_or_throw<int64_t>(3, c.hidden_size, what), c.shared_ffn(), what);
  return c.gated_shared_expert() && c.shared_ffn() > 0 ? add_or_throw<int64_t>(n, c.hidden_size, what) : n;
}

namespace {
std::string block_prefix(const ModelConfig& c, int layer) {
  return "model.layers." + std::to_string(layer) + (is_mixtral(c) ? ".block_sparse_moe." : ".mlp.");
}
const char* proj_name(const ModelConfig& c, Proj p) {
  if (is_mixtral(c)) return p == Proj::kGate ? "w1" : (p == Proj::kUp ? "w3" : "w2");
  return p == Proj::kGate ? "gate_proj" : (p == Proj::kUp ? "up_proj" : "down_proj");
}
}  // namespace

std::string router_name(const ModelConfig& c, int layer) { return block_prefix(c, layer) + "gate.weight"; }

std::string expert_name(const ModelConfig& c, int layer, int expert, Proj p) {
  return block_prefix(c, layer) + "experts." + std::to_string(expert) + "." + proj_name(c, p) + ".weight";
}

std::string shared_name(const ModelConfig& c, int layer, Proj p) {
  return block_prefix(c, layer) + (c.gated_shared_expert() ? "shared_expert." : "shared_experts.") +
         proj_name(c, p) + ".weight";
}

std::string shared_gate_name(const ModelConfig& c, int layer) {
  return block_prefix(c, layer) + "shared_expert_gate.weight";
}

}  // namespace moe::model
