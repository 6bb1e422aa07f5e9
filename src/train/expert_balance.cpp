#include "train/expert_balance.h"

#include <algorithm>
#include <cstdio>

#include "core/timer.h"
#include "train/migration.h"
#include "train/run_memory.h"

namespace moe::train {

ExpertBalance::ExpertBalance(const model::ModelConfig& cfg, const BalanceOptions& opts, const parallel::Grid& grid,
                             const model::StageSpec& stage, bool report, bool tty)
    : opts_(opts), grid_(grid), E_(cfg.n_routed_experts), report_(report), tty_(tty), score_bias_(cfg, opts.bias_rate) {
  // The metrics carry every MoE layer's loads, not only the root's stage: each stage puts its
  // layers' loads at their place among all MoE layers (the first moe_before_stage_ belong to
  // earlier stages) and the pipeline group sums them.
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    moe_layer_ids_.push_back(l);
    if (l < stage.first_layer) ++moe_before_stage_;
  }
}

void ExpertBalance::add_micro_batch(const model::Model& model, const model::Model::MicroBatch& mb,
                                    std::vector<int64_t>& stage_loads) {
  std::vector<int64_t> f;
  for (auto& l : model.expert_loads(mb)) f.insert(f.end(), l.begin(), l.end());
  if (stage_loads.empty()) stage_loads.assign(f.size(), 0);
  for (size_t i = 0; i < f.size(); ++i) stage_loads[i] += f[i];
}

StepBalance ExpertBalance::after_update(model::Model& model, std::vector<int64_t> stage_loads, int step,
                                        int total_steps, bool skipped, const std::vector<float*>& moving) {
  StepBalance out;
  // This stage's layers summed over the data ranks, then placed among all MoE layers and summed
  // over the pipeline.
  std::vector<int64_t>& loads = out.loads;
  loads = std::move(stage_loads);
  if (grid_.tokens.size() > 1 && !loads.empty())
    grid_.tokens.allreduce_sum(loads.data(), static_cast<int64_t>(loads.size()));
  const size_t all = moe_layer_ids_.size() * E_;
  if (grid_.pp.size() > 1 && all > 0) {
    std::vector<int64_t> placed(all, 0);
    std::copy(loads.begin(), loads.end(), placed.begin() + static_cast<size_t>(moe_before_stage_) * E_);
    grid_.pp.allreduce_sum(placed.data(), static_cast<int64_t>(placed.size()));
    loads = std::move(placed);
  }
  if (score_bias_.active() && !skipped) {
    score_bias_.update(loads);
    score_bias_.apply(model);
  }
  if (grid_.dims.ep <= 1 || loads.size() != all) return out;
  std::vector<std::vector<double>> by_layer(moe_layer_ids_.size());
  for (size_t i = 0; i < moe_layer_ids_.size(); ++i) {
    by_layer[i].assign(loads.begin() + i * E_, loads.begin() + (i + 1) * E_);
    const balance::LayerPlacement& where = model.placement().layers[moe_layer_ids_[i]];
    out.rank_loads.push_back(balance::rank_loads(where, by_layer[i]));
    out.imbalance.push_back(balance::imbalance(where, by_layer[i]));
  }
  if (opts_.migrate_every == 0 || skipped || (step + 1) % opts_.migrate_every != 0 || step + 1 >= total_steps)
    return out;
  const double t0 = now_seconds();
  std::vector<LayerMigration> changed;
  const balance::Placement next = plan_migration(model.placement(), moe_layer_ids_, by_layer, opts_.threshold, &changed);
  if (changed.empty()) return out;
  double moved = move_experts(model, next, grid_.ep, moving);
  double seconds = now_seconds() - t0;
  grid_.world.allreduce_sum(&moved, 1);
  grid_.world.allreduce_max(&seconds, 1);
  MigrationRecord m{{}, moved, seconds};
  for (const LayerMigration& lm : changed) m.layers.push_back({lm.layer, lm.swaps, lm.imbalance_before, lm.imbalance_after});
  out.migration = std::move(m);
  if (report_)
    for (const LayerMigration& lm : changed)
      std::fprintf(stderr, "%sstep %d: layer %d migrated %d expert swap(s), rank imbalance %.3f -> %.3f "
                           "(%s moved in %.1f ms, all layers)\n",
                   tty_ ? "\n" : "", step + 1, lm.layer, lm.swaps,
                   lm.imbalance_before, lm.imbalance_after, format_bytes(moved).c_str(), 1e3 * seconds);
  return out;
}

void ExpertBalance::add_to_record(const StepBalance& b, StepRecord& rec) const {
  for (size_t pos = 0; E_ > 0 && pos < b.loads.size(); pos += E_)
    rec.expert_loads.emplace_back(b.loads.begin() + pos, b.loads.begin() + pos + E_);
  rec.expert_loads_layers = moe_layer_ids_;
  rec.rank_loads = b.rank_loads;
  rec.load_imbalance = b.imbalance;
  rec.migration = b.migration;
}

}  // namespace moe::train
