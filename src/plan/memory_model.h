// Memory per rank of every pipeline stage of a layout: parameters, gradients, optimizer state
// (optionally ZeRO-1 sharded over the data ranks), the activations the in-flight micro-batches
// keep, the workspace peak above them (forward/backward temporaries, recomputation), pipeline and
// all-to-all buffers. Activation sizes come from the trainer's own size functions
// (model/memory_sizes.h), so for the trainer's models the prediction is the trainer's allocation.
//
// Workspace (the trainer's backward temporaries, model/model.cpp + moe/moe_layer.cpp), in
// elements for one micro-batch of N tokens, n = N / tp of them on the rank's sequence shard
// (n = N without TP), R received expert rows:
//   forward of layer l:   prefix + full_l + N·H (its output; with TP the row-parallel partial
//                         sums before their reduce-scatter) [+ R·H − 3·n·Fs dispatch scratch, EP]
//   head backward:        kept + n·H (dx) + n·V (dlogits) + n·H (dln)
//   recompute of layer l: prefix_l + n·H (dx) + N·H (out) + (full_l − kept_l) [+ dispatch scratch]
//   backward of layer l:  prefix_{<l} + full_l + n·H (dx) + N·H (dln; with TP the gathered
//                         d(out) / the input gradient before its reduce-scatter)
//                         + max(FFN scratch, N·(q+k+v+o)/tp (attention grads) [+ T² with attention_s2])
//     FFN scratch: dense 2·N·I/tp; MoE max(2·n·Fs (shared experts), R·H (expert parallel: the
//     received or returned rows))
//   every moment above + the MoE backward workspace (mixture::MoeBackwardWorkspace, one per model,
//     held from the first MoE backward on): max over the stage's MoE layers of n·k (d combine
//     weights) + 2·R·H (dy rows, dx rows) + 2·R·F (SwiGLU scratch)
// The stage peak is (in_flight − 1) · kept + max over one micro-batch's forward and backward.
// Tensor parallelism is Megatron's with sequence parallelism for attention and the dense FFN, and
// X-MoE's SSMB for the MoE block (full experts on each rank's n tokens); the embedding, head,
// norms, router and experts are replicated over TP, q/k/v/o and the dense FFN split.
#pragma once
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/plan_model.h"

namespace moe::plan {

struct MemoryOptions {
  enum class Accounting {
    kTrainer,     // the trainer's buffers (model/memory_sizes.h) + corrections for other models
    kPiperPaper,  // REFERENCE §3's formula, term by term
  };
  Accounting accounting = Accounting::kTrainer;
  // per parameter
  double weight_bytes = 2, grad_bytes = 2, optimizer_bytes = 12;
  double act_bytes = 2;    // per activation element
  bool zero1 = false;      // optimizer state split over the data ranks
  bool embeddings = true;  // embedding (first stage), final norm + head (last stage)
  bool norms = true;       // RMSNorm weights
  bool router = true;      // gate weights
  bool shared_experts = true;
  bool attention_s2 = true;      // B·heads·s² probabilities kept (an unfused kernel; the
                                 // trainer's is fused on both devices: false)
  bool workspace = true;         // temporaries above the kept activations
  bool pipeline_buffers = true;  // activation-sized send/receive slots between stages
  bool a2a_buffers = false;      // a communication library's dispatch send + receive buffers
  bool padded = false;           // capacity-padded [E, C, H] dispatch (DeepSpeed) instead of padding-free
  double capacity_factor = 1.25;
  double routing_imbalance = 1.0;  // rows the busiest expert rank holds / the balanced mean (memory)
  double time_imbalance = 1.0;     // the same, averaged over steps and layers (time model)
  // The all-to-all's: the busiest rank's (time_imbalance) inside a node, where each rank has its
  // own links; the busiest node's when the EP group spans nodes, whose ranks share the node's.
  double a2a_imbalance = 1.0;
  double reserved_bytes = 0;  // runtime, allocator
};

// The options that model a cluster at a precision: bf16 = mixed precision (2 + 2 + 12 bytes per
// parameter, 2-byte activations), fp32 = the CPU trainer (4 + 4 + 8, 4-byte activations).
MemoryOptions memory_options(const ClusterProfile& cluster, Precision precision, bool zero1);
// Every extra term off and the paper's activation formula: REFERENCE §3's M(i).
MemoryOptions piper_paper_options();

// Widths of the attention tensors per token (q, k, v, attention output; MLA's latents).
struct AttentionWidths {
  double q = 0, k = 0, v = 0, o = 0, latent = 0;
  double sum() const { return q + k + v + o; }
};
AttentionWidths attention_widths(const PlanModel& m);

// One layer, one micro-batch of `micro_batch` sequences of `seq_len` tokens, in elements.
struct LayerActivation {
  double attention = 0;  // attention part (x, ln1, q, k, v, attn_out, h, ln2, rstd, lse + out
                         // copy, or the probabilities with attention_s2)
  double ffn = 0;        // dense FFN or MoE (router, layout, rows, experts, shared)
  double input = 0;      // N·H: what full recomputation keeps
  double full = 0;       // attention + ffn: what forward allocates
  double kept = 0;       // what forward keeps under the recompute mode
  double rows = 0;       // expert rows this rank holds (padding-free: N·k; padded: E·C)
};
LayerActivation layer_activation(const PlanModel& m, int l, long long micro_batch, int seq_len,
                                 const Layout& layout, const MemoryOptions& o);

struct StageMemory {
  int stage = 0, first_layer = 0, num_layers = 0;
  double param_count = 0;                       // parameters this rank holds
  double params = 0, grads = 0, optimizer = 0;  // bytes
  double activations = 0;                       // kept by the in-flight micro-batches
  double workspace = 0;                         // peak temporaries above them
  double comm = 0;                              // pipeline (+ all-to-all) buffers
  double reserved = 0;
  double total = 0;
  int in_flight = 0;                // micro-batches held at once
  double kept_per_micro_batch = 0;  // bytes
};

struct MemoryEstimate {
  std::vector<StageMemory> stages;
  int worst = 0;  // index of the stage with the largest total
  const StageMemory& worst_stage() const { return stages[worst]; }
};

// Throws (naming the numbers) when the shape does not divide the layout.
MemoryEstimate estimate_memory(const PlanModel& m, const Layout& layout, const TrainShape& shape,
                               const MemoryOptions& o);

// Dispatch/combine buffers of one MoE layer for one micro-batch of `tokens` tokens per rank:
// padding-free (X-MoE PFT: N·k real rows) against capacity-padded (DeepSpeed/GShard: [E, C, H]
// dispatched and combined buffers, expert intermediates on E·C rows, and the [T, E, C] combine
// tensor + dispatch mask). Bytes at the options' activation size.
struct DispatchBuffers {
  int capacity = 0;  // C = max(ceil(T·k·cf/E), 4), capped at T
  double rows_padding_free = 0, rows_padded = 0;
  double padding_free_bytes = 0;    // rows in/out + expert intermediates
  double padded_bytes = 0;          // the same on E·C rows
  double combine_tensor_bytes = 0;  // [T, E, C] weights + mask (padded only)
};
DispatchBuffers dispatch_buffers(const PlanModel& m, long long tokens, const MemoryOptions& o);

}  // namespace moe::plan
