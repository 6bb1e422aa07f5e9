// PlanModel presets, conversions and parameter counts. See plan_model.h.
#include "plan/plan_model.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace moe::plan {

int PlanModel::num_moe_layers() const {
  int n = 0;
  for (bool b : moe_layer) n += b ? 1 : 0;
  return n;
}

void PlanModel::validate(const std::string& src) const {
  auto positive = [&](const char* field, long long v) {
    MOE_CHECK(v > 0, src, ": \"", field, "\" must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden);
  positive("num_hidden_layers", layers);
  positive("num_attention_heads", heads);
  positive("num_key_value_heads", kv_heads);
  positive("head_dim", head_dim);
  MOE_CHECK(heads % kv_heads == 0, src, ": num_attention_heads (", heads,
            ") is not a multiple of num_key_value_heads (", kv_heads, ")");
  MOE_CHECK(static_cast<int>(moe_layer.size()) == layers, src, ": internal: moe_layer has ",
            moe_layer.size(), " entries for ", layers, " layers");
  MOE_CHECK(expert_matrices == 2 || expert_matrices == 3, src, ": expert_matrices must be 2 or 3");
  if (num_moe_layers() > 0) {
    positive("n_routed_experts", experts);
    positive("moe_intermediate_size", moe_ffn);
    positive("num_experts_per_tok", top_k);
    MOE_CHECK(top_k <= experts, src, ": num_experts_per_tok (", top_k, ") exceeds the ", experts,
              " routed experts");
    MOE_CHECK(shared_ffn >= 0, src, ": shared expert width must be >= 0, got ", shared_ffn);
  }
  if (num_moe_layers() < layers) positive("intermediate_size", dense_ffn);
}

PlanModel from_model_config(const model::ModelConfig& c, const std::string& name,
                            const std::string& train_flag) {
  PlanModel m;
  m.name = name;
  m.model_type = c.model_type;
  m.vocab_size = c.vocab_size;
  m.hidden = c.hidden_size;
  m.layers = c.num_hidden_layers;
  m.heads = c.num_attention_heads;
  m.kv_heads = c.kv_heads();
  m.head_dim = c.head_dim();
  m.dense_ffn = c.intermediate_size;
  m.moe_ffn = c.moe_intermediate_size;
  m.shared_ffn = c.shared_ffn();
  m.qkv_bias = c.qkv_bias();
  m.shared_expert_gate = c.gated_shared_expert() && c.shared_ffn() > 0;
  m.qk_norm = c.qk_norm();
  m.experts = c.n_routed_experts;
  m.top_k = c.num_experts_per_tok;
  for (int l = 0; l < c.num_hidden_layers; ++l) m.moe_layer.push_back(c.is_moe_layer(l));
  m.aux_loss_alpha = c.router_aux_alpha();
  m.seq_aux = c.seq_aux;
  m.max_position_embeddings = c.max_position_embeddings;
  m.default_seq_len = std::min(128, c.max_position_embeddings);
  if (c.uses_mla()) {
    m.q_lora_rank = c.q_lora_rank;
    m.kv_lora_rank = c.kv_lora_rank;
    m.qk_nope_head_dim = c.qk_nope_head_dim;
    m.qk_rope_head_dim = c.qk_rope_head_dim;
    m.v_head_dim = c.v_head_dim;
  }
  m.trainer_config = c;
  m.train_model_flag = train_flag;
  return m;
}

model::ModelConfig shadow_config(const PlanModel& m) {
  if (m.trainer_config) return *m.trainer_config;
  model::ModelConfig c;
  c.model_type = "deepseek";
  c.vocab_size = static_cast<int>(m.vocab_size);
  c.hidden_size = m.hidden;
  c.num_hidden_layers = m.layers;
  c.num_attention_heads = m.heads;
  c.intermediate_size = m.dense_ffn;
  c.moe_intermediate_size = m.moe_ffn;
  c.n_routed_experts = m.num_moe_layers() > 0 ? m.experts : 0;
  // The trainer's shared experts are n · F wide; the memory model adds the difference when the
  // model's shared width is not a multiple of F.
  c.n_shared_experts = m.moe_ffn > 0 ? m.shared_ffn / m.moe_ffn : 0;
  c.num_experts_per_tok = m.top_k;
  c.aux_loss_alpha = m.aux_loss_alpha;
  c.seq_aux = m.seq_aux;
  c.max_position_embeddings = m.max_position_embeddings;
  // moe_layer is general; the shadow's own rule is only used through layer indices we pass.
  c.first_k_dense_replace = 0;
  if (m.has_mla()) {  // the trainer's multi-head latent attention: its activations (memory_sizes.h)
    c.model_type = "deepseek_v3";
    c.q_lora_rank = m.q_lora_rank;
    c.kv_lora_rank = m.kv_lora_rank;
    c.qk_nope_head_dim = m.qk_nope_head_dim;
    c.qk_rope_head_dim = m.qk_rope_head_dim;
    c.v_head_dim = m.v_head_dim;
  }
  return c;
}

namespace {

std::vector<bool> deepseek_moe_layers(int L, int first_dense, int freq = 1) {
  std::vector<bool> v(L);
  for (int l = 0; l < L; ++l) v[l] = l >= first_dense && l % freq == 0;
  return v;
}

// X-MoE (REFERENCE §1): two-matrix experts, no shared experts, GPT-2 vocabulary; heads of 128
// dimensions (the paper does not list head counts).
PlanModel xmoe(const std::string& name, int H, int L, int E, int k, int F, int seq) {
  PlanModel m;
  m.name = name;
  m.model_type = "xmoe";
  m.vocab_size = 50257;
  m.hidden = H;
  m.layers = L;
  m.heads = m.kv_heads = H / 128;
  m.head_dim = 128;
  m.moe_ffn = F;
  m.experts = E;
  m.top_k = k;
  m.expert_matrices = 2;
  m.moe_layer.assign(L, true);
  m.max_position_embeddings = seq;
  m.default_seq_len = seq;
  m.published_excludes_embeddings = true;
  m.published_unit = 1073741824.0;  // X-MoE's billions are 2^30 (see test_plan.cpp)
  return m;
}

// Piper's weak-scaling family: H 5120, F 20480, L 32, k 2, two-matrix experts.
PlanModel piper(const std::string& name, int E) {
  PlanModel m = xmoe(name, 5120, 32, E, 2, 20480, 4096);
  m.model_type = "piper";
  m.published_unit = 1e9;
  return m;
}

PlanModel mixtral(const std::string& name, long long V, int H, int L, int heads, int F) {
  PlanModel m;
  m.name = name;
  m.model_type = "mixtral";
  m.vocab_size = V;
  m.hidden = H;
  m.layers = L;
  m.heads = heads;
  m.kv_heads = 8;
  m.head_dim = H / heads;
  m.moe_ffn = F;
  m.experts = 8;
  m.top_k = 2;
  m.moe_layer.assign(L, true);
  m.max_position_embeddings = 32768;
  m.default_seq_len = 4096;
  return m;
}

PlanModel deepseek_mla(const std::string& name, long long V, int H, int L, int I, int F, int E,
                       int k, int shared, int first_dense) {
  PlanModel m;
  m.name = name;
  m.model_type = name == "deepseek-v3" ? "deepseek_v3" : "deepseek_v2";
  m.vocab_size = V;
  m.hidden = H;
  m.layers = L;
  m.heads = m.kv_heads = 128;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.head_dim = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2;  // MHA stand-in
  m.dense_ffn = I;
  m.moe_ffn = F;
  m.shared_ffn = shared * F;
  m.experts = E;
  m.top_k = k;
  m.moe_layer = deepseek_moe_layers(L, first_dense);
  m.max_position_embeddings = 163840;
  m.default_seq_len = 4096;
  return m;
}

}  // namespace

PlanModel plan_preset(const std::string& name) {
  PlanModel m;
  if (name == "xmoe-small") m = xmoe(name, 2048, 28, 64, 6, 1408, 2048);
  else if (name == "xmoe-medium") m = xmoe(name, 5120, 28, 128, 6, 1536, 4096);
  else if (name == "xmoe-large") m = xmoe(name, 7168, 28, 256, 8, 2048, 4096);
  else if (name == "xmoe-super") m = xmoe(name, 7168, 61, 256, 8, 2560, 4096);
  else if (name == "piper-110b") m = piper(name, 16);
  else if (name == "piper-862b") m = piper(name, 128);
  else if (name == "piper-1.7t") m = piper(name, 256);
  else if (name == "mixtral-8x7b") m = mixtral(name, 32000, 4096, 32, 32, 14336);
  else if (name == "mixtral-8x22b") m = mixtral(name, 32768, 6144, 56, 48, 16384);
  else if (name == "deepseek-v2") m = deepseek_mla(name, 102400, 5120, 60, 12288, 1536, 160, 6, 2, 1);
  else if (name == "deepseek-v3") m = deepseek_mla(name, 129280, 7168, 61, 18432, 2048, 256, 8, 1, 3);
  else {
    bool trainer = false;
    for (const std::string& n : model::preset_names()) trainer |= n == name;
    if (!trainer) {
      std::string known;
      for (const std::string& n : plan_preset_names()) known += (known.empty() ? "" : ", ") + n;
      throw Error(str_cat("unknown model \"", name, "\" (known presets: ", known,
                          "; or a path to a Hugging Face config.json)"));
    }
    return from_model_config(model::preset(name), name, "--preset " + name);
  }
  m.validate("preset " + name);
  return m;
}

std::vector<std::string> plan_preset_names() {
  std::vector<std::string> v = {"xmoe-small", "xmoe-medium", "xmoe-large", "xmoe-super",
                                "piper-110b", "piper-862b", "piper-1.7t", "mixtral-8x7b",
                                "mixtral-8x22b", "deepseek-v2", "deepseek-v3"};
  for (const std::string& n : model::preset_names()) v.push_back(n);
  return v;
}

PlanModel resolve_model(const std::string& s) {
  namespace fs = std::filesystem;
  const bool looks_like_path = s.size() > 5 && s.substr(s.size() - 5) == ".json";
  if (looks_like_path || (s.find('/') != std::string::npos && fs::exists(s))) return read_hf_config(s);
  return plan_preset(s);
}

LayerParams layer_params(const PlanModel& m, int l) {
  const double H = m.hidden;
  LayerParams p;
  if (m.has_mla()) {
    const double nh = m.heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const double q = m.q_lora_rank > 0 ? H * m.q_lora_rank + m.q_lora_rank * nh * qk : H * nh * qk;
    p.attention = q + H * (m.kv_lora_rank + m.qk_rope_head_dim) +
                  m.kv_lora_rank * nh * (m.qk_nope_head_dim + m.v_head_dim) + nh * m.v_head_dim * H;
    p.norms = 2 * H + m.kv_lora_rank + (m.q_lora_rank > 0 ? m.q_lora_rank : 0);
  } else {
    const double qd = static_cast<double>(m.heads) * m.head_dim, kvd = m.kv_dim();
    p.attention = H * qd + 2 * H * kvd + qd * H + (m.qkv_bias ? qd + 2 * kvd : 0);
    p.norms = 2 * H + (m.qk_norm ? 2.0 * m.head_dim : 0.0);
  }
  if (m.is_moe_layer(l)) {
    p.router = static_cast<double>(m.experts) * H;
    p.shared = 3 * H * m.shared_ffn + (m.shared_expert_gate ? H : 0);
    p.per_expert = m.expert_matrices * H * m.moe_ffn;
    p.experts = m.experts;
  } else {
    p.dense_ffn = 3 * H * m.dense_ffn;
  }
  return p;
}

ModelParams count_params(const PlanModel& m, const ParamCountOptions& o) {
  ModelParams r;
  const double H = m.hidden, V = static_cast<double>(m.vocab_size);
  if (o.embeddings) {
    r.embedding = (m.tied_embeddings ? 1 : 2) * V * H + (o.norms ? H : 0);
    r.total = r.active = r.embedding;
  }
  for (int l = 0; l < m.layers; ++l) {
    LayerParams p = layer_params(m, l);
    double common = p.attention + (o.norms ? p.norms : 0) + p.dense_ffn + p.shared;
    if (!o.router && m.shared_expert_gate) common -= H;
    r.total += common + (o.router ? p.router : 0) + p.per_expert * p.experts;
    r.active += common + (o.router ? p.router : 0) + p.per_expert * (p.experts > 0 ? m.top_k : 0);
  }
  return r;
}

double model_flops_per_token(const PlanModel& m, int seq_len) {
  ModelParams p = count_params(m);
  // The embedding lookup is not a matmul (with tied embeddings the one matrix is the head).
  const double lookup = m.tied_embeddings ? 0.0 : static_cast<double>(m.vocab_size) * m.hidden;
  // Scores and weighted sums: 6·T·nh·(qk + v head widths) a layer and token (12·H·T for
  // DeepSeek's multi-head attention, whose widths are both H/nh; Qwen3's head_dim may differ).
  const double widths = m.has_mla() ? static_cast<double>(m.heads) *
                                          (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
                                    : 2.0 * m.heads * m.head_dim;
  return 6.0 * (p.active - lookup) + 6.0 * m.layers * widths * seq_len;
}

}  // namespace moe::plan
