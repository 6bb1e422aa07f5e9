// Routing imbalance for the planner. The balanced assumption (every expert rank receives
// N·k rows) is the default; a measured run's expert loads (metrics.jsonl "expert_loads": tokens
// per expert per MoE layer, for the global batch, every step) give the real one. Every layout
// of moetrain routes exactly as one process does (the parity tests), so the loads of any run of
// the same model, data, seed and global batch give each layout's per-rank rows exactly (per step;
// within a step, micro-batches are assumed to share the step's proportions).
#pragma once
#include <string>
#include <vector>

namespace moe::plan {

struct RoutingStats {
  std::vector<std::vector<std::vector<double>>> steps;  // [step][moe layer][expert] tokens
  int experts = 0;
  std::string source;  // the file read, for errors and the plan's report
};

// Reads expert_loads from every line of a metrics.jsonl. Errors name the file and line.
RoutingStats read_routing_stats(const std::string& metrics_path);

struct Imbalance {
  double memory = 1.0;  // max over steps of (busiest rank's rows summed over layers) / mean
  double time = 1.0;    // mean over steps and layers of (busiest rank's rows) / mean
  // The same for the busiest node: groups of `node_ranks` contiguous ranks (1: = time). An
  // exchange across nodes waits on the node whose shared links carry the most rows.
  double node_time = 1.0;
};
// For an EP group of `ep` ranks in the placement the loads imply: the contiguous one
// (balance::LayerPlacement::contiguous, rank r holds experts [r·E/ep, (r+1)·E/ep)), as moetrain
// train starts every run; balance::imbalance gives each layer's busiest rank / mean. Layers
// without load are skipped. Throws naming both when ep does not divide the experts.
Imbalance routing_imbalance(const RoutingStats& stats, int ep, int node_ranks = 1);

// The loads must come from a model with the same routed-expert count: otherwise every
// per-rank sum is of another model's experts. Throws one line naming the file and both counts.
void check_routing_matches(const RoutingStats& stats, int model_experts, const std::string& model_name);

}  // namespace moe::plan
