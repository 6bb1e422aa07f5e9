// The model on this rank of the grid: the layers of its pipeline stage, the token exchange of its
// EP group (its staging rows charged to the model's workspace, so the measured peak includes
// them), and the expert- and tensor-parallel contexts the model's layers call (model/model.h).
// Not movable: the model keeps pointers to the contexts.
#pragma once
#include <memory>

#include "comm/exchange.h"
#include "comm/traffic.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "train/run_setup.h"

namespace moe::train {

class RunModel {
 public:
  // The grid must outlive it. Weights are initialised from opts.data.seed.
  RunModel(const TrainOptions& opts, const RunSetup& setup, const parallel::Grid& grid, const model::StageSpec& stage);
  RunModel(const RunModel&) = delete;
  RunModel& operator=(const RunModel&) = delete;
  model::Model& model() { return *model_; }
  const model::Model& model() const { return *model_; }
  comm::TrafficStats& traffic() { return traffic_; }  // the exchange's bytes and seconds
  // A resumed run whose placement moved keeps summing each token's experts in logical order, as
  // the run that moved it did (train/migration.h).
  void after_resume();

 private:
  comm::TrafficStats traffic_;
  std::unique_ptr<comm::TokenExchange> exchange_;
  mixture::ExpertParallel ep_;
  model::TensorParallel tp_;
  std::unique_ptr<model::Model> model_;
};

}  // namespace moe::train
