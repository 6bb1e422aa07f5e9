// Where the routed experts live: per MoE layer, logical expert e -> (EP rank, local slot) and its
// inverse. The one place that answers "which rank holds expert e" (the model's parameter layout,
// the token dispatcher, checkpoints, bench a2a and migration all ask it). Every rank of an EP
// group holds the same number of experts (E / ep); a slot is the expert's position in the rank's
// stacked [El, F, H] weights.
//
// This header is a leaf (core only), so model/, moe/ and comm/ can use the map; the policy that
// changes it (hill_climb below, pure) and the migration that moves weights (train/migration.h)
// sit above them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moe::balance {

class LayerPlacement {
 public:
  LayerPlacement() = default;  // a dense layer: no routed experts
  // Rank r holds experts [r·E/ep, (r+1)·E/ep) in ascending slots: the default placement.
  static LayerPlacement contiguous(int num_experts, int ep_size);
  // experts_at[r]: rank r's logical experts in slot order. Every rank the same count, every expert
  // of [0, E) exactly once; a violation throws naming `what`.
  static LayerPlacement from_ranks(const std::vector<std::vector<int>>& experts_at, const std::string& what);

  bool empty() const { return E_ == 0; }
  int num_experts() const { return E_; }
  int ep_size() const { return ep_; }
  int per_rank() const { return ep_ ? E_ / ep_ : 0; }
  int rank_of(int e) const { return rank_of_[e]; }
  int slot_of(int e) const { return slot_of_[e]; }
  int expert_at(int rank, int slot) const { return expert_at_[static_cast<size_t>(rank) * per_rank() + slot]; }
  std::vector<int> experts_of(int rank) const;  // slot order
  bool is_contiguous() const;
  // Exchanges the places (rank and slot) of experts a and b.
  void swap_experts(int a, int b);
  bool operator==(const LayerPlacement& o) const {
    return E_ == o.E_ && ep_ == o.ep_ && expert_at_ == o.expert_at_;
  }
  bool operator!=(const LayerPlacement& o) const { return !(*this == o); }

 private:
  int E_ = 0, ep_ = 0;
  std::vector<int32_t> rank_of_, slot_of_, expert_at_;  // [E], [E], [ep · E/ep]
};

// Every layer of a model, indexed by model layer (dense layers hold an empty LayerPlacement).
struct Placement {
  std::vector<LayerPlacement> layers;

  // The contiguous placement of every layer for which is_moe[l].
  static Placement contiguous(const std::vector<bool>& is_moe, int num_experts, int ep_size);
  bool is_contiguous() const;
  bool operator==(const Placement& o) const { return layers == o.layers; }
  // The checkpoint manifest's "expert_placement": {"<layer>": [[rank 0's experts in slot order],
  // [rank 1's], ...]}. from_json also reads the older {"<layer>": [rank of expert e, ...]} (slots
  // in ascending expert order). Errors name `what`, the layer and the value.
  nlohmann::json to_json() const;
  static Placement from_json(const nlohmann::json& j, const std::vector<bool>& is_moe, int num_experts,
                             int ep_size, const std::string& what);
};

// ---- load statistics and Piper's hill climb (pure) ----

// Per-rank load of a layer: the sum of the loads of the experts each rank holds.
std::vector<double> rank_loads(const LayerPlacement& p, const std::vector<double>& expert_load);
// max / mean of rank_loads (1 = balanced; 1 when the layer had no load).
double imbalance(const LayerPlacement& p, const std::vector<double>& expert_load);

struct SwapStep {
  int a = -1, b = -1;  // the experts whose places were exchanged
};
// Piper's hill climb on one layer: repeatedly take the most and the least loaded rank and apply
// the swap of one expert of each that most lowers the larger of the two ranks' loads; stop when
// no swap lowers it or after max_swaps. Ties break by rank, then slot order (the first best pair),
// so every rank computes the same swaps from the same loads. Returns the swaps applied to `p`, in order.
std::vector<SwapStep> hill_climb(LayerPlacement& p, const std::vector<double>& expert_load, int max_swaps = 100);

}  // namespace moe::balance
