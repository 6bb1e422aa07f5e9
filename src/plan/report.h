// What `moetrain plan` prints: the table of the best plans (memory and time breakdowns, tokens/s,
// MFU), the `moetrain train` command that realises a plan, --explain (rejected families with
// their constraint and margin; padded vs padding-free dispatch memory), and --json.
#pragma once
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "plan/cluster.h"
#include "plan/search.h"

namespace moe::plan {

struct ReportContext {
  const PlanModel* model = nullptr;
  const ClusterProfile* cluster = nullptr;
  TrainShape shape;
  int gpus = 0;
  const RoutingStats* routing = nullptr;  // --loads: the header names the file the imbalance came from
};

// "mpirun -np 8 moetrain train --preset tiny --pp 2 --dp 1 --ep 4 --micro-batches 4 ..."
std::string train_command(const ReportContext& ctx, const Layout& l);

std::string format_header(const ReportContext& ctx);
std::string format_plans(const ReportContext& ctx, const SearchResult& r);
std::string format_evaluation(const ReportContext& ctx, const Candidate& c);
// Rejected families, and the dispatch buffers of `best` padded vs padding-free.
std::string format_explain(const ReportContext& ctx, const SearchResult& r, const Candidate* best);

nlohmann::json candidate_json(const ReportContext& ctx, const Candidate& c);
nlohmann::json search_json(const ReportContext& ctx, const SearchResult& r, bool explain);
nlohmann::json padded_json(const ReportContext& ctx, const Candidate& c);
// --loads: the file, its steps and experts (search_json and --evaluate --json carry it).
nlohmann::json loads_json(const RoutingStats& r);

}  // namespace moe::plan
