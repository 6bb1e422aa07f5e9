// The planner's search: enumerate PP × DP × EP × TP factorisations of the rank count, micro-batch
// counts, recomputation modes and exchange algorithms; drop what breaks a constraint
// (divisibility, PP ≤ layers, EP group beyond the fast domain, memory over HBM); rank the rest by
// predicted step time. Every rejected family is kept with its constraint and margin for --explain.
// Pruning: memory does not depend on the exchange algorithm (computed once per layout); a
// recomputation mode is only tried when the cheaper ones do not fit (recomputing is never
// faster in the model); rbd/halo only when the EP group spans nodes (otherwise all three are the
// same intra-node exchange).
#pragma once
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/plan_model.h"
#include "plan/routing.h"
#include "plan/time_model.h"

namespace moe::plan {

struct SearchOptions {
  int gpus = 0;  // world size
  TrainShape shape;
  bool zero1 = false;
  int top = 5;
  int max_tp = 1;  // TP + SSMB layouts only when asked (--max-tp)
  int max_micro_batches = 256;
  double imbalance = 1.0;                 // manual: rows on the busiest expert rank / the mean
  const RoutingStats* routing = nullptr;  // measured expert loads (overrides `imbalance`)
};

struct Candidate {
  Layout layout;
  MemoryEstimate memory;
  TimeBreakdown time;
  double capacity = 0;  // bytes per rank
  bool fits = true;
  // The routing imbalance the estimates used (busiest EP rank's rows / the mean; 1 without EP):
  // per step and layer, averaged (time), and the worst step summed over layers (memory).
  double imbalance_time = 1.0, imbalance_memory = 1.0;
};

// One rejected family (pp, ep, tp; dp follows): which constraint, and by how much.
struct Rejection {
  Layout family;           // pp, dp, ep, tp set; for memory, the layout that came closest
  std::string constraint;  // divisibility | layers | fast-domain | memory | batch
  std::string reason;      // "stage 0 needs 212.4 GB > 64 GB HBM by 148.4 GB"
  double over_bytes = 0;   // memory: smallest overshoot over the family's layouts
};

struct SearchResult {
  std::vector<Candidate> best;  // ranked, fastest first
  std::vector<Rejection> rejected;
  long long evaluated = 0;  // layouts whose memory was computed
  long long feasible = 0;
  double seconds = 0;  // time the search took
  MemoryOptions memory_options;
};

// Throws naming the numbers when no layout can exist (gpus < 1, more GPUs than the cluster has).
SearchResult search_plans(const PlanModel& m, const ClusterProfile& c, const SearchOptions& o);

// One given layout (plan --evaluate): the same model, no search. Throws naming the numbers when
// the layout breaks a hard constraint (degrees, divisibility, layers); memory over HBM is
// reported in the result (fits = false), not thrown.
Candidate evaluate_layout(const PlanModel& m, const ClusterProfile& c, const Layout& l,
                          const TrainShape& shape, const RoutingStats* routing = nullptr,
                          double imbalance = 1.0);

// The model options of a layout: the cluster's precision rules and the routing imbalance of its
// EP degree (measured loads when given, else the manual factor, else balanced).
MemoryOptions layout_options(const ClusterProfile& c, const Layout& l, const TrainShape& shape,
                             const RoutingStats* routing, double imbalance);

// The hard (non-memory) constraints of a layout; empty when it passes. Sets `constraint`.
std::string check_layout(const PlanModel& m, const ClusterProfile& c, const Layout& l,
                         const TrainShape& shape, std::string* constraint = nullptr);

}  // namespace moe::plan
