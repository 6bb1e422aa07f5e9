// The MoE feed-forward block of a DeepSeek-MoE layer as a straight line of named steps:
//   route -> layout -> dispatch -> experts -> combine  (+ shared experts on every token)
// Only dispatch and combine would communicate (expert parallelism, comm/); every other step is
// local. The layout built in forward is kept in MoeActivations and reused by backward unchanged.
// Two layouts: padding-free (X-MoE PFT, default, dropless unless capacity_factor > 0) and the
// capacity-padded baseline ([E, C, H] buffers, C = ceil(T·k·cf/E)), sharing the expert code.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "balance/placement.h"
#include "comm/exchange.h"
#include "core/buffer.h"
#include "kernels/swiglu_mlp.h"
#include "moe/layout.h"
#include "moe/router.h"
#include "moe/step_times.h"

namespace moe::mixture {

// Expert parallelism: the routed experts are split evenly over the `size` ranks of an EP group,
// where each layer's placement map says (MoeConfig::placement; by default rank r holds experts
// [r·E/size, (r+1)·E/size)); dispatch and combine exchange rows with `exchange`. Everything else in
// the layer (router, shared experts) is replicated. With size 1 and no exchange (data parallelism
// alone) only the aux statistics are reduced.
struct ExpertParallel {
  const comm::TokenExchange* exchange = nullptr;  // over the EP group
  int rank = 0;
  int size = 1;
  // Sums the router's batch-level aux statistics over all data-parallel ranks (EP × DP).
  std::function<void(std::vector<double>&)> reduce_aux_stats;
  // Combine sums each token's expert outputs in logical-expert order, whatever rank holds them
  // (the exchange's fold key): then moving experts between ranks never changes the math. Off, the
  // sum follows the network (per rank, then per node), as rbd's in-network sums need.
  bool placement_independent_sum = false;
  // --comm.overlap (Megatron-Core's shared-expert overlap): on the CPU, the shared experts run on
  // a second thread while this rank's dispatch exchange is on the network (forward: their gate,
  // up and SwiGLU; the down product still adds after combine, so every sum keeps its order), and
  // all of shared' beside combine''s exchange. The bits do not change.
  bool overlap_shared = false;
  int num_local_experts(int E) const { return E / size; }
};

// Backward's temporaries (combine' weights and rows, the experts' dx rows and their SwiGLU
// scratch), kept between calls so that a step does not fault in and zero fresh pages for them
// (at T4096 H1024 k8 that was 7% of the layer). One per model, shared by its MoE layers: a layer's
// temporaries are dead once its backward returns. Grown when a call needs more, never shrunk;
// charged to the scratch tracker of the call that grew them for as long as they are held.
struct MoeBackwardWorkspace {
  Buffer<float> dweight, dy_rows, dx_rows, scratch;
};

struct MoeConfig {
  int hidden = 0;       // H
  int ffn = 0;          // F, moe_intermediate_size
  int num_experts = 0;  // E, n_routed_experts
  int top_k = 0;        // k, num_experts_per_tok
  int shared_ffn = 0;   // n_shared_experts · moe_intermediate_size; 0 = no shared experts
  bool norm_topk_prob = false;
  float aux_loss_alpha = 0.0f;
  bool seq_aux = false;                 // aux loss per sequence (DeepSeek's seq_aux) instead of per batch
  bool sigmoid = false;                 // DeepSeek-V3 router (noaux_tc): see router.h
  const float* score_bias_E = nullptr;  // sigmoid: [E] selection bias on the active device, or null
  float routed_scaling_factor = 1.0f;   // see RouterConfig
  int n_group = 1, topk_group = 1;      // group-limited routing (router.h); n_group 1 = none
  float capacity_factor = 0.0f;         // 0 = dropless
  bool padded = false;                  // capacity-padded baseline instead of padding-free
  const ExpertParallel* ep = nullptr;   // null: all experts local, nothing communicates
  // ep only: where this layer's experts live
  const balance::LayerPlacement* placement = nullptr;
  MemTracker* scratch_tracker = nullptr;      // charged with backward's temporary buffers
  MoeBackwardWorkspace* workspace = nullptr;  // backward's temporaries kept between calls, or null
  MoeStepTimes* step_times = nullptr;         // adds up each step's wall time (--profile, bench), or null
};

struct MoeWeights {
  const float* gate_EH = nullptr;  // router, [E,H]
  kernels::MlpWeights experts;     // stacked [El,F,H], [El,F,H], [El,H,F] (El = local experts)
  kernels::MlpWeights shared;      // [Fs,H], [Fs,H], [H,Fs]; unused when shared_ffn == 0
  // Qwen2-MoE's shared_expert_gate [1,H]: the shared experts' output is scaled per token by
  // sigmoid(x · g). Null: not gated (DeepSeek).
  const float* shared_gate_H = nullptr;
};
struct MoeGrads {
  float* gate_EH = nullptr;
  kernels::MlpGrads experts;
  kernels::MlpGrads shared;
  float* shared_gate_H = nullptr;
};

// Everything forward keeps for backward. Buffers are charged to the tracker given to forward.
struct MoeActivations {
  Routing routing;
  DispatchLayout layout;                       // padding-free layout (also built for padded: it names the pairs)
  PaddedLayout padded_layout;                  // only when cfg.padded
  Buffer<float> x_rows;                        // [R,H] gathered inputs (R = rows, or E·C when padded)
  Buffer<float> g, u, h;                       // [R,F]
  Buffer<float> y_rows;                        // [R,H] expert outputs
  Buffer<float> shared_g, shared_u, shared_h;  // [T,Fs]
  // Gated shared experts (MoeWeights::shared_gate_H): y += a_t · s_t with s = shared(x) [T,H]
  // and a_t = sigmoid(x_t · g) [T], computed as the router's sigmoid top-1 over one "expert"
  // (shared_gate holds a; shared_gate_idx its zero index, shared_gate_w a again) and added as a
  // combine over the identity row map shared_rows (kernels with CUDA twins, no new kernel).
  Buffer<float> shared_y, shared_gate, shared_gate_w;
  Buffer<int32_t> shared_gate_idx, shared_rows;
  double aux_loss = 0.0;  // alpha-scaled auxiliary loss of this layer
  // Expert parallelism only: the dispatch handle (reused by backward), where each received pair
  // sits in the local-expert-contiguous buffers (on the active device, for the kernels), the
  // pairs' combine weights there, the local experts' segment offsets (local slots), and each sent
  // pair's [T,k] slot on the host (the exchange's metadata is built there). Pairs are sent in the
  // layout's order grouped by destination rank (stable: the layout order when the placement is
  // contiguous).
  comm::ExchangePlan plan;
  Buffer<int32_t> local_row_of_recv;   // [num_recv] active device
  Buffer<float> recv_value;            // [num_recv] active device: plan.recv_value
  std::vector<int32_t> local_offsets;  // [El+1] host
  std::vector<int32_t> slot_of_pair;   // [num_rows] host: the layout slot of each sent pair
};

// y[T,H] = sum_k w_tk · expert_k(x_t) + shared(x_t). num_seqs splits the T tokens into equal
// sequences for seq_aux. x must stay alive until backward.
void moe_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                 const MoeConfig& cfg, int T, int num_seqs, MemTracker* tracker);

// dx += ..., grads += ... ; aux_grad is dLoss/d(aux_loss) (1 for a loss that adds it).
void moe_backward(float* dx, const MoeGrads& grads, const float* dy, float aux_grad,
                  const MoeActivations& act, const float* x, const MoeWeights& w,
                  const MoeConfig& cfg, int T, int num_seqs);

}  // namespace moe::mixture
