// Hugging Face config.json readers for the planner: the fields that size memory and time, per
// model_type. deepseek goes through the trainer's own reader (so what the planner plans is what
// `moetrain train --config` runs); the others are read here. Errors name the file and the field.
//   deepseek      DeepSeek-MoE: model::config_from_json
//   deepseek_v2/3 + multi-head latent attention (q_lora_rank may be null: plain q projection)
//   mixtral       num_local_experts, intermediate_size = expert width, every layer MoE, GQA
//   qwen2_moe     num_experts, moe_intermediate_size, shared_expert_intermediate_size (+ gate),
//                 decoder_sparse_step / mlp_only_layers, qkv bias, GQA
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"
#include "plan/plan_model.h"

namespace moe::plan {
namespace {

using nlohmann::json;

class Reader {
 public:
  Reader(const json& j, std::string src) : j_(j), src_(std::move(src)) {}
  bool has(const char* f) const { return j_.contains(f) && !j_[f].is_null(); }
  // A whole number (32 or 32.0) within int32: every field read here is an int of PlanModel, and
  // casting a double or an int64 outside that range would be undefined or wrap silently.
  long long integer(const char* f) const {
    MOE_CHECK(has(f), src_, ": missing field \"", f, "\"");
    const json& v = j_[f];
    MOE_CHECK(v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
              src_, ": field \"", f, "\" must be an integer, got ", io::excerpt(v));
    const double d = v.get<double>();
    MOE_CHECK(d >= std::numeric_limits<int>::min() && d <= std::numeric_limits<int>::max(), src_,
              ": field \"", f, "\" = ", io::excerpt(v), " is out of range [", std::numeric_limits<int>::min(),
              ", ", std::numeric_limits<int>::max(), "]");
    return v.is_number_integer() ? v.get<long long>() : static_cast<long long>(d);
  }
  long long integer(const char* f, long long dflt) const { return has(f) ? integer(f) : dflt; }
  int positive(const char* f) const {
    long long v = integer(f);
    MOE_CHECK(v > 0, src_, ": field \"", f, "\" must be positive, got ", v);
    return static_cast<int>(v);
  }
  int non_negative(const char* f, long long dflt) const {
    long long v = integer(f, dflt);
    MOE_CHECK(v >= 0, src_, ": field \"", f, "\" must be >= 0, got ", v);
    return static_cast<int>(v);
  }
  bool boolean(const char* f, bool dflt) const {
    if (!has(f)) return dflt;
    MOE_CHECK(j_[f].is_boolean(), src_, ": field \"", f, "\" must be true or false, got ", io::excerpt(j_[f]));
    return j_[f].get<bool>();
  }
  const json& raw(const char* f) const { return j_[f]; }
  const std::string& src() const { return src_; }

 private:
  const json& j_;
  std::string src_;
};

void common_fields(PlanModel& m, const Reader& r) {
  m.vocab_size = r.positive("vocab_size");
  m.hidden = r.positive("hidden_size");
  m.layers = r.positive("num_hidden_layers");
  // The planner walks every layer for every candidate layout: bound it as the trainer does.
  MOE_CHECK(m.layers <= (1 << 20), r.src(), ": field \"num_hidden_layers\" = ", m.layers,
            " is more than the ", 1 << 20, " layers the planner models");
  m.heads = r.positive("num_attention_heads");
  m.kv_heads = r.has("num_key_value_heads") ? r.positive("num_key_value_heads") : m.heads;
  MOE_CHECK(m.hidden % m.heads == 0 || r.has("head_dim"), r.src(), ": hidden_size (", m.hidden,
            ") is not divisible by num_attention_heads (", m.heads, ") and there is no head_dim");
  m.head_dim = r.has("head_dim") ? r.positive("head_dim") : m.hidden / m.heads;
  m.tied_embeddings = r.boolean("tie_word_embeddings", false);
  m.max_position_embeddings = static_cast<int>(r.integer("max_position_embeddings", 4096));
  m.default_seq_len = std::min(4096, m.max_position_embeddings);
}

PlanModel read_deepseek_v23(const Reader& r, const std::string& type) {
  PlanModel m;
  m.model_type = type;
  common_fields(m, r);
  m.dense_ffn = r.positive("intermediate_size");
  m.moe_ffn = r.positive("moe_intermediate_size");
  m.experts = r.positive("n_routed_experts");
  m.top_k = r.positive("num_experts_per_tok");
  m.shared_ffn = r.non_negative("n_shared_experts", 0) * m.moe_ffn;
  const int first_dense = r.non_negative("first_k_dense_replace", 0);
  const int freq = r.has("moe_layer_freq") ? r.positive("moe_layer_freq") : 1;
  for (int l = 0; l < m.layers; ++l) m.moe_layer.push_back(l >= first_dense && l % freq == 0);
  m.q_lora_rank = r.non_negative("q_lora_rank", 0);  // null in V2-Lite: a plain q projection
  m.kv_lora_rank = r.positive("kv_lora_rank");
  m.qk_nope_head_dim = r.positive("qk_nope_head_dim");
  m.qk_rope_head_dim = r.positive("qk_rope_head_dim");
  m.v_head_dim = r.positive("v_head_dim");
  m.head_dim = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2;
  m.kv_heads = m.heads;
  return m;
}

PlanModel read_mixtral(const Reader& r) {
  PlanModel m;
  m.model_type = "mixtral";
  common_fields(m, r);
  m.moe_ffn = r.positive("intermediate_size");
  m.experts = r.positive("num_local_experts");
  m.top_k = r.positive("num_experts_per_tok");
  m.moe_layer.assign(m.layers, true);
  return m;
}

PlanModel read_qwen2_moe(const Reader& r) {
  PlanModel m;
  m.model_type = "qwen2_moe";
  common_fields(m, r);
  m.dense_ffn = static_cast<int>(r.integer("intermediate_size", 0));
  m.moe_ffn = r.positive("moe_intermediate_size");
  m.experts = r.positive("num_experts");
  m.top_k = r.positive("num_experts_per_tok");
  m.shared_ffn = r.non_negative("shared_expert_intermediate_size", 0);
  m.shared_expert_gate = m.shared_ffn > 0;
  m.qkv_bias = true;
  const int step = r.has("decoder_sparse_step") ? r.positive("decoder_sparse_step") : 1;
  std::vector<bool> mlp_only(m.layers, false);
  if (r.has("mlp_only_layers")) {
    const json& a = r.raw("mlp_only_layers");
    MOE_CHECK(a.is_array(), r.src(), ": field \"mlp_only_layers\" must be a list of layer indices");
    for (const json& v : a) {
      // get<int64_t>, not get<int>: 4294967296 must not wrap to layer 0.
      MOE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < m.layers, r.src(),
                ": \"mlp_only_layers\" holds ", io::excerpt(v), ", not a layer index in [0, ", m.layers, ")");
      mlp_only[static_cast<size_t>(v.get<int64_t>())] = true;
    }
  }
  // Qwen2MoeDecoderLayer: MoE when not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
  for (int l = 0; l < m.layers; ++l) m.moe_layer.push_back(!mlp_only[l] && (l + 1) % step == 0);
  return m;
}

}  // namespace

PlanModel read_hf_config(const std::string& path) {
  const json j = io::read_json_file(path, "config file");
  MOE_CHECK(j.is_object(), path, ": a config must be a JSON object");
  MOE_CHECK(j.contains("model_type") && j["model_type"].is_string(), path,
            ": missing field \"model_type\" (supported: deepseek, deepseek_v2, deepseek_v3, "
            "mixtral, qwen2_moe, qwen3_moe)");
  const std::string type = j["model_type"].get<std::string>();
  Reader r(j, path);
  PlanModel m;
  if (type == "deepseek") {
    m = from_model_config(model::config_from_json(j, path), path, "--config " + path);
    m.default_seq_len = std::min(4096, m.max_position_embeddings);
  } else if (type == "deepseek_v2" || type == "deepseek_v3") {
    m = read_deepseek_v23(r, type);
  } else if (type == "mixtral") {
    m = read_mixtral(r);
  } else if (type == "qwen2_moe") {
    m = read_qwen2_moe(r);
  } else if (type == "qwen3_moe") {
    // A family the trainer reads (model/family.h): planned as the model `train --config` runs.
    m = from_model_config(model::config_from_json(j, path), path, "--config " + path);
    m.default_seq_len = std::min(4096, m.max_position_embeddings);
  } else {
    throw Error(str_cat(path, ": model_type \"", type, "\" is not supported by the planner ",
                        "(supported: deepseek, deepseek_v2, deepseek_v3, mixtral, qwen2_moe, qwen3_moe)"));
  }
  m.name = path;
  m.validate(path);
  return m;
}

}  // namespace moe::plan
