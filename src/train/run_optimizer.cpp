#include "train/run_optimizer.h"

#include <cmath>

#include "kernels/adamw.h"

namespace moe::train {

RunOptimizer make_run_optimizer(model::Model& model, const OptimConfig& cfg, const parallel::Grid& grid, bool zero1) {
  RunOptimizer o;
  // --zero1: this rank keeps and updates only its slice of the AdamW state.
  o.shard = std::make_unique<parallel::ZeroShard>(zero1 ? parallel::ZeroShard::split(model.layout(), grid)
                                                        : parallel::ZeroShard::whole(model.layout()));
  o.adamw = std::make_unique<AdamW>(model.layout(), cfg, o.shard->ranges(), &model.total_memory());
  const parallel::ZeroShard* shard = o.shard.get();
  o.adamw->set_norm_reducer([&grid, shard](double replicated, double experts, double split) {
    if (shard->sharded()) {
      // Each rank's slice of every kind: the data group (EP × DP) completes them.
      double parts[3] = {replicated, experts, split};
      if (grid.data.size() > 1) grid.data.allreduce_sum(parts, 3);
      replicated = parts[0];
      experts = parts[1];
      split = parts[2];
    } else if (grid.ep.size() > 1) {
      grid.ep.allreduce_sum(&experts, 1);
    }
    // The TP ranks hold the same replicated tensors and experts, and each its own slices.
    if (grid.tp.size() > 1) grid.tp.allreduce_sum(&split, 1);
    double sq = replicated + experts + split;
    if (grid.pp.size() > 1) grid.pp.allreduce_sum(&sq, 1);
    return sq;
  });
  o.bytes_per_rank.assign(grid.world.size(), 0.0);
  const double mine = static_cast<double>((o.adamw->m().size() + o.adamw->v().size()) * sizeof(float));
  grid.world.allgather(&mine, o.bytes_per_rank.data(), 1);
  return o;
}

bool state_finite(const model::Model& model, AdamW& opt, const parallel::Grid& grid) {
  // A sum of squares in double is finite exactly when every element is (|x| <= 3.4e38 squares to
  // at most 1.2e77): one reduction on the state's own device, no host copy of a GPU's weights.
  auto finite = [](const float* p, size_t n) { return std::isfinite(kernels::sum_squares(p, n)); };
  int64_t bad = finite(model.params(), model.num_params()) && finite(opt.m().data(), opt.m().size()) &&
                        finite(opt.v().data(), opt.v().size())
                    ? 0
                    : 1;
  if (grid.world.size() > 1) grid.world.allreduce_max(&bad, 1);
  return bad == 0;
}

}  // namespace moe::train
