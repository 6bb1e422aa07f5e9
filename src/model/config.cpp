#include "model/config.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/checked_math.h"
#include "core/error.h"
#include "io/json_file.h"
#include "io/output_file.h"
#include "model/config_fields.h"
#include "model/family.h"

namespace moe::model {
namespace {

using nlohmann::json;

// Parameters a config may describe: 16 bytes each (weights, gradients, AdamW m, v) must fit in
// int64 with room to spare. 2^58 is far beyond any real model (DeepSeek-V3: 6.7e11 < 2^40).
constexpr int64_t kMaxParams = int64_t{1} << 58;
// Named tensors (ParamLayout entries, manifest index rows): each costs a name and a spec in
// memory before any parameter is allocated. DeepSeek-V3 has about 45k, Kimi K2 about 70k.
constexpr int64_t kMaxTensors = int64_t{1} << 20;

}  // namespace

// Every size the config implies, checked before anything is sized from it: each shape's numel,
// the parameter total and its bytes (weights, gradients, AdamW m and v: 16 bytes a parameter)
// stay below kMaxParams, and the number of named tensors below kMaxTensors. An overflow names
// the fields whose product it is, instead of wrapping to a small size that a buffer is then
// allocated with (and written past).
static void check_sizes(const ModelConfig& c, const std::string& src) {
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t F = c.moe_intermediate_size, E = c.n_routed_experts, S = c.n_shared_experts;
  auto mul = [&](int64_t a, int64_t b, const char* what) {
    int64_t p = 0;
    MOE_CHECK(checked_mul(a, b, &p) && p <= kMaxParams, src, ": ", what, " = ", a, " * ", b,
              " exceeds ", kMaxParams, " parameters (the model's byte sizes would overflow)");
    return p;
  };
  auto add = [&](int64_t a, int64_t b, const char* what) {
    MOE_CHECK(a + b <= kMaxParams, src, ": ", what, " exceeds ", kMaxParams,
              " parameters (the model's byte sizes would overflow)");
    return a + b;  // both <= kMaxParams < 2^62: no overflow
  };
  const int64_t embed = mul(V, H, "vocab_size * hidden_size");
  int64_t total = add(mul(2, embed, "2 * vocab_size * hidden_size"), H, "the embedding + head parameters");
  int64_t attention = 0;
  if (c.uses_mla()) {
    // q (through its latent or not), kv_a and its norm, kv_b, o_proj, the two layer norms.
    const int64_t nh = c.num_attention_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
    const int64_t qk = mul(nh, c.qk_head_dim(), "num_attention_heads * qk head dim");
    const int64_t q = rq > 0 ? add(add(mul(H, rq, "hidden_size * q_lora_rank"), rq, "q_a"),
                                   mul(rq, qk, "q_lora_rank * heads * qk head dim"), "the query's parameters")
                             : mul(H, qk, "hidden_size * heads * qk head dim");
    // clang-format off
    const int64_t kv = add(mul(H, rkv + c.qk_rope_head_dim, "hidden_size * (kv_lora_rank + qk_rope_head_dim)"),
                           add(rkv, mul(rkv, mul(nh, c.qk_nope_head_dim + c.v_head_dim,
                                                 "heads * (qk_nope_head_dim + v_head_dim)"),
                                        "kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim)"),
                               "kv_b"),
                           "the key and value parameters");
    const int64_t o = mul(H, mul(nh, c.v_head_dim, "heads * v_head_dim"), "hidden_size * heads * v_head_dim");
    attention = add(add(add(q, kv, "the attention parameters of a layer"), o,
                        "the attention parameters of a layer"), 2 * H, "the attention parameters of a layer");
    // clang-format on
  } else {
    attention = c.is_deepseek()
                    ? add(mul(4 * H, H, "4 * hidden_size * hidden_size"), 2 * H, "the attention parameters of a layer")
                    : add(family_attention_params(c), 2 * H, "the attention parameters of a layer");
  }
  int64_t tensors = 3;
  const int moe_layers = c.num_moe_layers();
  const int dense_layers = c.num_hidden_layers - moe_layers;
  total = add(total, mul(c.num_hidden_layers, attention, "num_hidden_layers * attention parameters"),
              "the parameter count");
  tensors += int64_t{6} * c.num_hidden_layers;
  if (dense_layers > 0) {
    const int64_t dense = mul(3 * H, I, "3 * hidden_size * intermediate_size");
    total = add(total, mul(dense_layers, dense, "dense layers * intermediate_size * hidden_size * 3"),
                "the parameter count");
    tensors += int64_t{3} * dense_layers;
  }
  if (moe_layers > 0) {
    const int64_t expert = mul(3 * H, F, "3 * hidden_size * moe_intermediate_size");
    const int64_t experts =
        c.is_deepseek() ? mul(expert, E + S, "expert parameters * (n_routed_experts + n_shared_experts)")
                        : add(mul(expert, E, "expert parameters * num_experts"), family_shared_params(c),
                              "the expert parameters of an MoE layer");
    const int64_t layer = add(experts, mul(E, H, "n_routed_experts * hidden_size"),
                              "the parameters of an MoE layer");
    total = add(total, mul(moe_layers, layer, "MoE layers * parameters per MoE layer"),
                "the parameter count");
    MOE_CHECK(E <= kMaxTensors && tensors + moe_layers * (1 + 3 * (E + (S > 0))) <= kMaxTensors,
              src, ": n_routed_experts = ", E, " over ", moe_layers, " MoE layers gives more than ",
              kMaxTensors, " named tensors");
  }
}

// Group-limited routing must name whole groups, a method that uses them, and leave k experts.
static void validate_groups(const ModelConfig& c, const std::string& src) {
  const int E = c.n_routed_experts, n = c.n_group, g = c.topk_group;
  MOE_CHECK(n >= 1, src, ": \"n_group\" must be >= 1, got ", n);
  MOE_CHECK(g >= 1, src, ": \"topk_group\" must be >= 1, got ", g);
  MOE_CHECK(g <= n, src, ": topk_group (", g, ") exceeds n_group (", n, ")");
  MOE_CHECK(E % n == 0, src, ": n_group (", n, ") does not divide n_routed_experts (", E, ")");
  if (n == 1) return;
  MOE_CHECK(c.topk_method != "greedy", src, ": n_group = ", n, " needs topk_method ",
            "\"group_limited_greedy\" (softmax) or \"noaux_tc\" (sigmoid); \"greedy\" ignores groups");
  MOE_CHECK(static_cast<long long>(g) * (E / n) >= c.num_experts_per_tok, src, ": topk_group (", g,
            ") * n_routed_experts / n_group (", E / n, ") = ", static_cast<long long>(g) * (E / n),
            " experts cannot hold num_experts_per_tok (", c.num_experts_per_tok, ")");
  MOE_CHECK(c.topk_method != "noaux_tc" || E / n >= 2, src, ": n_group (", n,
            ") leaves 1 expert per group, but noaux_tc scores a group by its top 2 experts");
}

// Multi-head latent attention's dimensions, and the YaRN fields it reads.
static void validate_mla(const ModelConfig& c, const std::string& src) {
  auto positive = [&](const char* name, long long v) {
    MOE_CHECK(v > 0, src, ": \"", name, "\" must be positive for ", c.model_type, ", got ", v);
  };
  positive("kv_lora_rank", c.kv_lora_rank);
  positive("qk_rope_head_dim", c.qk_rope_head_dim);
  positive("v_head_dim", c.v_head_dim);
  MOE_CHECK(c.q_lora_rank >= 0, src, ": \"q_lora_rank\" must be >= 0 (0 or null: no query latent), got ",
            c.q_lora_rank);
  MOE_CHECK(c.qk_nope_head_dim >= 0, src, ": \"qk_nope_head_dim\" must be >= 0, got ", c.qk_nope_head_dim);
  MOE_CHECK(c.qk_rope_head_dim % 2 == 0, src, ": \"qk_rope_head_dim\" = ", c.qk_rope_head_dim,
            " must be even for rotary embeddings");
  // Bounded so that per-head products below stay far from overflow (V3: 128, 64, 128).
  for (auto [name, v] : {std::pair<const char*, int>{"qk_nope_head_dim", c.qk_nope_head_dim},
                         {"qk_rope_head_dim", c.qk_rope_head_dim},
                         {"v_head_dim", c.v_head_dim}})
    MOE_CHECK(v <= 4096, src, ": \"", name, "\" = ", v, " exceeds 4096");
  const ModelConfig::RopeScaling& r = c.rope_scaling;
  if (r.type.empty()) return;
  MOE_CHECK(r.type == "yarn", src, ": rope_scaling type ", io::quoted(r.type, 64),
            " is not supported (supported: yarn, or rope_scaling null)");
  MOE_CHECK(std::isfinite(r.factor) && r.factor >= 1.0, src, ": rope_scaling.factor must be >= 1, got ", r.factor);
  for (auto [name, v] : {std::pair<const char*, double>{"mscale", r.mscale},
                         {"mscale_all_dim", r.mscale_all_dim},
                         {"beta_fast", r.beta_fast},
                         {"beta_slow", r.beta_slow}})
    MOE_CHECK(std::isfinite(v) && v >= 0.0, src, ": rope_scaling.", name, " must be a number >= 0, got ", v);
  MOE_CHECK(r.beta_fast > r.beta_slow && r.beta_slow > 0.0, src, ": rope_scaling needs beta_fast (",
            r.beta_fast, ") > beta_slow (", r.beta_slow, ") > 0");
  MOE_CHECK(r.original_max_position_embeddings > 0, src,
            ": rope_scaling.original_max_position_embeddings must be positive, got ",
            r.original_max_position_embeddings);
}

// YaRN's attention temperature: 0.1·m·ln(factor) + 1 for factor > 1 (HF yarn_get_mscale).
static double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

double ModelConfig::softmax_scale() const {
  double s = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope_scaling.type == "yarn" && rope_scaling.mscale_all_dim != 0.0) {
    const double m = yarn_mscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (n_routed_experts <= 0) return false;
  if (!is_deepseek()) return family_is_moe_layer(*this, layer);  // model/family.h
  return layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

float ModelConfig::router_aux_alpha() const {
  return is_deepseek() ? aux_loss_alpha : family_router_aux_alpha(*this);
}

int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (int i = 0; i < num_hidden_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

void ModelConfig::validate(const std::string& src) const {
  auto positive = [&](const char* name, long long v) {
    MOE_CHECK(v > 0, src, ": \"", name, "\" must be positive, got ", v);
  };
  MOE_CHECK(is_supported_model_type(model_type), src, ": model_type ", io::quoted(model_type, 64),
            " is not supported for training (supported: ", supported_model_types(), ")");
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("max_position_embeddings", max_position_embeddings);
  // Each layer has at least 9 named tensors; bounding the layers first keeps the loops over
  // layers below (and in check_sizes) short.
  MOE_CHECK(num_hidden_layers <= kMaxTensors / 9, src, ": \"num_hidden_layers\" = ",
            num_hidden_layers, " gives more than ", kMaxTensors, " named tensors");
  if (uses_mla()) {
    validate_mla(*this, src);
  } else {
    MOE_CHECK(head_dim_field > 0 || hidden_size % num_attention_heads == 0, src, ": hidden_size (", hidden_size,
              ") is not divisible by num_attention_heads (", num_attention_heads, ")");
    if (!is_deepseek()) validate_family(*this, src);  // model/family.h: heads, windows, layers
    MOE_CHECK(head_dim() % 2 == 0, src, ": head_dim = hidden_size / num_attention_heads = ", head_dim(),
              " must be even for rotary embeddings");
    MOE_CHECK(kv_lora_rank == 0 && q_lora_rank == 0, src,
              ": kv_lora_rank / q_lora_rank (multi-head latent attention) need model_type deepseek_v2 or deepseek_v3, "
              "not ",
              io::quoted(model_type, 64));
    MOE_CHECK(rope_scaling.type.empty(), src, ": rope_scaling ", io::quoted(rope_scaling.type, 64),
              " is not supported for model_type ", io::quoted(model_type, 64), " (YaRN: deepseek_v2 / deepseek_v3)");
  }
  MOE_CHECK(num_nextn_predict_layers == 0 || num_nextn_predict_layers == 1, src,
            ": \"num_nextn_predict_layers\" = ", num_nextn_predict_layers,
            " is not supported (multi-token prediction of depth 0 or 1)");
  MOE_CHECK(num_nextn_predict_layers == 0 || model_type == "deepseek_v3", src,
            ": num_nextn_predict_layers (multi-token prediction) needs model_type deepseek_v3");
  MOE_CHECK(n_routed_experts >= 0, src, ": \"n_routed_experts\" must be >= 0, got ", n_routed_experts);
  MOE_CHECK(first_k_dense_replace >= 0, src, ": \"first_k_dense_replace\" must be >= 0, got ",
            first_k_dense_replace);
  positive("moe_layer_freq", moe_layer_freq);
  bool any_dense = false;
  for (int i = 0; i < num_hidden_layers; ++i) any_dense |= !is_moe_layer(i);
  if (any_dense) positive("intermediate_size", intermediate_size);
  if (num_moe_layers() > 0) {
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("num_experts_per_tok", num_experts_per_tok);
    MOE_CHECK(num_experts_per_tok <= n_routed_experts, src, ": num_experts_per_tok (",
              num_experts_per_tok, ") exceeds n_routed_experts (", n_routed_experts, ")");
    MOE_CHECK(n_shared_experts >= 0, src, ": \"n_shared_experts\" must be >= 0, got ",
              n_shared_experts);
    MOE_CHECK(scoring_func == "softmax" || scoring_func == "sigmoid", src, ": scoring_func ",
              io::quoted(scoring_func, 64), " is not supported (supported: softmax, sigmoid)");
    MOE_CHECK(topk_method == "greedy" || topk_method == "group_limited_greedy" ||
                  topk_method == "noaux_tc",
              src, ": topk_method ", io::quoted(topk_method, 64),
              " is not supported (supported: greedy, group_limited_greedy, noaux_tc)");
    MOE_CHECK((scoring_func == "sigmoid") == (topk_method == "noaux_tc"), src,
              ": scoring_func \"", scoring_func, "\" is not supported with topk_method \"",
              topk_method, "\" (sigmoid goes with noaux_tc, softmax with greedy or group_limited_greedy)");
    validate_groups(*this, src);
    MOE_CHECK(routed_scaling_factor > 0.0f, src, ": \"routed_scaling_factor\" must be positive, got ",
              routed_scaling_factor);
    MOE_CHECK(bias_update_speed >= 0.0f, src, ": \"bias_update_speed\" must be >= 0, got ",
              bias_update_speed);
    MOE_CHECK(aux_loss_alpha >= 0.0f, src, ": \"aux_loss_alpha\" must be >= 0, got ", aux_loss_alpha);
  }
  MOE_CHECK(rms_norm_eps > 0.0f, src, ": \"rms_norm_eps\" must be positive, got ", rms_norm_eps);
  MOE_CHECK(rope_theta > 0.0f, src, ": \"rope_theta\" must be positive, got ", rope_theta);
  check_sizes(*this, src);
}

void read_tokenizer_fingerprint(const json& j, const std::string& src, std::string& out) {
  read_field(j, "moetrain_tokenizer_fingerprint", out, false, src);
  // "<kind>-<vocab>-<16 hex>" (io/token_corpus.h), checked for its characters and length only
  MOE_CHECK(out.size() <= 64 && out.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") == std::string::npos,
            src, ": field \"moetrain_tokenizer_fingerprint\" must be a tokenizer fingerprint "
                 "(<kind>-<vocab>-<16 hex digits>), got ",
            io::excerpt(j.at("moetrain_tokenizer_fingerprint")));
}

ModelConfig config_from_json(const json& j, const std::string& src) {
  MOE_CHECK(j.is_object(), src, ": a config must be a JSON object");
  ModelConfig c;
  read_field(j, "model_type", c.model_type, false, src);
  if (!c.is_deepseek()) return family_config_from_json(j, src);  // model/family.h
  read_field(j, "vocab_size", c.vocab_size, true, src);
  read_field(j, "hidden_size", c.hidden_size, true, src);
  read_field(j, "num_hidden_layers", c.num_hidden_layers, true, src);
  read_field(j, "num_attention_heads", c.num_attention_heads, true, src);
  read_field(j, "intermediate_size", c.intermediate_size, false, src);
  read_field(j, "moe_intermediate_size", c.moe_intermediate_size, false, src);
  read_field(j, "n_routed_experts", c.n_routed_experts, false, src);
  read_field(j, "n_shared_experts", c.n_shared_experts, false, src);
  read_field(j, "num_experts_per_tok", c.num_experts_per_tok, false, src);
  read_field(j, "first_k_dense_replace", c.first_k_dense_replace, false, src);
  read_field(j, "moe_layer_freq", c.moe_layer_freq, false, src);
  read_field(j, "norm_topk_prob", c.norm_topk_prob, false, src);
  read_field(j, "scoring_func", c.scoring_func, false, src);
  read_field(j, "topk_method", c.topk_method, false, src);
  read_field(j, "routed_scaling_factor", c.routed_scaling_factor, false, src);
  read_field(j, "n_group", c.n_group, false, src);
  read_field(j, "topk_group", c.topk_group, false, src);
  read_field(j, "bias_update_speed", c.bias_update_speed, false, src);
  read_field(j, "aux_loss_alpha", c.aux_loss_alpha, false, src);
  read_field(j, "seq_aux", c.seq_aux, false, src);
  read_field(j, "rope_theta", c.rope_theta, false, src);
  read_field(j, "rms_norm_eps", c.rms_norm_eps, false, src);
  read_field(j, "max_position_embeddings", c.max_position_embeddings, false, src);
  read_field(j, "initializer_range", c.initializer_range, false, src);
  read_tokenizer_fingerprint(j, src, c.tokenizer_fingerprint);
  // Read for every model_type, so that a latent on a deepseek (V1) config is refused, not ignored.
  read_field(j, "kv_lora_rank", c.kv_lora_rank, c.uses_mla(), src);
  read_field(j, "q_lora_rank", c.q_lora_rank, false, src);  // null: no query latent (V2-Lite)
  if (c.uses_mla()) {
    read_field(j, "qk_nope_head_dim", c.qk_nope_head_dim, true, src);
    read_field(j, "qk_rope_head_dim", c.qk_rope_head_dim, true, src);
    read_field(j, "v_head_dim", c.v_head_dim, true, src);
  }
  // Read for every model_type: a scaling the model would not apply is refused by validate().
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    MOE_CHECK(it->is_object(), src, ": field \"rope_scaling\" must be an object or null, got ", io::excerpt(*it));
    const std::string sub = src + ": rope_scaling";
    ModelConfig::RopeScaling& r = c.rope_scaling;
    // "type" (DeepSeek's own configs) or "rope_type" (newer transformers)
    read_field(*it, it->contains("rope_type") ? "rope_type" : "type", r.type, true, sub);
    read_field(*it, "factor", r.factor, true, sub);
    read_field(*it, "mscale", r.mscale, false, sub);
    read_field(*it, "mscale_all_dim", r.mscale_all_dim, false, sub);
    read_field(*it, "beta_fast", r.beta_fast, false, sub);
    read_field(*it, "beta_slow", r.beta_slow, false, sub);
    read_field(*it, "original_max_position_embeddings", r.original_max_position_embeddings, false, sub);
    MOE_CHECK(!r.type.empty(), sub, ": \"type\" must name the scaling (yarn)");
  }
  read_field(j, "num_nextn_predict_layers", c.num_nextn_predict_layers, false, src);
  if (c.n_routed_experts > 0) {
    // These are required exactly when the model has MoE layers.
    read_field(j, "moe_intermediate_size", c.moe_intermediate_size, true, src);
    read_field(j, "num_experts_per_tok", c.num_experts_per_tok, true, src);
  }
  if (auto it = j.find("num_key_value_heads"); it != j.end() && !it->is_null()) {
    int kv = 0;
    read_field(j, "num_key_value_heads", kv, false, src);
    MOE_CHECK(kv == c.num_attention_heads, src, ": num_key_value_heads (", kv,
              ") != num_attention_heads (", c.num_attention_heads,
              "): grouped-query attention is not supported");
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean()) {
    MOE_CHECK(!it->get<bool>(), src, ": tie_word_embeddings = true is not supported");
  }
  if (auto it = j.find("attention_bias"); it != j.end() && it->is_boolean()) {
    MOE_CHECK(!it->get<bool>(), src, ": attention_bias = true is not supported");
  }
  if (auto it = j.find("hidden_act"); it != j.end() && it->is_string()) {
    MOE_CHECK(it->get<std::string>() == "silu", src, ": hidden_act \"", it->get<std::string>(),
              "\" is not supported (supported: silu)");
  }
  c.validate(src);
  return c;
}

ModelConfig load_config(const std::string& path, bool in_folder) {
  return config_from_json(io::read_json_file(path, "config file", /*no_follow=*/in_folder), path);
}

static json config_json_common(const ModelConfig& c);  // every field but the balancing ones

json config_to_json(const ModelConfig& c) {
  if (!c.is_deepseek()) return family_config_to_json(c);  // model/family.h
  json j = config_json_common(c);
  // The router fields of aux-loss-free balancing and of group limits only when not the defaults:
  // a config (and a checkpoint manifest, which resume compares key by key) written before they
  // existed stays equal.
  if (c.topk_method != "greedy") j["topk_method"] = c.topk_method;
  if (c.routed_scaling_factor != 1.0f) j["routed_scaling_factor"] = float_json(c.routed_scaling_factor);
  if (c.bias_update_speed != 1e-3f) j["bias_update_speed"] = float_json(c.bias_update_speed);
  if (c.n_group != 1 || c.topk_group != 1) {
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
  }
  if (c.uses_mla()) {
    j["architectures"] = {c.model_type == "deepseek_v3" ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
    j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["rope_scaling"] = nullptr;
    if (!c.rope_scaling.type.empty()) {
      const ModelConfig::RopeScaling& r = c.rope_scaling;
      j["rope_scaling"] = {{"type", r.type},
                           {"factor", r.factor},
                           {"mscale", r.mscale},
                           {"mscale_all_dim", r.mscale_all_dim},
                           {"beta_fast", r.beta_fast},
                           {"beta_slow", r.beta_slow},
                           {"original_max_position_embeddings", r.original_max_position_embeddings}};
    }
    if (c.model_type == "deepseek_v3") j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  }
  // The tokenizer the model was trained with (issue 42, class 4), when known.
  if (!c.tokenizer_fingerprint.empty()) j["moetrain_tokenizer_fingerprint"] = c.tokenizer_fingerprint;
  return j;
}

static json config_json_common(const ModelConfig& c) {
  return json{{"architectures", {"DeepseekForCausalLM"}},
              {"model_type", c.model_type},
              {"vocab_size", c.vocab_size},
              {"hidden_size", c.hidden_size},
              {"num_hidden_layers", c.num_hidden_layers},
              {"num_attention_heads", c.num_attention_heads},
              {"num_key_value_heads", c.num_attention_heads},
              {"intermediate_size", c.intermediate_size},
              {"moe_intermediate_size", c.moe_intermediate_size},
              {"n_routed_experts", c.n_routed_experts},
              {"n_shared_experts", c.n_shared_experts},
              {"num_experts_per_tok", c.num_experts_per_tok},
              {"first_k_dense_replace", c.first_k_dense_replace},
              {"moe_layer_freq", c.moe_layer_freq},
              {"norm_topk_prob", c.norm_topk_prob},
              {"scoring_func", c.scoring_func},
              {"aux_loss_alpha", float_json(c.aux_loss_alpha)},
              {"seq_aux", c.seq_aux},
              {"rope_theta", float_json(c.rope_theta)},
              {"rms_norm_eps", float_json(c.rms_norm_eps)},
              {"max_position_embeddings", c.max_position_embeddings},
              {"initializer_range", float_json(c.initializer_range)},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"}};
}

void save_config(const ModelConfig& c, const std::string& path) {
  io::write_file_atomic(path, config_to_json(c).dump(2) + "\n", "config.json");
}

ParamCounts count_params(const ModelConfig& c) {
  // Checked: a config that never went through validate() must not overflow here either.
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const std::string what = "parameter count";
  auto mul = [&](int64_t a, int64_t b) { return mul_or_throw<int64_t>(a, b, what); };
  auto add = [&](int64_t a, int64_t b) { return add_or_throw<int64_t>(a, b, what); };
  ParamCounts p;
  p.total = p.active = add(mul(2, mul(V, H)), H);  // embedding, lm_head, final norm
  // q, k, v, o (or the families' projections) and the two norms
  int64_t common = add(c.is_deepseek() ? mul(4, mul(H, H)) : family_attention_params(c), mul(2, H));
  if (c.uses_mla()) {
    const int64_t nh = c.num_attention_heads, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
    const int64_t qk = mul(nh, c.qk_head_dim());
    const int64_t q = rq > 0 ? add(add(mul(H, rq), rq), mul(rq, qk)) : mul(H, qk);
    const int64_t kv = add(add(mul(H, rkv + c.qk_rope_head_dim), rkv),
                           mul(rkv, mul(nh, c.qk_nope_head_dim + c.v_head_dim)));
    common = add(add(add(q, kv), mul(H, mul(nh, c.v_head_dim))), mul(2, H));
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    p.total = add(p.total, common);
    p.active = add(p.active, common);
    if (c.is_moe_layer(i)) {
      const int64_t expert = mul(3, mul(H, c.moe_intermediate_size));
      const int64_t router = mul(c.n_routed_experts, H);
      if (c.is_deepseek()) {
        p.total = add(p.total, add(router, mul(expert, add(c.n_routed_experts, c.n_shared_experts))));
        p.active = add(p.active, add(router, mul(expert, add(c.num_experts_per_tok, c.n_shared_experts))));
      } else {
        const int64_t shared = add(router, family_shared_params(c));
        p.total = add(p.total, add(shared, mul(expert, c.n_routed_experts)));
        p.active = add(p.active, add(shared, mul(expert, c.num_experts_per_tok)));
      }
    } else {
      const int64_t dense = mul(3, mul(H, c.intermediate_size));
      p.total = add(p.total, dense);
      p.active = add(p.active, dense);
    }
  }
  return p;
}

}  // namespace moe::model
