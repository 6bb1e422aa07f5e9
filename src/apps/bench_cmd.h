// `moetrain bench a2a | pipeline | moe-layer`: the benchmarks' flags, then the tool (src/tools/).
// a2a and pipeline run under mpirun (tools/bench_driver.h); moe-layer runs in one process.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "tools/bench_a2a.h"
#include "tools/bench_moe_layer.h"
#include "tools/bench_pipeline.h"

namespace moe::apps {

struct BenchCli {
  struct A2a {
    comm::A2aBenchOptions opts;
    std::string min_bytes = "256K", max_bytes = "8M";
    std::vector<std::string> algorithms = {"flat", "rbd", "halo", "rbd-halo"};
    int ranks_per_node = 0, nodes_per_group = 0;
  } a2a;
  struct Pipe {
    parallel::PipelineBenchOptions opts;
    bool json = false;
  } pipe;
  mixture::MoeBenchOptions moe;
  bool moe_json = false;
  int moe_threads = 1;
};
void add_bench_command(CLI::App& app, BenchCli& state);
// Runs a benchmark when bench was chosen (returns the exit code); -1 otherwise.
int run_bench_command(CLI::App& app, BenchCli& state, int* argc, char*** argv);

}  // namespace moe::apps
