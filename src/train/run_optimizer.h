// A run's AdamW over its grid: the state whole, or split over the ranks that share each gradient
// (--zero1, parallel/zero1.h); the global gradient norm's reduction over the groups; and every
// rank's state bytes (the metrics' optimizer_bytes).
#pragma once
#include <memory>
#include <vector>

#include "model/model.h"
#include "parallel/grid.h"
#include "parallel/zero1.h"
#include "train/optimizer.h"

namespace moe::train {

struct RunOptimizer {
  std::unique_ptr<parallel::ZeroShard> shard;
  std::unique_ptr<AdamW> adamw;
  std::vector<double> bytes_per_rank;  // AdamW state bytes of every world rank
};

// Collective over the world (the bytes of every rank). The grid must outlive the optimizer.
RunOptimizer make_run_optimizer(model::Model& model, const OptimConfig& cfg, const parallel::Grid& grid, bool zero1);

// Collective over the world: the weights and AdamW moments finite on every rank (what a
// checkpoint or the final weights may be written from).
bool state_finite(const model::Model& model, AdamW& opt, const parallel::Grid& grid);

}  // namespace moe::train
