// PlanModel: what the resource model needs to know about an MoE transformer, for any model the
// planner is asked about (the trainer's own DeepSeek-MoE configs, the papers' families, Mixtral,
// DeepSeek-V2/V3, Qwen2-MoE), plus the presets and parameter counts. Pure data and arithmetic.
// Approximations, stated once: multi-head latent attention (DeepSeek-V2/V3) is counted exactly for
// parameters (its low-rank projections) but its activations and FLOPs are those of standard MHA
// with the same head count over hidden_size; grouped-query attention shrinks k/v (params,
// activations, FLOPs).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace moe::plan {

struct PlanModel {
  std::string name;             // preset name or config path
  std::string model_type;       // deepseek | deepseek_v2 | deepseek_v3 | mixtral | qwen2_moe | qwen3_moe | xmoe | piper
  long long vocab_size = 0;     // V
  int hidden = 0;               // H (d)
  int layers = 0;               // L
  int heads = 0;                // attention heads
  int kv_heads = 0;             // GQA key/value heads (= heads for MHA)
  int head_dim = 0;             // per head (H / heads unless the config says otherwise)
  int dense_ffn = 0;            // I: width of dense FFN layers
  int moe_ffn = 0;              // F: width of one routed expert
  int shared_ffn = 0;           // total width of the shared experts (0 = none)
  int experts = 0;              // E routed experts (0 = dense model)
  int top_k = 0;                // k
  int expert_matrices = 3;      // 3 = SwiGLU (gate, up, down); 2 = two-matrix experts (up, down)
  std::vector<bool> moe_layer;  // [L] whether layer l is an MoE layer
  bool tied_embeddings = false;
  bool qkv_bias = false;            // Qwen2: biases on q, k, v
  bool shared_expert_gate = false;  // Qwen2-MoE: a [1, H] gate on the shared expert
  bool qk_norm = false;             // Qwen3-MoE: [head_dim] RMSNorm weights on q and k
  // Multi-head latent attention (DeepSeek-V2/V3); 0 = standard attention.
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  // Router auxiliary statistics (the trainer keeps E floats per layer, or B·E with seq_aux).
  float aux_loss_alpha = 0.0f;
  bool seq_aux = false;
  int max_position_embeddings = 0;
  int default_seq_len = 4096;  // the papers' training sequence length for this model
  // The published parameter total counts L·(attention + experts) only (X-MoE, Piper families).
  bool published_excludes_embeddings = false;
  double published_unit = 1e9;  // X-MoE's "B" is 2^30, Piper's 1e9 (see test_plan.cpp)
  // When the model is one the trainer can run: how `moetrain train` names it.
  std::optional<model::ModelConfig> trainer_config;
  std::string train_model_flag;  // "--preset tiny" or "--config path"

  bool is_moe_layer(int l) const { return l >= 0 && l < static_cast<int>(moe_layer.size()) && moe_layer[l]; }
  int num_moe_layers() const;
  bool has_mla() const { return kv_lora_rank > 0; }
  int kv_dim() const { return kv_heads * head_dim; }  // width of k and v
  // Throws moe::Error naming the field and `source` on an inconsistent model.
  void validate(const std::string& source) const;
};

// The trainer's model (a preset or a config.json it reads) as a PlanModel.
PlanModel from_model_config(const model::ModelConfig& c, const std::string& name,
                            const std::string& train_flag);

// A ModelConfig with the same shapes, for the trainer's size functions (model/memory_sizes.h).
// Exact for the trainer's own models; for others it is the DeepSeek-MoE model of equal shapes
// (the memory model corrects for GQA k/v and two-matrix experts on top of it).
model::ModelConfig shadow_config(const PlanModel& m);

// Presets: xmoe-small/medium/large/super, piper-110b/862b/1.7t, mixtral-8x7b, mixtral-8x22b,
// deepseek-v2, deepseek-v3, and every trainer preset (tiny, test-moe, ...).
PlanModel plan_preset(const std::string& name);
std::vector<std::string> plan_preset_names();

// A Hugging Face config.json of model_type deepseek, deepseek_v2, deepseek_v3, mixtral or
// qwen2_moe. Other types are refused naming the type and the file; missing fields name the field.
PlanModel read_hf_config(const std::string& path);

// NAME (a preset) or a path to a config.json (anything ending in .json or naming a file).
PlanModel resolve_model(const std::string& name_or_path);

// Parameters by kind. Options turn off what a paper's published total leaves out.
struct ParamCountOptions {
  bool embeddings = true;  // embedding + LM head (+ final norm)
  bool norms = true;       // RMSNorm weights
  bool router = true;      // gate [E, H] (+ Qwen2's shared-expert gate)
};
struct ModelParams {
  double total = 0;      // every parameter
  double active = 0;     // per token: k routed + shared experts instead of E
  double embedding = 0;  // embedding + head + final norm (0 when not counted)
};
ModelParams count_params(const PlanModel& m, const ParamCountOptions& o = {});

// Parameters of layer l's pieces (one full copy, before any sharding).
struct LayerParams {
  double attention = 0;   // q, k, v, o (or the MLA projections) + biases
  double norms = 0;       // the two RMSNorm weights
  double dense_ffn = 0;   // dense layers only
  double router = 0;      // MoE layers only
  double shared = 0;      // shared experts (+ gate)
  double per_expert = 0;  // one routed expert
  int experts = 0;        // routed experts in this layer (0 for dense)
};
LayerParams layer_params(const PlanModel& m, int l);

// Model FLOPs per token for forward + backward (REFERENCE §2/§5): 6 · (active parameters that
// multiply activations: all but the embedding lookup) + 12 · L · H · s (attention scores and
// values). Recomputation is not counted. The same count as model::Model::flops_per_token.
double model_flops_per_token(const PlanModel& m, int seq_len);

}  // namespace moe::plan
