// Expert migration (Piper): between two steps, every EP group moves experts between its ranks so
// that the measured loads spread evenly (`train --balance.migrate-every N --balance.threshold X`).
//
// Decision: the same on every rank, from the same global loads (tokens per logical expert, summed
// over the micro-batches and data ranks of the steps since the last migration, and over the
// pipeline stages, so every rank knows every layer's loads). A layer whose max/mean rank load
// exceeds the threshold gets balance::hill_climb (at most 100 swaps); the whole model's map is kept
// on every rank, each stage moving the weights of its own layers.
//
// Move: each expert that changes rank sends its weights and AdamW m, v (9 arrays of F·H floats:
// gate, up, down of each) point to point inside the EP group; experts that stay keep their slots.
// Gradients are zero between steps and are not moved. The map switches on every rank at once,
// at the step boundary (Model::set_placement). Losses with migration on and off are bit-identical
// because the combine sums each token's expert outputs in logical-expert order
// (ExpertParallel::placement_independent_sum) and every expert sees its rows in (source rank,
// token) order wherever it lives.
#pragma once
#include <cstdint>
#include <vector>

#include "balance/placement.h"
#include "comm/group.h"
#include "model/model.h"

namespace moe::train {

struct LayerMigration {
  int layer = 0;  // model layer
  int swaps = 0;
  double imbalance_before = 1, imbalance_after = 1;  // max/mean rank load on the window's loads
};

struct MigrationReport {
  std::vector<LayerMigration> layers;  // the layers that migrated
  double bytes_moved = 0;              // sent by all ranks of all EP groups (summed in the caller)
  double seconds = 0;                  // this rank's wall time of the move
};

// The new placement for the window's loads (loads[i] = the i-th MoE layer's [E] tokens, MoE layers
// in model order): layers above `threshold` hill-climbed, the others kept. Pure.
balance::Placement plan_migration(const balance::Placement& current, const std::vector<int>& moe_layer_ids,
                                  const std::vector<std::vector<double>>& loads, double threshold,
                                  std::vector<LayerMigration>* changed);

// Moves this rank's experts from model.placement() to `to` (the layers of model's stage), over the
// EP group `ep`, and switches the model's map. blocks: the arrays laid out like the parameters that
// move with the experts (the weights, AdamW m and v), on the model's device. Returns the bytes this
// rank sent. Collective over `ep`.
double move_experts(model::Model& model, const balance::Placement& to, const comm::Group& ep,
                    const std::vector<float*>& blocks);

}  // namespace moe::train
