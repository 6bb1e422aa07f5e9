// Parameter layout: every parameter of a model in one contiguous fp32 block, named with its
// Hugging Face name (DeepSeek's, or its family's: model/family.h names the MoE blocks). Routed
// experts of a layer are stacked ([E,F,H] for gate, [E,F,H] for up, [E,H,F] for down) so the
// grouped GEMM reads them in place, while each expert still has its own name
// (model.layers.3.mlp.experts.5.up_proj.weight). Gradients and Adam moments use the same
// layout; ModelTensors names the pieces of any such block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "balance/placement.h"
#include "model/config.h"

namespace moe::model {

struct ParamSpec {
  std::string name;  // Hugging Face name
  std::vector<int64_t> shape;
  size_t offset = 0;  // elements from the start of the block
  size_t numel = 0;
  bool decay = true;       // AdamW weight decay: matrices and embeddings yes, norm weights no
  bool is_expert = false;  // a routed expert's weight (sharded by expert parallelism later)
  // A second copy of a tensor another pipeline stage holds: the embedding on the last stage for
  // DeepSeek-V3's MTP module, whose gradient the trainer sums with the first stage's
  // (parallel/grid.h, sync_tied_embedding). Left out of the gradient norm and of checkpoints,
  // which count and write the first stage's.
  bool tied_copy = false;
  // Tensor parallelism: the dimension of the logical tensor split over the TP group (0: rows, the
  // column-parallel q/k/v and dense gate/up; 1: columns, the row-parallel o_proj and dense down),
  // -1 when every TP rank holds all of it. `shape` is this rank's slice, `full_shape` the tensor's.
  int tp_dim = -1;
  std::vector<int64_t> full_shape;
};

// Tensor parallelism: this rank's place in the TP group. The split tensors of ParamSpec::tp_dim hold
// the slice [rank·d/size, (rank+1)·d/size) of their split dimension d.
struct TpShard {
  int rank = 0;
  int size = 1;
};

// Which routed experts a rank holds, in slot order (the stacking order of its [El, ...] arrays).
// By default a contiguous share [begin, begin + count) in every layer (count = -1: all, one
// process); from a placement map (balance/placement.h), each layer's own list.
struct ExpertShard {
  int begin = 0;
  int count = -1;
  std::vector<std::vector<int>> per_layer;  // non-empty: [model layer] logical experts, slot order

  static ExpertShard of(const balance::Placement& placement, int ep_rank);
  std::vector<int> experts(int layer, int num_experts) const;  // slot order
  int num_local(int num_experts) const;
  bool holds_all(int num_experts) const;  // every expert, in order, in every layer
};

// Which layers a pipeline stage holds: [first_layer, first_layer + num_layers), plus the
// embedding on the first stage and final norm + LM head on the last. Default: the whole model.
struct StageSpec {
  int first_layer = 0;
  int num_layers = -1;  // -1: all layers from first_layer
  bool embedding = true;
  bool head = true;
  int end_layer(const ModelConfig& c) const {
    return num_layers < 0 ? c.num_hidden_layers : first_layer + num_layers;
  }
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelConfig& c, ExpertShard shard = {}, StageSpec stage = {},
                       TpShard tp = {});
  const ExpertShard& shard() const { return shard_; }
  const TpShard& tp() const { return tp_; }
  const StageSpec& stage() const { return stage_; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  size_t total() const { return total_; }
  const ParamSpec& find(const std::string& name) const;  // throws naming the parameter
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

 private:
  void add(std::string name, std::vector<int64_t> shape, bool decay, bool is_expert = false,
           int tp_dim = -1);
  std::vector<ParamSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  size_t total_ = 0;
  ExpertShard shard_;
  StageSpec stage_;
  TpShard tp_;
};

// Pointers into one block (weights, gradients or optimizer moments). layers has one entry per
// model layer; only the stage's layers are bound (the others stay null), as are embed / norm /
// lm_head when the stage does not hold them.
struct LayerTensors {
  float* input_norm = nullptr;  // [H]
  // A = heads·head_dim, Akv = kv_heads·head_dim (both H for DeepSeek; model/family.h)
  float* q = nullptr;       // [A,H] ([A/tp,H] under tensor parallelism)
  float* k = nullptr;       // [Akv,H] ([Akv/tp,H])
  float* v = nullptr;       // [Akv,H] ([Akv/tp,H])
  float* o = nullptr;       // [H,A] ([H,A/tp]); MLA: [H, nh·dv] ([H, nh·dv/tp])
  float* q_bias = nullptr;  // [A] ([A/tp]), qwen2_moe; else null
  float* k_bias = nullptr;  // [Akv] ([Akv/tp])
  float* v_bias = nullptr;  // [Akv] ([Akv/tp])
  float* q_norm = nullptr;  // [head_dim], qwen3_moe; else null
  float* k_norm = nullptr;  // [head_dim]
  // Multi-head latent attention (config.uses_mla(); q, k, v above are null, but q is q_proj when
  // there is no query latent): heads split by rows of q/q_b and kv_b under TP, the latents'
  // down-projections and norms replicated.
  float* q_a = nullptr;        // [rq,H] (q_lora_rank > 0)
  float* q_a_norm = nullptr;   // [rq]
  float* q_b = nullptr;        // [nh·(dn+dr), rq]
  float* kv_a = nullptr;       // [rkv+dr, H]: the kv latent's rows, then the rotary key's
  float* kv_a_norm = nullptr;  // [rkv]
  float* kv_b = nullptr;       // [nh·(dn+dv), rkv]
  float* post_norm = nullptr;  // [H]
  // dense layer
  float* mlp_gate = nullptr;  // [I,H] ([I/tp,H])
  float* mlp_up = nullptr;    // [I,H] ([I/tp,H])
  float* mlp_down = nullptr;  // [H,I] ([H,I/tp])
  // MoE layer
  float* router = nullptr;              // [E,H]
  float* experts_gate = nullptr;        // [El,F,H] (El = experts held locally)
  float* experts_up = nullptr;          // [El,F,H]
  float* experts_down = nullptr;        // [El,H,F]
  float* shared_gate = nullptr;         // [Fs,H]
  float* shared_up = nullptr;           // [Fs,H]
  float* shared_down = nullptr;         // [H,Fs]
  float* shared_expert_gate = nullptr;  // [1,H] qwen2_moe: sigmoid(x·g) scales the shared expert
};
// DeepSeek-V3's multi-token prediction module (depth 1), on the stage that holds the head:
//   x' = block(eh_proj([enorm(embed(t+1)) | hnorm(h)]));  logits' = lm_head(norm'(x'))
// with the main model's embedding and head (shared, as in the V3 report). Named as DeepSeek-V3's
// checkpoint names its layer num_hidden_layers: model.layers.L.{enorm,hnorm,eh_proj,
// shared_head.norm} and the block's usual tensors (its routed experts held whole by every rank).
struct MtpTensors {
  float* enorm = nullptr;    // [H]
  float* hnorm = nullptr;    // [H]
  float* eh_proj = nullptr;  // [H, 2H]: columns [0,H) read the embedding, [H,2H) the state
  float* norm = nullptr;     // [H] shared_head.norm
};
struct ModelTensors {
  float* embed = nullptr;  // [V,H]
  // One entry per model layer, plus the MTP module's block at index num_hidden_layers.
  std::vector<LayerTensors> layers;
  MtpTensors mtp;            // bound when the layout holds the MTP module
  float* norm = nullptr;     // [H]
  float* lm_head = nullptr;  // [V,H]
};
ModelTensors bind_tensors(const ParamLayout& layout, const ModelConfig& c, float* base);

}  // namespace moe::model
