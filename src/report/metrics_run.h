// The metrics of a training run as `moetrain report` reads them: every step record of a
// metrics.jsonl through the schema the trainer writes with (train/step_record.h), a resumed run's
// later record replacing the earlier one, the expert loads kept as floats (thinned in time when
// they would not fit), and the wall time across resumed processes.
#pragma once
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "train/step_record.h"

namespace moe::report {

// A step record as the report keeps it: the line (its expert_loads moved into `loads`, as floats,
// possibly thinned) and its wall time across resumed processes.
struct Rec {
  train::StepRecord m;
  double wall = NAN;
  std::vector<float> loads;  // [layer][expert] flattened; empty when absent or not kept
};

struct Run {
  std::string metrics_path;
  std::map<int, Rec> recs;  // by step: a resumed run's later record replaces the earlier one
  int lines = 0, replaced = 0, other_events = 0;
  bool dropped_torn_line = false;
  int loads_layers = 0, loads_experts = 0, loads_stride = 1;
  std::vector<int> loads_layer_ids;
  // --time-budget's choice (the "time_budget" of the step that made it); budget_steps 0: none.
  double budget_s = NAN, budget_step_time = NAN;
  int budget_steps = 0, budget_at = 0;
};

// Reads path (in_folder: RUN/metrics.jsonl found in the run folder, where a symbolic link is
// refused (io/data_file.h); a metrics file the user named is followed; either way a regular file).
// Throws moe::Error naming the file and the line of a bad record; a torn last line (the run was
// killed mid-write) is left out and flagged in dropped_torn_line.
Run read_metrics(const std::string& path, bool in_folder);

}  // namespace moe::report
