// moetrain_smpi_a2a: `moetrain bench a2a` for SimGrid SMPI (-DMOETRAIN_SMPI=ON, build-smpi/): the
// real token exchange (comm/exchange.cpp, unchanged) on a simulated platform, under smpirun:
//   smpirun -np 64 -platform platforms/frontier-4n.xml -hostfile hosts.txt \
//     build-smpi/moetrain_smpi_a2a --topo.ranks-per-node 8 -b 64K -e 64K --msg-overhead-us 0.4
// The same options as `moetrain bench a2a`, plus the simulation's own:
//   --msg-overhead-us  CPU time each message costs its sender and its receiver (comm/sim_overhead.h)
//   --no-check-rows    skip comparing row contents (for runs whose buffers SMPI's shared malloc
//                      folds: --cfg=smpi/auto-shared-malloc-thresh); origins and counts are checked
// Times are simulated (MPI_Wtime under SMPI); every rank's host compute is free unless the run
// passes --cfg=smpi/simulate-computation:yes.
#include "tools/smpi/smpi_cli.h"  // first: CLI11 without smpicxx's exit macro
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench_a2a.h"
#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "comm/sim_overhead.h"
#include "comm/topology.h"
#include "core/error.h"
#include "tools/bench_driver.h"

namespace {

struct Cli {
  moe::comm::A2aBenchOptions opts;
  std::string min_bytes = "256K", max_bytes = "8M";
  std::vector<std::string> algorithms = {"flat", "rbd", "halo", "rbd-halo"};
  int ranks_per_node = 0, nodes_per_group = 0;
  double overhead_us = 0;
  bool no_check_rows = false;
};

void add_options(CLI::App& app, Cli& a) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("-b,--min-bytes", a.min_bytes, "smallest size per rank (flat dispatch bytes)")->capture_default_str();
  app.add_option("-e,--max-bytes", a.max_bytes, "largest size per rank")->capture_default_str();
  app.add_option("-f,--factor", a.opts.factor, "size multiplier")->capture_default_str();
  app.add_option("--hidden", a.opts.hidden, "row width H")->capture_default_str();
  app.add_option("--experts", a.opts.experts, "experts E")->capture_default_str();
  app.add_option("--topk", a.opts.topk, "experts per token k")->capture_default_str();
  app.add_option("--algos", a.algorithms, "algorithms (flat,rbd,halo,rbd-halo)")->delimiter(',');
  app.add_option("--routing", a.opts.routing, "uniform or skewed")->capture_default_str();
  app.add_option("--iters", a.opts.iters, "timed iterations")->capture_default_str();
  app.add_option("--warmup", a.opts.warmup, "untimed iterations")->capture_default_str();
  app.add_option("--seed", a.opts.seed, "routing seed")->capture_default_str();
  app.add_option("--topo.ranks-per-node", a.ranks_per_node, "ranks per simulated node");
  app.add_option("--topo.nodes-per-group", a.nodes_per_group, "nodes per switch group");
  app.add_option("--msg-overhead-us", a.overhead_us, "simulated CPU time per message sent and received (us)")
      ->capture_default_str();
  app.add_flag("--no-check-rows", a.no_check_rows, "do not compare row contents (shared-malloc runs)");
  app.add_flag("--json", a.opts.json, "print JSON instead of a table");
}

int run(Cli& a, int* argc, char*** argv) {
  using namespace moe;
  return tools::run_on_ranks(argc, argv, "moetrain_smpi_a2a", [&](comm::Group& world) {
    MOE_CHECK(std::isfinite(a.opts.factor) && a.opts.factor <= 1024, "-f must be a finite number in (1, 1024], got ",
              a.opts.factor);
    MOE_CHECK(std::isfinite(a.overhead_us), "--msg-overhead-us must be finite, got ", a.overhead_us);
    a.opts.min_bytes = tools::parse_size("-b", a.min_bytes);
    a.opts.max_bytes = tools::parse_size("-e", a.max_bytes);
    a.opts.check_rows = !a.no_check_rows;
    a.opts.algorithms.clear();
    for (const std::string& s : a.algorithms) a.opts.algorithms.push_back(parse_a2a(s, "--algos"));
    comm::set_sim_message_overhead(a.overhead_us * 1e-6);
    comm::Topology topo = comm::Topology::detect(world.size(), a.ranks_per_node, a.nodes_per_group);
    comm::A2aBenchResult r = comm::run_a2a_bench(world, topo, a.opts);
    if (world.rank() == 0)
      std::printf("%s\n", a.opts.json ? comm::a2a_bench_json(r).c_str() : comm::format_a2a_table(r).c_str());
  });
}

}  // namespace

int main(int argc, char** argv) {
  Cli a;
  CLI::App app{"moetrain bench a2a under SimGrid SMPI (run with smpirun)"};
  add_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli_exit(app, e);
  }
  return run(a, &argc, &argv);
}
