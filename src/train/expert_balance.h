// Expert balance in a training run, after each update: the step's tokens per expert of every MoE
// layer (global: summed over micro-batches, data ranks and pipeline stages, the same on every
// rank), the aux-loss-free selection bias they move (train/score_bias.h), and with expert
// parallelism each layer's tokens per EP rank under the current placement and, every
// --balance.migrate-every steps, the migration of the layers above --balance.threshold
// (train/migration.h). The metrics' expert_loads, rank_loads, load_imbalance and migration.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "model/model.h"
#include "parallel/grid.h"
#include "train/score_bias.h"
#include "train/step_record.h"
#include "train/trainer.h"

namespace moe::train {

struct StepBalance {
  std::vector<int64_t> loads;                   // tokens per expert, [MoE layer][E] flattened, global
  std::vector<std::vector<double>> rank_loads;  // [MoE layer][EP rank]; EP > 1 only
  std::vector<double> imbalance;                // [MoE layer]: max/mean of rank_loads
  std::optional<MigrationRecord> migration;     // the experts moved after this step
};

class ExpertBalance {
 public:
  // stage: this rank's layers; report: the root rank with --progress (prints each migration).
  ExpertBalance(const model::ModelConfig& cfg, const BalanceOptions& opts, const parallel::Grid& grid,
                const model::StageSpec& stage, bool report, bool tty);
  const std::vector<int>& moe_layer_ids() const { return moe_layer_ids_; }  // every MoE layer of the model
  ScoreBias& score_bias() { return score_bias_; }
  // One micro-batch's tokens per expert of this stage's MoE layers, added into stage_loads.
  static void add_micro_batch(const model::Model& model, const model::Model::MicroBatch& mb,
                              std::vector<int64_t>& stage_loads);
  // After the update of (0-based) `step`: the global loads; the selection bias moved by them and
  // handed to the model (not after a skipped step: its update did not happen either); the EP-rank
  // loads; and a migration when one is due (not after the last step, nothing would run on the
  // new map, nor after a skipped one). moving: the arrays laid out like the parameters that move
  // with the experts (weights, AdamW m and v). Collective over the world.
  StepBalance after_update(model::Model& model, std::vector<int64_t> stage_loads, int step, int total_steps,
                           bool skipped, const std::vector<float*>& moving);
  // Its fields of the metrics line: expert_loads (+ _layers), rank_loads, load_imbalance, migration.
  void add_to_record(const StepBalance& b, StepRecord& rec) const;

 private:
  const BalanceOptions& opts_;
  const parallel::Grid& grid_;
  const int E_;
  const bool report_, tty_;
  std::vector<int> moe_layer_ids_;
  int moe_before_stage_ = 0;  // MoE layers of earlier stages
  ScoreBias score_bias_;
};

}  // namespace moe::train
