// The one schema of a metrics.jsonl line: the trainer writes a StepRecord per optimizer step
// (to_json), `moetrain report` reads them back (from_json), and docs/metrics.md is printed from the
// field list below (tests/tool_metrics_doc.cpp; ctest metrics_doc fails when the page is stale).
// metrics.jsonl holds step records only, one per step in step order; a resumed run appends.
//
// Reading older files: every field but "step" may be absent. An absent number reads as NaN, an
// absent count as -1 (ranks_per_node 0), an absent list as empty, an absent object as nullopt;
// null is how a non-finite number is written (a skipped step's loss) and reads as NaN too. A field
// of the wrong type is an error naming the line (`where`) and the field.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace moe::train {

// "stages": one per pipeline stage, the figures of the stage's slowest rank.
struct StageRecord {
  int stage = 0;
  double layers = NAN;  // decoder layers of the stage (an integer)
  double compute_s = NAN, bubble_s = NAN, all_to_all_s = NAN, step_s = NAN;
  double activation_peak_bytes = NAN, total_peak_bytes = NAN;
  double max_in_flight = NAN;  // micro-batches held at once (an integer)
};

// "migration": the experts moved after this step (train --balance.migrate-every), before step + 1.
struct MigrationRecord {
  struct Layer {
    int layer = 0, swaps = 0;
    double imbalance_before = NAN, imbalance_after = NAN;  // max/mean EP-rank load
  };
  std::vector<Layer> layers;  // the layers that migrated, ascending
  double bytes_moved = NAN;   // by all ranks
  double seconds = NAN;       // the slowest rank's
};

// "time_budget": --time-budget's choice of the step count, on the step that made it.
struct TimeBudgetRecord {
  double budget_s = NAN, step_time_s = NAN, spent_s = NAN;
  int timed_steps = 0, steps = 0;
};

struct StepRecord {
  int step = 0;  // 1-based
  double loss = NAN, ce_loss = NAN, aux_loss = NAN, lr = NAN, grad_norm = NAN;
  double mtp_loss = NAN;  // DeepSeek-V3's multi-token prediction (0 without the module)
  double tokens = NAN;    // written as an integer
  double tokens_per_s = NAN, mfu = NAN;
  struct MfuPeak {
    double gflops = NAN;
    std::string precision, source;
  } mfu_peak;
  double step_time_s = NAN, elapsed_s = NAN, bubble_fraction = NAN;
  struct Times {
    double pipeline = NAN, compute = NAN, bubble = NAN, grad_sync = NAN, optimizer = NAN, all_to_all = NAN;
    std::vector<std::pair<std::string, double>> moe;  // --profile: MoE step name -> seconds
  } time_s;
  std::vector<double> a2a_rank_s;                       // [world rank]
  int ranks_per_node = 0;                               // 0: absent
  std::array<double, 4> a2a_bytes{NAN, NAN, NAN, NAN};  // by link class (kLinkClassNames); integers
  double activation_peak_bytes = NAN;                   // integer
  std::vector<double> optimizer_bytes;                  // [world rank]
  std::vector<double> moe_dispatch_bytes;               // [world rank]
  std::vector<StageRecord> stages;
  std::vector<std::vector<int64_t>> expert_loads;  // [MoE layer][expert]
  std::vector<int> expert_loads_layers;            // [MoE layer]: its layer index
  std::vector<std::vector<double>> rank_loads;     // [MoE layer][EP rank]; EP > 1 only
  std::vector<double> load_imbalance;              // [MoE layer]: max/mean of rank_loads
  std::optional<MigrationRecord> migration;
  std::optional<TimeBudgetRecord> time_budget;
  double val_loss = NAN, val_loss_nats_per_byte = NAN;  // evaluation steps only
  double val_loss_start = NAN;                          // --init-from: the loaded weights' held-out loss (first line)
};

// The names of the exchange's link classes, in a2a_bytes' order (comm::LinkClass).
constexpr const char* kLinkClassNames[4] = {"same_rank", "intra_node", "inter_node", "inter_group"};
// Per-rank lists (a2a_rank_s, ...) longer than this are refused on reading.
constexpr size_t kMaxRecordRanks = size_t{1} << 16;

nlohmann::json to_json(const StepRecord& r);
// Appends r to `out` (metrics.jsonl) as one line and flushes. A write that fails (a full disk, a
// file-size limit: EFBIG, SIGXFSZ being ignored) throws naming `path` and the step, so the run
// stops with one line instead of training on with its metrics silently cut short.
void append_step_record(std::ostream& out, const StepRecord& r, const std::string& path);
// Throws moe::Error "<where>: \"<field>\" must be ..." on a field of the wrong type or range.
StepRecord step_record_from_json(const nlohmann::json& j, const std::string& where);

// One row of docs/metrics.md: a field's path ("time_s.compute", "stages[].step_s"), its JSON
// type, when it is written, and what it means.
struct FieldDoc {
  const char* path;
  const char* type;
  const char* written;
  const char* meaning;
};
const std::vector<FieldDoc>& step_record_fields();
// docs/metrics.md: the page, from step_record_fields().
std::string metrics_doc_markdown();

}  // namespace moe::train
