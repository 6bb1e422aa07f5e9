// The DeepSeek-MoE causal language model with explicit forward and backward passes (no autograd):
//   x = embed(tokens)
//   per layer l:  h = x + o_proj(attn(rope(q,k), v)(rmsnorm(x)))      attention block
//                 x = h + ffn_l(rmsnorm(h))    ffn = dense SwiGLU, or MoE (routed + shared experts)
//   logits = lm_head(rmsnorm(x));  loss = mean cross-entropy + sum over MoE layers of aux loss
// A Model holds one pipeline stage (by default the whole model): a contiguous range of layers,
// the embedding if it is the first stage, final norm + head + loss if it is the last. Weights and
// gradients are flat blocks laid out by ParamLayout; backward ADDS into the gradient block (so
// micro-batches accumulate). What one micro-batch's forward keeps for its backward lives in a
// MicroBatch, so several can be in flight (1F1B). Kept activations are charged to
// activation_memory() (its peak is the exact high-water mark); backward's temporaries and
// recomputed activations to work_memory().
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/params.h"
#include "moe/moe_layer.h"

namespace moe::model {

struct LossParts {
  double total = 0.0;  // ce + aux
  double ce = 0.0;     // mean cross-entropy (nats per token); 0 on stages without the head
  double aux = 0.0;    // sum of this stage's MoE layers' alpha-scaled auxiliary losses
};

// How the MoE layers lay out their tokens (padding-free is the default).
struct MoeOptions {
  float capacity_factor = 0.0f;  // 0 = dropless
  bool padded = false;
};

// Activation checkpointing: what forward keeps per layer; the rest is recomputed in backward
// from the kept input (same inputs, same weights, no randomness: the same routing and layout,
// which backward checks).
enum class Recompute {
  kNone,  // keep everything
  kMoe,   // MoE layers keep their FFN input only; the MoE block is recomputed
  kFull,  // every layer keeps its input only; the whole block is recomputed
};
Recompute parse_recompute(const std::string& name);  // "none" | "moe" | "full"
const char* recompute_name(Recompute r);

class Model {
 public:
  class MicroBatch;  // one micro-batch's saved state (opaque)
  struct MicroBatchDeleter {
    void operator()(MicroBatch* mb) const;
  };
  using MicroBatchPtr = std::unique_ptr<MicroBatch, MicroBatchDeleter>;

  // ep: expert parallelism (this rank holds the experts its placement map gives rank ep->rank,
  // contiguous at construction, and its MoE layers exchange tokens); null = one process holding
  // every expert.
  explicit Model(const ModelConfig& config, MoeOptions moe_options = {},
                 const mixture::ExpertParallel* ep = nullptr, StageSpec stage = {},
                 Recompute recompute = Recompute::kNone);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // params(), grads() and logits() point into this device's memory (host for kCpu).
  Device device() const { return dev_; }
  const ParamLayout& layout() const { return layout_; }
  const StageSpec& stage() const { return layout_.stage(); }
  size_t num_params() const { return layout_.total(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const ModelTensors& weights() const { return w_; }
  const ModelTensors& grad_tensors() const { return g_; }

  // Normal(0, initializer_range) for matrices and embeddings, 1 for norm weights; one random
  // stream per tensor name, so any split of the model over ranks initialises identically.
  void init_weights(uint64_t seed);
  void zero_grads() { grads_.zero(); }

  // ---- Stage API (pipeline parallelism) ----
  MicroBatchPtr new_micro_batch();
  // tokens_BT1: B rows of T+1 tokens (the first stage embeds [:, :T]; the last stage's targets are
  // [:, 1:]). x_in [B·T,H]: the previous stage's output (non-first stages). x_out [B·T,H]: this
  // stage's output (non-last stages). keep = false: evaluation, nothing kept for backward.
  LossParts forward(MicroBatch& mb, const int32_t* tokens_BT1, const float* x_in, float* x_out,
                    int B, int T, bool keep = true);
  // dy_out: gradient of x_out (non-last stages). dx_in (non-first stages) is OVERWRITTEN with the
  // gradient of x_in. Adds loss_scale · d(loss)/d(params) into grads() and frees mb's activations.
  void backward(MicroBatch& mb, const float* dy_out, float* dx_in, float loss_scale);

  // ---- Whole-model API (one stage holding everything) ----
  LossParts forward(const int32_t* tokens_BT1, int B, int T);
  // With D data-parallel ranks, loss_scale = 1/D makes the sum of the ranks' gradients the
  // gradient of the global batch's mean loss.
  void backward(float loss_scale = 1.0f);
  LossParts evaluate(const int32_t* tokens_BT1, int B, int T);  // nothing kept
  const float* logits() const;  // [B,T,V] of the last whole-model forward

  // Tokens routed to each expert in mb's forward, per MoE layer of this stage [layers][E].
  std::vector<std::vector<int>> expert_loads(const MicroBatch& mb) const;
  std::vector<std::vector<int>> expert_loads() const;  // of the last whole-model forward
  int dropped_pairs() const;

  // Aux-loss-free balancing (topk_method noaux_tc): each MoE layer's e_score_correction_bias [E],
  // fp32 state that is not a parameter (no gradient, no optimizer, not in params()). Zero at
  // construction; the trainer sets it (train/score_bias.h) between steps.
  void set_score_bias(int layer, const float* bias_E);  // host values for MoE layer `layer`
  std::vector<float> score_bias(int layer) const;       // host copy [E]

  // Where every MoE layer's experts live in the EP group (expert parallelism only; contiguous at
  // construction). set_placement renames the expert slots of this rank's layout to the experts
  // the new map puts there; the values in params()/grads() are the caller's to move first
  // (train/migration.h). Shapes and offsets never change: every rank holds E/ep experts.
  const balance::Placement& placement() const { return placement_; }
  void set_placement(const balance::Placement& placement);

  MemTracker& activation_memory() { return act_mem_; }
  MemTracker& work_memory() { return work_mem_; }
  // Everything this rank holds that is tracked: parameters, gradients, activations, workspace,
  // and whatever else is charged to it (optimizer state, pipeline buffers).
  MemTracker& total_memory() { return total_mem_; }
  // Model FLOPs per token for one forward+backward of the whole model (REFERENCE §5:
  // 6·N_active (no embedding lookup) + 12·L·H·T attention); recomputation is not counted.
  double flops_per_token(int T) const;

 private:
  struct LayerActs;
  enum class Keep { kAll, kNoMoe, kInput };
  Keep keep_mode(int layer) const;
  const float* layer_score_bias(int layer) const;  // null: no bias for this layer
  const balance::LayerPlacement* layer_placement(int layer) const {  // null: no expert parallelism
    return ep_ ? &placement_.layers[layer] : nullptr;
  }
  // Layer l on a.x (already set): writes out [N,H]; `a` then holds every activation.
  void layer_forward(int l, LayerActs& a, float* out, int B, int T, MemTracker* mem);
  // Releases what the keep mode does not keep (recomputed in backward).
  void drop_activations(LayerActs& a, Keep keep);
  // dx holds d(layer output) on entry and d(layer input) on return.
  void layer_backward(int l, LayerActs& a, float* dx, int B, int T, float loss_scale);

  ModelConfig config_;
  MoeOptions moe_options_;
  const mixture::ExpertParallel* ep_ = nullptr;
  Recompute recompute_;
  Device dev_;  // where params, grads and activations live: the active kernel device at creation
  balance::Placement placement_;  // empty layers without expert parallelism
  ParamLayout layout_;
  Buffer<float> params_, grads_;
  ModelTensors w_, g_;
  kernels::RopeTable rope_;
  MemTracker total_mem_, act_mem_, work_mem_;
  MicroBatchPtr whole_;  // state of the whole-model API
  Buffer<float> score_bias_;  // [num_hidden_layers, E] on dev_ (noaux_tc only; rows of MoE layers)
};

}  // namespace moe::model
