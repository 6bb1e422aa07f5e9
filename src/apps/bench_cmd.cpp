// `moetrain bench`. See bench_cmd.h.
#include "apps/bench_cmd.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "apps/cli_checks.h"
#include "apps/mode_option.h"
#include "comm/topology.h"
#include "core/device.h"
#include "core/error.h"
#include "kernels/gemm.h"
#include "tools/bench_driver.h"

namespace moe::apps {
namespace {

void add_a2a_bench(CLI::App* bench, BenchCli::A2a& a) {
  CLI::App* m = add_command(*bench, "a2a", "token exchange: flat vs rbd vs halo (run under mpirun)");
  m->add_option("-b,--min-bytes", a.min_bytes, "smallest size per rank (flat dispatch bytes)")->capture_default_str();
  m->add_option("-e,--max-bytes", a.max_bytes, "largest size per rank")->capture_default_str();
  m->add_option("-f,--factor", a.opts.factor, "size multiplier")->capture_default_str();
  m->add_option("--hidden", a.opts.hidden, "row width H")->capture_default_str();
  m->add_option("--experts", a.opts.experts, "experts E")->capture_default_str();
  m->add_option("--topk", a.opts.topk, "experts per token k")->capture_default_str();
  m->add_option("--algos", a.algorithms, "algorithms (flat,rbd,halo,rbd-halo)")->delimiter(',');
  m->add_option("--routing", a.opts.routing, "uniform, skewed or node-limited")->capture_default_str();
  m->add_option("--topk-group", a.opts.topk_group, "node-limited: nodes a token may reach (DeepSeek-V3's M)");
  m->add_option("--iters", a.opts.iters, "timed iterations")->capture_default_str();
  m->add_option("--warmup", a.opts.warmup, "untimed iterations")->capture_default_str();
  m->add_option("--seed", a.opts.seed, "routing seed")->capture_default_str()->check(kNonNegativeInteger);
  m->add_option("--topo.ranks-per-node", a.ranks_per_node, "emulate nodes of this many ranks");
  m->add_option("--topo.nodes-per-group", a.nodes_per_group, "emulate switch groups of this many nodes");
  m->add_flag("--json", a.opts.json, "print JSON instead of a table");
}

void add_pipeline_bench(CLI::App* bench, BenchCli::Pipe& p) {
  CLI::App* m = add_command(*bench, "pipeline", "pipeline bubble of 1F1B / GPipe vs (PP-1)/(M+PP-1) (run under mpirun, one rank per stage)");
  m->add_option("--micro-batches", p.opts.micro_batches, "M values, e.g. 1,2,4,8,16")->delimiter(',');
  m->add_option_function<std::string>(
       "--schedule",
       [&p](const std::string& s) {
         p.opts.schedule = find_mode<Schedule>(s);
         MOE_CHECK(p.opts.schedule || s == "both", "--schedule: unknown pipeline schedule '", s,
                   "' (expected 1f1b, gpipe or both)");
       },
       "1f1b, gpipe or both")
      ->default_str(name(*p.opts.schedule));
  m->add_option("--forward-ms", p.opts.forward_ms, "forward time per micro-batch and stage (backward = 2x)")->capture_default_str();
  m->add_option("--activation-floats", p.opts.activation_floats, "floats per micro-batch activation")->capture_default_str();
  m->add_option("--iters", p.opts.iters, "measured steps per row")->capture_default_str();
  m->add_option("--mode", p.opts.mode, "sleep (fixed-time stages) or gemm (real sgemm; one core per rank)")->capture_default_str();
  m->add_flag("--json", p.json, "print JSON instead of a table");
}

int run_pipeline_bench(BenchCli::Pipe& p, int* argc, char*** argv) {
  // Ranks waiting for a neighbour yield their core instead of busy-polling (unless the user says
  // otherwise): with more ranks than cores, polling would steal time from the working stage.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  return tools::run_on_ranks(argc, argv, "moetrain", [&](comm::Group& world) {
    MOE_CHECK(std::isfinite(p.opts.forward_ms) && p.opts.forward_ms <= 60000,
              "--forward-ms must be a finite number of milliseconds in (0, 60000], got ", p.opts.forward_ms);
    MOE_CHECK(p.opts.activation_floats <= (size_t{1} << 30), "--activation-floats must be at most 2^30, got ",
              p.opts.activation_floats);
    parallel::PipelineBenchResult r = parallel::run_pipeline_bench(world, p.opts);
    if (world.rank() == 0)
      std::printf("%s\n", p.json ? parallel::pipeline_bench_json(r).c_str() : parallel::format_pipeline_table(r).c_str());
  });
}

int run_a2a_bench(BenchCli::A2a& a, int* argc, char*** argv) {
  return tools::run_on_ranks(argc, argv, "moetrain", [&](comm::Group& world) {
    MOE_CHECK(std::isfinite(a.opts.factor) && a.opts.factor <= 1024, "-f must be a finite number in (1, 1024], got ",
              a.opts.factor);
    a.opts.min_bytes = tools::parse_size("-b", a.min_bytes);
    a.opts.max_bytes = tools::parse_size("-e", a.max_bytes);
    a.opts.algorithms.clear();
    for (const std::string& s : a.algorithms) a.opts.algorithms.push_back(parse_a2a(s, "--algos"));
    comm::Topology topo = comm::Topology::detect(world.size(), a.ranks_per_node, a.nodes_per_group);
    comm::A2aBenchResult r = comm::run_a2a_bench(world, topo, a.opts);
    if (world.rank() == 0)
      std::printf("%s\n", a.opts.json ? comm::a2a_bench_json(r).c_str() : comm::format_a2a_table(r).c_str());
  });
}

int run_moe_layer_bench(BenchCli& s) {
  mixture::MoeBenchOptions& b = s.moe;
  MOE_CHECK(s.moe_threads >= 1 && s.moe_threads <= 1024, "--threads must be in [1, 1024], got ", s.moe_threads);
  MOE_CHECK(std::isfinite(b.capacity_factor) && b.capacity_factor >= 0,
            "--capacity-factor must be a finite number >= 0, got ", b.capacity_factor);
  kernels::set_blas_threads(s.moe_threads);
  require_device(b.device, "--device");
  auto result = mixture::run_moe_layer_bench(b);
  std::printf("%s\n", s.moe_json ? mixture::moe_bench_json(result).c_str()
                                 : mixture::format_moe_bench_table(result).c_str());
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, BenchCli& s) {
  mixture::MoeBenchOptions& b = s.moe;
  bool& json = s.moe_json;
  int& threads = s.moe_threads;
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_a2a_bench(bench, s.a2a);
  add_pipeline_bench(bench, s.pipe);
  CLI::App* m = add_command(*bench, "moe-layer", "one MoE layer forward+backward: padding-free vs padded");
  m->add_option("--tokens", b.tokens, "tokens T")->capture_default_str();
  m->add_option("--hidden", b.hidden, "hidden size H")->capture_default_str();
  m->add_option("--experts", b.experts, "routed experts E")->capture_default_str();
  m->add_option("--topk", b.topk, "experts per token k")->capture_default_str();
  m->add_option("--ffn", b.ffn, "expert width F")->capture_default_str();
  m->add_option("--shared", b.shared, "shared expert width (0 = none)")->capture_default_str();
  m->add_option("--capacity-factor", b.capacity_factor, "capacity factor of the padded path")->capture_default_str();
  m->add_option("--iters", b.iters, "timed iterations (median reported)")->capture_default_str();
  m->add_option("--warmup", b.warmup, "untimed iterations")->capture_default_str();
  m->add_option("--seed", b.seed, "seed")->capture_default_str()->check(kNonNegativeInteger);
  m->add_option("--threads", threads, "BLAS threads")->capture_default_str();
  add_mode_option(m, "--device", b.device, "cpu or cuda (on cuda only the padding-free path runs)");
  add_mode_option(m, "--precision", b.precision, "fp32, or bf16 GEMM inputs (cuBLAS, or oneDNN on a CPU with AVX-512 BF16)");
  m->add_flag("--json", json, "print JSON instead of a table");
  m->add_flag("!--no-padded", b.run_padded, "skip the capacity-padded baseline");
  m->add_flag("--breakdown", b.breakdown, "also print each step's forward and backward time");
}

int run_bench_command(CLI::App& app, BenchCli& s, int* argc, char*** argv) {
  if (!app.got_subcommand("bench")) return -1;
  CLI::App* bench = app.get_subcommand("bench");
  if (bench->got_subcommand("a2a")) return run_a2a_bench(s.a2a, argc, argv);
  if (bench->got_subcommand("pipeline")) return run_pipeline_bench(s.pipe, argc, argv);
  return run_moe_layer_bench(s);
}

}  // namespace moe::apps
