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
#include "core/modes.h"
#include "kernels/exec_context.h"
#include "kernels/rope.h"
#include "model/attention_proj.h"
#include "model/config.h"
#include "model/params.h"
#include "moe/moe_layer.h"

namespace moe::comm {
class Group;
}

namespace moe::model {

// Tensor parallelism: Megatron TP with sequence parallelism, and X-MoE's sequence-sharded MoE block
// (SSMB) with unsharded experts. Each micro-batch's N = B·T token rows are cut into `size`
// contiguous shards of n = N/size rows. Rank r holds shard r of the residual stream and runs on it
// the norms, the embedding lookup, the head and loss, and the whole MoE block (router, layout, its
// own EP exchange, full experts, shared experts, combine): those parameters are replicated and
// their gradients summed over the group (parallel/tensor_parallel.h). Attention and the dense MLP
// split their heads and FFN columns: q/k/v and gate/up are column-parallel, o_proj and down
// row-parallel; forward all-gathers the normed shard before them and reduce-scatters their output,
// backward the adjoints (REFERENCE / NOTES §C1).
struct TensorParallel {
  const comm::Group* group = nullptr;  // the TP group (group rank = rank)
  int rank = 0;
  int size = 1;
};

struct LossParts {
  double total = 0.0;  // ce + aux + mtp_weight · mtp
  double ce = 0.0;     // mean cross-entropy (nats per token); 0 on stages without the head
  double aux = 0.0;    // sum of this stage's MoE layers' alpha-scaled auxiliary losses
  // Multi-token prediction (DeepSeek-V3): the MTP module's mean cross-entropy of token t+2 over
  // the positions that have one (T-1 per sequence), unweighted; 0 without the module or when
  // evaluating. Under tensor parallelism a shard's value is scaled so the group's mean is the
  // batch's.
  double mtp = 0.0;
  double mtp_weight = 0.0;  // lambda of the total (Model::set_mtp_weight)
};

// How the MoE layers lay out their tokens (padding-free is the default).
struct MoeOptions {
  float capacity_factor = 0.0f;  // 0 = dropless
  bool padded = false;
};

// Activation checkpointing (core/modes.h's Recompute): what forward keeps per layer; the rest is
// recomputed in backward from the kept input (same inputs, same weights, no randomness: the same
// routing and layout, which backward checks).

// The MoE layer's configuration and weights for one layer of `c` (used by Model and the
// Decoder): ep and placement null for every expert local, score_bias_E null without noaux_tc.
mixture::MoeConfig moe_config(const ModelConfig& c, const MoeOptions& o, const mixture::ExpertParallel* ep,
                              const balance::LayerPlacement* placement, MemTracker* scratch,
                              const float* score_bias_E);
mixture::MoeWeights moe_weights(const LayerTensors& L);

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
  // tp: tensor parallelism (see TensorParallel); null = none.
  explicit Model(const ModelConfig& config, MoeOptions moe_options = {},
                 const mixture::ExpertParallel* ep = nullptr, StageSpec stage = {},
                 Recompute recompute = Recompute::kNone, const TensorParallel* tp = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // params(), grads() and logits() point into this device's memory (host for kCpu).
  Device device() const { return ctx_.device(); }
  // The model's execution context (kernels/exec_context.h): the device and GEMM precision of the
  // context it was built in, with a stream, library handles, workspaces (charged to
  // work_memory()) and step recorder of its own. forward and backward run on it; so does the
  // trainer's whole step, and the decoder.
  kernels::ExecContext& context() const { return ctx_; }
  // The MoE layers add each step's wall time into `times` (moe/step_times.h) until called again
  // with null (--profile, benchmarks).
  void record_step_times(mixture::MoeStepTimes* times) { step_times_ = times; }
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
  // Under tensor parallelism every TP rank gets the same tokens, x_in and x_out are its shard
  // [B·T/tp, H], and the returned losses are its shard's (their mean over the group is the batch's).
  LossParts forward(MicroBatch& mb, const int32_t* tokens_BT1, const float* x_in, float* x_out,
                    int B, int T, bool keep = true);
  // dy_out: gradient of x_out (non-last stages). dx_in (non-first stages) is OVERWRITTEN with the
  // gradient of x_in. Adds loss_scale · d(loss)/d(params) into grads() and frees mb's activations
  // (under tensor parallelism: this rank's part of the batch loss's gradient; the group's sum over
  // the replicated parameters completes it).
  void backward(MicroBatch& mb, const float* dy_out, float* dx_in, float loss_scale);

  // ---- Whole-model API (one stage holding everything) ----
  LossParts forward(const int32_t* tokens_BT1, int B, int T);
  // With D data-parallel ranks, loss_scale = 1/D makes the sum of the ranks' gradients the
  // gradient of the global batch's mean loss.
  void backward(float loss_scale = 1.0f);
  LossParts evaluate(const int32_t* tokens_BT1, int B, int T);  // nothing kept
  const float* logits() const;                                  // [B,T,V] of the last whole-model forward

  // Tokens routed to each expert in mb's forward, per MoE layer of this stage [layers][E].
  std::vector<std::vector<int>> expert_loads(const MicroBatch& mb) const;
  std::vector<std::vector<int>> expert_loads() const;  // of the last whole-model forward
  // Bytes of the MoE blocks' token-row activations that mb's forward allocated, summed over this
  // stage's MoE layers: the dispatched rows, the expert intermediates and outputs that combine
  // reads, the shared experts' intermediates. They scale with the tokens a rank routes, so tensor
  // parallelism (SSMB) divides them by tp.
  size_t moe_dispatch_bytes(const MicroBatch& mb) const;
  int dropped_pairs() const;

  // Aux-loss-free balancing (topk_method noaux_tc): each MoE layer's e_score_correction_bias [E],
  // fp32 state that is not a parameter (no gradient, no optimizer, not in params()). Zero at
  // construction; the trainer sets it (train/score_bias.h) between steps.
  void set_score_bias(int layer, const float* bias_E);  // host values for MoE layer `layer`
  std::vector<float> score_bias(int layer) const;       // host copy [E]
  // The bias of MoE layer `layer` on the model's device (the decoder routes with it); null for a
  // layer without one.
  const float* score_bias_data(int layer) const { return layer_score_bias(layer); }

  // Where every MoE layer's experts live in the EP group (expert parallelism only; contiguous at
  // construction). set_placement renames the expert slots of this rank's layout to the experts
  // the new map puts there; the values in params()/grads() are the caller's to move first
  // (train/migration.h). Shapes and offsets never change: every rank holds E/ep experts.
  const balance::Placement& placement() const { return placement_; }
  void set_placement(const balance::Placement& placement);

  // Multi-token prediction's loss weight lambda (DeepSeek-V3: 0.3, then 0.1); the module trains
  // when the config has num_nextn_predict_layers 1 and this stage holds the head.
  void set_mtp_weight(float lambda) { mtp_weight_ = lambda; }
  float mtp_weight() const { return mtp_weight_; }
  bool has_mtp() const { return layout_.stage().head && config_.num_nextn_predict_layers > 0; }

  int tp_size() const { return tp_ ? tp_->size : 1; }
  int tp_rank() const { return tp_ ? tp_->rank : 0; }

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
  enum class Keep {
    kAll,
    kNoMoe,
    kInput
  };
  Keep keep_mode(int layer) const;
  const float* layer_score_bias(int layer) const;  // null: no bias for this layer
  // null: no expert parallelism, or the MTP block (layer num_hidden_layers), which holds every expert
  const balance::LayerPlacement* layer_placement(int layer) const {
    return ep_ && layer < config_.num_hidden_layers ? &placement_.layers[layer] : nullptr;
  }
  const mixture::ExpertParallel* layer_ep(int layer) const {
    return layer < config_.num_hidden_layers ? ep_ : nullptr;
  }
  mixture::MoeConfig layer_moe_config(int layer);  // MoE layer `layer`'s, with the step recorder
  // The MTP module on mb's final hidden state (forward), and its gradient into d_final_ln.
  double mtp_forward(MicroBatch& mb, const int32_t* tokens_BT1, MemTracker* mem);
  void mtp_backward(MicroBatch& mb, float* d_final_ln, float loss_scale);
  // Layer l on a.x (already set): writes out [N,H]; `a` then holds every activation.
  void layer_forward(int l, LayerActs& a, float* out, int B, int T, MemTracker* mem);
  // Releases what the keep mode does not keep (recomputed in backward).
  void drop_activations(LayerActs& a, Keep keep);
  // dx holds d(layer output) on entry and d(layer input) on return.
  void layer_backward(int l, LayerActs& a, float* dx, int B, int T, float loss_scale);
  // Tensor parallelism over `full` [N, width] rows, this rank's shard being `shard_elems` elements at
  // shard_elems · tp_rank(); no-ops without TP. all-gather: every shard to every rank;
  // reduce-scatter: this rank's shard = the sum over the group of its rows.
  void tp_allgather(float* full, size_t shard_elems) const;
  void tp_reduce_scatter(float* full, size_t shard_elems) const;
  // y[n,H] += the row-parallel linear x[N,in] · w[H,in]^T, summed over the group, this rank's rows.
  void row_parallel_add(float* y, const float* x, const float* w, int N, int in, int H);
  int moe_sequences(int B) const;  // sequences of one shard (the router's seq_aux statistics)

  ModelConfig config_;
  MoeOptions moe_options_;
  const mixture::ExpertParallel* ep_ = nullptr;
  Recompute recompute_;
  const TensorParallel* tp_ = nullptr;
  balance::Placement placement_;  // empty layers without expert parallelism
  ParamLayout layout_;
  Buffer<float> params_, grads_;
  ModelTensors w_, g_;
  kernels::RopeTable rope_;
  MemTracker total_mem_, act_mem_, work_mem_;
  mixture::MoeBackwardWorkspace moe_work_;  // its MoE layers' backward temporaries (work_mem_)
  MicroBatchPtr whole_;                     // state of the whole-model API
  // [num_hidden_layers + mtp, E] on device() (noaux_tc only; rows of MoE layers)
  Buffer<float> score_bias_;
  float mtp_weight_ = 0.3f;
  QkvScratch qkv_scratch_{&total_mem_};          // row map and ones of GQA and the q/k/v biases
  mixture::MoeStepTimes* step_times_ = nullptr;  // see record_step_times
  // Where params, grads and activations live (the device of the context the model was built in),
  // and the model's work. Last: its workspaces (work_mem_) are freed first.
  mutable kernels::ExecContext ctx_;
};

}  // namespace moe::model
