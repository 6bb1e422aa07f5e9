// `moetrain plan` and `moetrain calibrate`: flags and dispatch (the library does the work:
// plan/ for the resource model, tools/calibrate for the measurements).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "core/modes.h"
#include "tools/calibrate.h"

namespace moe::apps {

struct PlanCli {
  std::string model = "tiny";        // preset or config.json
  std::string cluster = "frontier";  // preset or profile.json
  int gpus = 0;
  int seq_len = 0;                     // 0 = the model's default training length
  long long global_batch = 0;          // 0 = 2 sequences per rank (search) / per micro-batch (evaluate)
  std::optional<Precision> precision;  // none = the cluster's native precision
  int top = 5;
  int max_tp = 1;
  int max_micro_batches = 256;
  bool explain = false, json = false, zero1 = false, evaluate = false;
  std::string layout;  // with --evaluate
  double imbalance = 1.0;
  std::string loads;         // metrics.jsonl whose expert_loads give the routing
  std::string save_cluster;  // write the resolved cluster profile here and stop
  std::string gemm;          // "nt:MxNxK,...": print the cluster's GEMM rates and stop
  train::CalibrateOptions calibrate;
  bool calibrate_quiet = false;
};

void add_plan_commands(CLI::App& app, PlanCli& state);
// Runs plan or calibrate when one was chosen (returns the exit code); -1 otherwise. Errors of
// plan propagate as moe::Error (one line from the caller); calibrate under mpirun reports them
// once and ends every rank.
int run_plan_commands(CLI::App& app, PlanCli& state, int* argc, char*** argv);

}  // namespace moe::apps
