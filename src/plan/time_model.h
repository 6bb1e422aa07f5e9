// Time of one training step of a layout, from a cluster profile:
//   per stage and micro-batch, forward = Σ layers [ GEMMs by shape (calibrated table: q/k/v/o,
//     router, each local expert on its rows R/El — tall-skinny when experts are many —, shared
//     experts, dense FFN) + attention (table by T, head_dim) + memory-bound work (per activation
//     element allocated) + the exchange's plan + 2 all-to-alls (dispatch, combine) ] (+ head on
//     the last stage);
//   backward = the GEMMs' dx and dw forms + attention backward + memory-bound work + 2
//     all-to-alls; recomputation adds the recomputed part's forward, and both passes the
//     profile's per-element cost of dropping and rebuilding those activations; expert GEMMs and
//     all-to-alls use the busiest EP rank's rows (balanced, or measured routing: --loads);
//   pipeline (1F1B or GPipe) = Σ_s (f_s + b_s) + (M − 1) · max_s (f_s + b_s) + 2 (PP − 1) p2p:
//     each micro-batch passes every stage once, the slowest stage paces the rest; the bubble is
//     what exceeds M · max_s (f_s + b_s);
//   step = pipeline + gradient all-reduce (replicated tensors over dp·ep, experts over dp, one
//     call per contiguous span, as parallel/grid.cpp; with TP, one more over the tp group for
//     the tensors replicated over it) + optimizer.
// Tensor parallelism (memory_model.h): q/k/v/o and the dense FFN GEMMs on the gathered N rows
// with 1/tp of their columns, the MoE block and the head on the rank's N/tp rows, and per layer
// an all-gather + reduce-scatter of [N, H] each way around the attention (and a dense FFN).
// On a CPU profile the ranks of a node share its cores: compute runs at the measured per-rank
// share for the number of ranks computing at that moment (compute_share; a rank waiting in the
// bubble yields its core), the pipeline simulated op by op (heterogeneous stages, p2p on the
// dependencies); communication curves were measured with that many ranks running.
// MFU counts model FLOPs (REFERENCE §2/§5, no recomputation) against peak.
#pragma once
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/plan_model.h"
#include "plan/step_ops.h"

namespace moe::plan {

struct StageTime {
  double fwd = 0, bwd = 0;                  // per micro-batch, all included (compute + a2a + recompute)
  double fwd_compute = 0, bwd_compute = 0;  // GEMM + attention + memory-bound (+ recompute in bwd)
  double a2a = 0;                           // per micro-batch, forward + backward (+ recompute)
};

struct TimeBreakdown {
  std::vector<StageTime> stages;
  double compute = 0;    // M · (compute of the slowest stage)
  double a2a = 0;        // M · (all-to-all of the slowest stage)
  double p2p = 0;        // pipeline sends on the critical path
  double bubble = 0;     // fill and drain
  double allreduce = 0;  // gradient synchronisation
  double optimizer = 0;
  double step = 0;  // seconds
  double tokens_per_s = 0;
  double model_flops = 0;  // per step
  double mfu = 0;
  double tflops_per_rank = 0;
};

// Seconds of one pass's work on one rank alone: GEMMs and attention from the profile's tables,
// plus `elem_s` per memory-bound element.
double pass_seconds(const PassOps& ops, const ClusterProfile& c, double elem_s);

// `mem` supplies the activation element size and the padded/padding-free choice.
TimeBreakdown estimate_time(const PlanModel& m, const Layout& layout, const TrainShape& shape,
                            const ClusterProfile& c, const MemoryOptions& mem);

// Seconds of one all-to-all (dispatch or combine) of `bytes` per rank over an EP group of `ep`
// ranks (stride tp) with `k` routed experts per token: the calibrated curve when the profile has
// one for this group and world, else the link model (flat: (p−1) messages, all rows; rbd: one
// pilot per (token, remote node); halo: one message per remote node, intra-node forward).
// `pairs` (rows each rank sends, if known) counts flat's and rbd's messages to the ranks that get
// rows: with pairs ~ ep many get none.
double a2a_seconds(const ClusterProfile& c, A2a algo, int world, int ep, int tp,
                   double bytes, int k, double pairs = -1);
// Seconds of one exchange's plan (comm::TokenExchange::plan, once per MoE layer and micro-batch
// forward, recomputed or not; dispatch, combine and their adjoints reuse it): every rank learns the counts and per-pair
// metadata of the `pairs` rows it sends (tag and value, and rbd's pilot rank and index: 8 or 16
// bytes a pair). Its messages are small: their per-message time is most of it.
//   flat, rbd: an alltoall of the counts, then an alltoallv of the metadata, each (ep − 1)
//     messages (the counts' alltoall is Bruck's above 12 ranks: ceil(log2 ep) wire latencies);
//   halo, rbd-halo (by rails): one message to each rank of the node and one to each remote
//     node's rail peer, then the rail peer's forward inside its node.
// 0 where the profile has a measured a2a curve for the group: the curve's dispatch includes it.
double a2a_plan_seconds(const ClusterProfile& c, A2a algo, int world, int ep, int tp,
                        double pairs);
// All-reduce of `bytes` over `group` ranks `stride` apart, every such group at once, one ring
// (MPI_Allreduce's model; the TP all-reduces): 2(g − 1)/g of the buffer over the slowest hop and
// 2(g − 1) latencies. A hop between nodes is one flow through one NIC, sharing the node's NICs
// with the min(stride, ranks per node) flows leaving the node at once (one per group crossing it,
// every rank's when the stride spans nodes). A measured "allreduce" curve replaces the model.
double allreduce_seconds(const ClusterProfile& c, int world, int group, int stride, double bytes);
// The gradient all-reduce as parallel::sync_gradients runs it (comm::allreduce_sum): in two
// levels where core/two_level.h's rule applies (r ≥ 2 members on each of n ≥ 2 nodes, a large
// span): 2 × ((r − 1)/r of the buffer + (r − 1) latencies) inside the node, plus a ring of the
// 1/r share over the n nodes with min(stride·r, ranks per node) flows leaving each node; else
// allreduce_seconds. On GPUs NCCL's rings, one channel per NIC, also use every NIC of a node.
double gradient_allreduce_seconds(const ClusterProfile& c, int world, int group, int stride, double bytes);
double p2p_seconds(const ClusterProfile& c, int world, int stride, double bytes);

}  // namespace moe::plan
