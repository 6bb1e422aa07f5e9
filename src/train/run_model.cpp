#include "train/run_model.h"

#include <vector>

namespace moe::train {

RunModel::RunModel(const TrainOptions& opts, const RunSetup& setup, const parallel::Grid& grid,
                   const model::StageSpec& stage) {
  exchange_ = std::make_unique<comm::TokenExchange>(grid.ep, grid.topo, setup.a2a, &traffic_);
  ep_.exchange = grid.dims.ep > 1 ? exchange_.get() : nullptr;
  ep_.rank = grid.me.ep;
  ep_.size = grid.dims.ep;
  ep_.reduce_aux_stats = [&grid](std::vector<double>& v) {
    grid.tokens.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  };
  // Experts that may move are summed in logical order (train/migration.h): the math stays the same.
  ep_.placement_independent_sum = opts.balance.migrate_every > 0;
  ep_.overlap_shared = opts.parallel.comm_overlap;
  tp_ = {&grid.tp, grid.me.tp, grid.dims.tp};
  model_ = std::make_unique<model::Model>(setup.cfg, opts.model.moe,
                                          grid.data_size() > 1 || grid.dims.tp > 1 ? &ep_ : nullptr, stage,
                                          setup.recompute, &tp_);
  exchange_->set_staging_tracker(&model_->work_memory());
  model_->init_weights(opts.data.seed);
  model_->set_mtp_weight(opts.model.mtp_weight);
}

void RunModel::after_resume() {
  if (!model_->placement().is_contiguous()) ep_.placement_independent_sum = true;
}

}  // namespace moe::train
