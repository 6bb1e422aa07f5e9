#include "parallel/grid.h"

namespace moe::parallel {

Grid make_grid(const ParallelDims& dims, const model::ModelConfig& cfg, int forced_ranks_per_node,
               int forced_nodes_per_group) {
  Grid g;
  g.dims = dims;
  g.world = comm::Group::world();
  dims.validate(g.world.size(), cfg);
  g.me = coords_of(dims, g.world.rank());
  g.topo = comm::Topology::detect(g.world.size(), forced_ranks_per_node, forced_nodes_per_group);
  const RankCoords& c = g.me;
  // Colors identify the fixed coordinates; keys order members by the varying one.
  g.ep = g.world.split((c.pp * dims.dp + c.dp) * dims.tp + c.tp, c.ep);
  g.dp = g.world.split((c.pp * dims.ep + c.ep) * dims.tp + c.tp, c.dp);
  g.data = g.world.split(c.pp * dims.tp + c.tp, c.dp * dims.ep + c.ep);
  g.pp = g.world.split((c.dp * dims.ep + c.ep) * dims.tp + c.tp, c.pp);
  g.tp = g.world.split((c.pp * dims.dp + c.dp) * dims.ep + c.ep, c.tp);
  g.tokens = g.world.split(c.pp, (c.dp * dims.ep + c.ep) * dims.tp + c.tp);
  g.pipeline_ends = g.pp.split(c.pp == 0 || c.pp == dims.pp - 1 ? 0 : 1 + c.pp, c.pp);
  g.data_nodes = comm::NodeSplit::of(g.data, g.topo);
  g.dp_nodes = comm::NodeSplit::of(g.dp, g.topo);
  return g;
}

void sync_tensor_parallel(const model::ParamLayout& layout, float* grads, const Grid& grid) {
  if (grid.tp.size() <= 1) return;
  const auto& specs = layout.specs();
  size_t i = 0;
  while (i < specs.size()) {
    size_t j = i;
    const bool whole = specs[i].tp_dim < 0;
    while (j < specs.size() && (specs[j].tp_dim < 0) == whole) ++j;
    const size_t begin = specs[i].offset, end = specs[j - 1].offset + specs[j - 1].numel;
    if (whole) grid.tp.allreduce_sum(grads + begin, static_cast<int64_t>(end - begin));
    i = j;
  }
}

void sync_tied_embedding(const model::ModelConfig& cfg, const model::ParamLayout& layout, float* grads,
                         const Grid& grid) {
  const int last = grid.dims.pp - 1;
  if (cfg.num_nextn_predict_layers == 0 || grid.dims.pp <= 1 || (grid.me.pp != 0 && grid.me.pp != last)) return;
  const model::ParamSpec& e = layout.find("model.embed_tokens.weight");
  grid.pipeline_ends.allreduce_sum(grads + e.offset, static_cast<int64_t>(e.numel));
}

void sync_gradients(const model::ParamLayout& layout, float* grads, const Grid& grid) {
  const auto& specs = layout.specs();
  size_t i = 0;
  while (i < specs.size()) {
    size_t j = i;
    // Layout offsets are contiguous, so a run of specs of one kind is one span of memory.
    while (j < specs.size() && specs[j].is_expert == specs[i].is_expert) ++j;
    const size_t begin = specs[i].offset, end = specs[j - 1].offset + specs[j - 1].numel;
    const comm::Group& g = specs[i].is_expert ? grid.dp : grid.data;
    const comm::NodeSplit& nodes = specs[i].is_expert ? grid.dp_nodes : grid.data_nodes;
    comm::allreduce_sum(g, nodes, grads + begin, static_cast<int64_t>(end - begin));
    i = j;
  }
}

}  // namespace moe::parallel
