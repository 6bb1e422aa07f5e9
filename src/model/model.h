// The DeepSeek-MoE causal language model with explicit forward and backward passes (no autograd):
//   x = embed(tokens)
//   per layer l:  h = x + o_proj(attn(rope(q,k), v)(rmsnorm(x)))      attention block
//                 x = h + ffn_l(rmsnorm(h))    ffn = dense SwiGLU, or MoE (routed + shared experts)
//   logits = lm_head(rmsnorm(x));  loss = mean cross-entropy + sum over MoE layers of aux loss
// Weights and gradients are flat blocks laid out by ParamLayout; backward ADDS into the gradient
// block (so micro-batches accumulate). Activations kept for backward are charged to
// activation_memory(), whose peak is the exact high-water mark.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/params.h"
#include "moe/moe_layer.h"

namespace moe::model {

struct LossParts {
  double total = 0.0;  // ce + aux
  double ce = 0.0;     // mean cross-entropy (nats per token)
  double aux = 0.0;    // sum of the MoE layers' alpha-scaled auxiliary losses
};

// How the MoE layers lay out their tokens (padding-free is the default).
struct MoeOptions {
  float capacity_factor = 0.0f;  // 0 = dropless
  bool padded = false;
};

class Model {
 public:
  // ep: expert parallelism (this rank holds experts [ep->expert_begin, +num_local_experts) and
  // its MoE layers exchange tokens); null = one process holding every expert.
  explicit Model(const ModelConfig& config, MoeOptions moe_options = {},
                 const mixture::ExpertParallel* ep = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  size_t num_params() const { return layout_.total(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const ModelTensors& weights() const { return w_; }
  const ModelTensors& grad_tensors() const { return g_; }

  // Normal(0, initializer_range) for matrices and embeddings, 1 for norm weights; deterministic.
  void init_weights(uint64_t seed);
  void zero_grads() { grads_.zero(); }

  // tokens_BT1: B rows of T+1 tokens (inputs are [:, :T], targets [:, 1:]). Keeps activations.
  LossParts forward(const int32_t* tokens_BT1, int B, int T);
  // Adds loss_scale · d(total loss)/d(params) into grads(); frees the activations. With D
  // data-parallel ranks, loss_scale = 1/D makes the sum of the ranks' gradients the gradient of
  // the global batch's mean loss.
  void backward(float loss_scale = 1.0f);
  // Forward without keeping activations for backward (evaluation).
  LossParts evaluate(const int32_t* tokens_BT1, int B, int T);

  const float* logits() const;  // [B,T,V] of the last forward
  // Tokens routed to each expert in the last forward, per MoE layer [num_moe_layers][E].
  std::vector<std::vector<int>> expert_loads() const;
  int dropped_pairs() const;  // (token, expert) pairs dropped by capacity in the last forward

  MemTracker& activation_memory() { return act_mem_; }
  // Model FLOPs per token for one forward+backward (REFERENCE §5: 6·N_active (no embedding
  // lookup) + 12·L·H·T attention); recomputation is not counted.
  double flops_per_token(int T) const;

 private:
  struct LayerActs;
  void forward_impl(const int32_t* tokens_BT1, int B, int T, bool keep);

  ModelConfig config_;
  MoeOptions moe_options_;
  const mixture::ExpertParallel* ep_ = nullptr;
  ParamLayout layout_;
  Buffer<float> params_, grads_;
  ModelTensors w_, g_;
  kernels::RopeTable rope_;
  MemTracker act_mem_;

  // State of the last forward.
  int B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<std::unique_ptr<LayerActs>> acts_;
  Buffer<float> embed_out_, final_in_, final_ln_, final_rstd_, logits_, probs_, losses_;
  LossParts loss_;
  bool have_acts_ = false;
};

}  // namespace moe::model
