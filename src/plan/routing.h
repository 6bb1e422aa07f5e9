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
};

// Reads expert_loads from every line of a metrics.jsonl. Errors name the file and line.
RoutingStats read_routing_stats(const std::string& metrics_path);

struct Imbalance {
  double memory = 1.0;  // max over steps of (busiest rank's rows summed over layers) / mean
  double time = 1.0;    // mean over steps and layers of (busiest rank's rows) / mean
};
// For an EP group of `ep` ranks holding experts [r·E/ep, (r+1)·E/ep).
Imbalance routing_imbalance(const RoutingStats& stats, int ep);

}  // namespace moe::plan
