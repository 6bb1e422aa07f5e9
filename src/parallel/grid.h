// The rank grid of one run: this rank's coordinates and its communicators.
//   ep group: the ranks that split the routed experts (adjacent ranks, same pp/dp/tp)
//   dp group: the ranks that hold the same experts (same pp/ep/tp)
//   data group: every rank that reads its own share of the global batch (EP × DP of one stage)
//   pp group: the stages of one pipeline (same dp/ep/tp), ordered by stage
//   tp group: the tensor-parallel ranks (adjacent; same pp/dp/ep), which share one batch share and
//             split its tokens (model.h: TensorParallel)
//   tokens group: every rank of one stage (EP × DP × TP): each holds its own tokens, so sums over
//             tokens (losses, routing statistics, expert loads) run over it. Without TP it is the
//             data group.
#pragma once
#include <memory>

#include "comm/group.h"
#include "comm/topology.h"
#include "comm/two_level.h"
#include "model/params.h"
#include "parallel/parallel_dims.h"

namespace moe::parallel {

struct Grid {
  ParallelDims dims;
  RankCoords me;
  comm::Topology topo;
  comm::Group world, ep, dp, data, pp, tp, tokens;
  // The first and the last stage of this rank's pipeline (pp > 1; the middle stages are in groups
  // of their own): the tied embedding of DeepSeek-V3's MTP module (sync_tied_embedding).
  comm::Group pipeline_ends;
  // The data and dp groups split by node, for their two-level gradient all-reduce.
  comm::NodeSplit data_nodes, dp_nodes;
  // Index of this rank's share of the global batch: dp_idx · ep + ep_idx.
  int data_rank() const { return me.dp * dims.ep + me.ep; }
  int data_size() const { return dims.dp * dims.ep; }
};

// Collective over MPI_COMM_WORLD. Validates dims against the world size and the model.
Grid make_grid(const ParallelDims& dims, const model::ModelConfig& cfg, int forced_ranks_per_node,
               int forced_nodes_per_group);

// Tensor parallelism, before sync_gradients (or ZeRO-1's reduce-scatter): every tensor that each TP
// rank holds whole (ParamSpec::tp_dim < 0: norms, embedding, head, router, experts) saw only its
// rank's tokens, so its gradient is summed over the TP group. Contiguous runs in one all-reduce.
void sync_tensor_parallel(const model::ParamLayout& layout, float* grads, const Grid& grid);

// Gradient synchronisation after backward (gradients were scaled by 1/data_size in backward):
// replicated tensors summed over the data group, routed experts over the dp group. Contiguous
// tensors of one kind go in one all-reduce, in two levels where the group spans nodes with
// several members on each (comm/two_level.h).
void sync_gradients(const model::ParamLayout& layout, float* grads, const Grid& grid);

// Pipeline parallelism with DeepSeek-V3's MTP module, before sync_gradients: the last stage's
// copy of the embedding (ParamSpec::tied_copy) and the first stage's each hold part of its
// gradient; both get the sum, so the two copies take the same update. Collective over the pp
// group's ends; a no-op for a model without the module.
void sync_tied_embedding(const model::ModelConfig& cfg, const model::ParamLayout& layout, float* grads,
                         const Grid& grid);

}  // namespace moe::parallel
