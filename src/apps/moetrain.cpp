// moetrain: the command-line entry point. Thin: parses flags with CLI11 and calls the library.
// Any moe::Error (bad flag value, bad file, bad config) is printed as one line and exits 1.
#include <CLI/CLI.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include "comm/bench_a2a.h"
#include "comm/mpi_runtime.h"
#include "parallel/bench_pipeline.h"
#include "core/device.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "model/config.h"
#include "moe/bench_moe_layer.h"
#include "train/export.h"
#include "train/run_guard.h"
#include "train/trainer.h"
#include "apps/plan_cmd.h"
#include "apps/inspect_cmd.h"
#include "apps/report_cmd.h"
#include "apps/generate_cmd.h"
#include "apps/eval_cmd.h"
#include "apps/tokenize_cmd.h"
#include "apps/upcycle_cmd.h"
#include "apps/mode_option.h"

using namespace moe;

namespace {

// Unsigned options (seeds): CLI11 would read "-1" as 2^64 - 1. Checked on the text instead.
const CLI::Validator kNonNegativeInteger(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      return digits && v.size() <= 20 ? std::string() : str_cat("must be a non-negative integer, got ", v);
    },
    "INT>=0");

struct PipeCli {
  parallel::PipelineBenchOptions opts;
  bool json = false;
};

struct A2aCli {
  comm::A2aBenchOptions opts;
  std::string min_bytes = "256K", max_bytes = "8M";
  std::vector<std::string> algorithms = {"flat", "rbd", "halo", "rbd-halo"};
  int ranks_per_node = 0, nodes_per_group = 0;
};

void add_train_command(CLI::App& app, train::TrainOptions& o, bool& quiet) {
  CLI::App* t = app.add_subcommand("train", "train a model (default: the tiny preset on the built-in corpus)");
  t->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // later flag wins
  std::string presets;
  for (const std::string& n : model::preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  t->add_option("--preset", o.model.preset, "model preset: " + presets)->capture_default_str();
  t->add_option("--config", o.model.config_path, "Hugging Face config.json (overrides --preset)");
  t->add_option("--init-from", o.model.init_from,
                "start from a Hugging Face model folder's config and weights (fresh optimizer and schedule)");
  t->add_option("--data", o.data.path, "text file, one token per byte (default: data/kjv.txt), or an indexed dataset PREFIX (moetrain tokenize)");
  t->add_option("--vocab-size", o.model.vocab_size, "override the model's vocab_size (e.g. a BPE dataset's)");
  t->add_option("--out", o.out_dir, "output folder")->capture_default_str();
  t->add_option("--steps", o.steps, "optimizer steps (with --time-budget: the most it may choose)")->capture_default_str();
  t->add_option_function<std::string>(
      "--time-budget",
      [&o](const std::string& text) {
        try {
          o.time_budget_s = train::parse_duration_s(text, "--time-budget");
        } catch (const Error& e) {
          throw CLI::ValidationError(e.what());
        }
      },
      "train for this long (e.g. 300, 90s, 5m, 1.5h): seconds of training steps, not counting "
      "evaluations and checkpoints; the step count and its cosine schedule are chosen from the "
      "warm-up steps' median time");
  t->add_option("--batch", o.data.batch,
                "sequences per step per data rank (the global batch is batch x ep x dp; TP ranks share theirs)")
      ->capture_default_str();
  t->add_option("--global-batch", o.data.global_batch,
                "sequences per step over all data ranks (Megatron's global batch): sets --batch to it / (ep x dp)");
  t->add_option("--seq-len", o.data.seq_len, "tokens per sequence")->capture_default_str();
  t->add_option("--seed", o.data.seed, "seed for weights and data order")->capture_default_str()->check(kNonNegativeInteger);
  t->add_option("--lr", o.optim.lr, "peak learning rate")->capture_default_str();
  t->add_option("--min-lr", o.optim.min_lr, "final learning rate of the cosine decay")->capture_default_str();
  t->add_option("--warmup", o.optim.warmup_steps, "linear warm-up steps")->capture_default_str();
  t->add_option("--weight-decay", o.optim.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  t->add_option("--grad-clip", o.optim.grad_clip, "global gradient-norm clip (0 = off)")->capture_default_str();
  t->add_option("--eval-every", o.data.eval_every, "validation every N steps (0 = only at the end)")->capture_default_str();
  t->add_option("--eval-batches", o.data.eval_batches, "validation batches")->capture_default_str();
  t->add_option("--threads", o.device.threads, "BLAS threads")->capture_default_str();
  t->add_option("--peak-gflops", o.device.peak_gflops,
                "MFU's denominator: GFLOP/s per rank at the run's precision (e.g. a calibrated "
                "profile's peak_flops / 1e9); 0 = measure it at start (best of 10 short GEMM runs)")
      ->capture_default_str();
  t->add_option("--capacity-factor", o.model.moe.capacity_factor, "expert capacity factor (0 = dropless)")->capture_default_str();
  t->add_flag("--padded", o.model.moe.padded, "capacity-padded [E,C,H] MoE layout instead of padding-free");
  t->add_option("--pp", o.parallel.dims.pp, "pipeline-parallel stages")->capture_default_str();
  t->add_option("--dp", o.parallel.dims.dp, "data-parallel degree")->capture_default_str();
  t->add_option("--ep", o.parallel.dims.ep, "expert-parallel degree (splits the routed experts)")->capture_default_str();
  t->add_option("--tp", o.parallel.dims.tp, "tensor-parallel degree: heads, dense FFN and tokens split over tp adjacent ranks (Megatron TP + SP, SSMB MoE)")->capture_default_str();
  t->add_option("--micro-batches", o.parallel.micro_batches, "micro-batches per step (pipeline / gradient accumulation)")->capture_default_str();
  t->add_option("--pp.layers", o.parallel.pp_layers, "layers per pipeline stage, e.g. 5,4,4,3 (default: even)")->delimiter(',');
  apps::add_mode_option(t, "--pp.schedule", o.parallel.schedule, "pipeline schedule: 1f1b or gpipe");
  apps::add_mode_option(t, "--recompute", o.model.recompute, "activation checkpointing: none, moe or full");
  t->add_option("--mtp.weight", o.model.mtp_weight,
                "multi-token prediction's loss weight lambda (configs with num_nextn_predict_layers 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  t->add_option_function<float>(
      "--balance.bias-rate", [&o](const float& v) { o.balance.bias_rate = v; },
      "aux-loss-free balancing (topk_method noaux_tc): bias step gamma (default: the config's "
      "bias_update_speed, 1e-3)");
  t->add_option("--balance.migrate-every", o.balance.migrate_every,
                "expert migration (Piper): every N steps, rebalance the EP ranks' loads (0 = never)")->capture_default_str();
  t->add_option("--balance.threshold", o.balance.threshold,
                "migrate a layer when its max/mean EP-rank load exceeds this (> 1)")->capture_default_str();
  apps::add_mode_option(t, "--a2a", o.parallel.a2a, "token exchange: flat, rbd (X-MoE dedup), halo (Piper 3-phase), rbd-halo (both), "
                "or auto: the one the planner prices lowest on --cluster's profile");
  t->add_option("--cluster", o.parallel.a2a_cluster,
                "cluster profile for --a2a auto: a `moetrain calibrate` file (measured on these nodes) or a preset");
  t->add_flag("--comm.overlap", o.parallel.comm_overlap,
              "compute the shared experts while the token exchange is on the network (CPU; the same bits)");
  t->add_option("--topo.ranks-per-node", o.parallel.topo_ranks_per_node, "emulate nodes of this many ranks (0 = from the launcher)");
  t->add_option("--topo.nodes-per-group", o.parallel.topo_nodes_per_group, "emulate switch groups of this many nodes (0 = one group)");
  t->add_option("--checkpoint.dir", o.checkpoint.dir, "checkpoint folder (default <out>/checkpoints)");
  t->add_option("--checkpoint.every", o.checkpoint.every, "checkpoint every N steps (0: at the end and on SIGTERM)")->capture_default_str();
  t->add_option("--checkpoint.keep", o.checkpoint.keep, "complete checkpoints to keep (0 = all)")->capture_default_str();
  t->add_option("--resume", o.checkpoint.resume, "continue from 'latest' (in the checkpoint folder) or a step-N folder");
  t->add_option("--max-bad-steps", o.faults.max_bad_steps, "non-finite steps in a row before stopping")->capture_default_str();
  t->add_option("--fault.nan-steps", o.faults.nan_steps, "testing: poison the gradients of these steps")->delimiter(',');
  t->add_option("--fault.inf-weight-steps", o.faults.inf_weight_steps, "testing: an Inf weight after these steps' updates")
      ->delimiter(',');
  t->add_option("--comm.timeout", o.faults.comm_timeout_s,
                "seconds a rank may wait in one MPI operation before the job ends naming it (0 = forever)")
      ->capture_default_str();
  apps::add_mode_option(t, "--device", o.device.type, "cpu or cuda (one GPU per rank: local rank modulo the visible GPUs)");
  apps::add_mode_option(t, "--comm.backend", o.device.comm_backend,
                        "auto, mpi or nccl: how GPU buffers move between ranks (auto: NCCL when every rank "
                        "has its own GPU, else staged through the host over MPI)");
  apps::add_mode_option(t, "--precision", o.device.precision, "fp32; bf16 GEMM inputs with fp32 accumulation (cuBLAS, or oneDNN on a CPU with AVX-512 BF16); or auto: bf16 where this CPU measures its bf16 GEMM peak at least 1.3x its fp32 peak, else fp32 (and fp32 on CUDA)");
  t->add_flag("--zero1", o.parallel.zero1,
              "ZeRO-1: split the AdamW state over the data ranks (reduce-scatter, sliced update, "
              "all-gather); with one data rank a no-op");
  t->add_flag("--quiet", quiet, "no progress output");
  t->add_flag("--profile", o.profile, "time the MoE layers' steps: time_s.moe in metrics.jsonl, a summary at the end");
}

void add_a2a_bench(CLI::App* bench, A2aCli& a);

void add_pipeline_bench(CLI::App* bench, PipeCli& p);

void add_bench_command(CLI::App& app, mixture::MoeBenchOptions& b, bool& json, int& threads,
                       A2aCli& a2a, PipeCli& pipe) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_a2a_bench(bench, a2a);
  add_pipeline_bench(bench, pipe);
  CLI::App* m = bench->add_subcommand("moe-layer", "one MoE layer forward+backward: padding-free vs padded");
  m->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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
  apps::add_mode_option(m, "--device", b.device, "cpu or cuda (on cuda only the padding-free path runs)");
  apps::add_mode_option(m, "--precision", b.precision, "fp32, or bf16 GEMM inputs (cuBLAS, or oneDNN on a CPU with AVX-512 BF16)");
  m->add_flag("--json", json, "print JSON instead of a table");
  m->add_flag("!--no-padded", b.run_padded, "skip the capacity-padded baseline");
  m->add_flag("--breakdown", b.breakdown, "also print each step's forward and backward time");
}

// "64K" / "8M" / "1G" / "4096" -> bytes; the error names the flag and the value.
int64_t parse_size(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    throw Error(str_cat(flag, ": '", v, "' is not a size (e.g. 4096, 64K, 8M)"));
  }
  std::string unit = v.substr(pos);
  double mult = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0 : -1;
  MOE_CHECK(mult > 0 && std::isfinite(x) && x > 0, flag, ": '", v, "' is not a size (e.g. 4096, 64K, 8M)");
  MOE_CHECK(x * mult <= 1099511627776.0, flag, ": '", v, "' is beyond 1 TB per rank");
  return static_cast<int64_t>(x * mult);
}

void add_a2a_bench(CLI::App* bench, A2aCli& a) {
  CLI::App* m = bench->add_subcommand("a2a", "token exchange: flat vs rbd vs halo (run under mpirun)");
  m->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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

void add_pipeline_bench(CLI::App* bench, PipeCli& p) {
  CLI::App* m = bench->add_subcommand("pipeline", "pipeline bubble of 1F1B / GPipe vs (PP-1)/(M+PP-1) (run under mpirun, one rank per stage)");
  m->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
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

int run_pipeline_bench_cli(int* argc, char*** argv, PipeCli& p) {
  // Ranks waiting for a neighbour yield their core instead of busy-polling (unless the user says
  // otherwise): with more ranks than cores, polling would steal time from the working stage.
  ::setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  comm::MpiRuntime mpi(argc, argv);
  try {
    MOE_CHECK(std::isfinite(p.opts.forward_ms) && p.opts.forward_ms <= 60000,
              "--forward-ms must be a finite number of milliseconds in (0, 60000], got ", p.opts.forward_ms);
    MOE_CHECK(p.opts.activation_floats <= (size_t{1} << 30), "--activation-floats must be at most 2^30, got ",
              p.opts.activation_floats);
    comm::Group world = comm::Group::world();
    parallel::PipelineBenchResult r = parallel::run_pipeline_bench(world, p.opts);
    if (world.rank() == 0)
      std::printf("%s\n", p.json ? parallel::pipeline_bench_json(r).c_str() : parallel::format_pipeline_table(r).c_str());
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    std::fprintf(stderr, "moetrain: error (rank %d of %d): %s\n", mpi.world_rank(), mpi.world_size(), e.what());
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

int run_a2a_bench_cli(int* argc, char*** argv, A2aCli& a) {
  comm::MpiRuntime mpi(argc, argv);
  try {
    MOE_CHECK(std::isfinite(a.opts.factor) && a.opts.factor <= 1024, "-f must be a finite number in (1, 1024], got ",
              a.opts.factor);
    a.opts.min_bytes = parse_size("-b", a.min_bytes);
    a.opts.max_bytes = parse_size("-e", a.max_bytes);
    a.opts.algorithms.clear();
    for (const std::string& s : a.algorithms) a.opts.algorithms.push_back(parse_a2a(s, "--algos"));
    comm::Group world = comm::Group::world();
    comm::Topology topo = comm::Topology::detect(world.size(), a.ranks_per_node, a.nodes_per_group);
    comm::A2aBenchResult r = comm::run_a2a_bench(world, topo, a.opts);
    if (world.rank() == 0)
      std::printf("%s\n", a.opts.json ? comm::a2a_bench_json(r).c_str() : comm::format_a2a_table(r).c_str());
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    std::fprintf(stderr, "moetrain: error (rank %d of %d): %s\n", mpi.world_rank(), mpi.world_size(), e.what());
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) must make a write fail with an error we report, not kill us.
  std::signal(SIGXFSZ, SIG_IGN);
  kernels::ensure_blas_kernels(argv);  // may re-execute this program with OPENBLAS_CORETYPE set
  keep_host_heap();                    // buffers freed each micro-batch are reused, not refaulted
  CLI::App app{"moetrain: train DeepSeek-style Mixture-of-Experts models"};
  app.require_subcommand(0, 1);
  train::TrainOptions train_opts;
  bool quiet = false;
  mixture::MoeBenchOptions bench_opts;
  bool bench_json = false;
  int bench_threads = 1;
  add_train_command(app, train_opts, quiet);
  A2aCli a2a_cli;
  PipeCli pipe_cli;
  add_bench_command(app, bench_opts, bench_json, bench_threads, a2a_cli, pipe_cli);
  apps::PlanCli plan_cli;
  apps::add_plan_commands(app, plan_cli);
  apps::ReportCli report_cli;
  apps::add_report_command(app, report_cli);
  apps::InspectCli inspect_cli;
  apps::add_inspect_command(app, inspect_cli);
  apps::GenerateCli generate_cli;
  apps::add_generate_command(app, generate_cli);
  apps::EvalCli eval_cli;
  apps::add_eval_command(app, eval_cli);
  apps::TokenizeCli tokenize_cli;
  apps::add_tokenize_command(app, tokenize_cli);
  train::UpcycleOptions upcycle_cli;
  apps::add_upcycle_command(app, upcycle_cli);
  std::string export_ckpt, export_out;
  double export_shard_mb = 2048;
  CLI::App* ex = app.add_subcommand("export", "checkpoint -> Hugging Face folder (config.json + safetensors)");
  ex->add_option("checkpoint", export_ckpt, "a step-N checkpoint folder")->required();
  ex->add_option("out", export_out, "output folder")->required();
  ex->add_option("--shard-mb", export_shard_mb, "largest safetensors file (MB) before sharding")->capture_default_str();
  std::string export_mtp = "keep";
  ex->add_option("--mtp", export_mtp, "DeepSeek-V3's multi-token-prediction module: keep (V3's layer L) or drop")
      ->check(CLI::IsMember({"keep", "drop"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "moetrain: error: %s (see --help)\n", e.what());
    return e.get_exit_code() == 0 ? 2 : e.get_exit_code();
  } catch (const Error& e) {
    // A mode's word refused by its parser (apps/mode_option.h). Every rank of a launched job
    // parses the same flags: the first one says why, once.
    if (train::launcher_world_rank() == 0) std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  }
  try {
    if (int rc = apps::run_plan_commands(app, plan_cli, &argc, &argv); rc >= 0) return rc;
    if (int rc = apps::run_report_command(app, report_cli); rc >= 0) return rc;
    if (int rc = apps::run_inspect_command(app, inspect_cli); rc >= 0) return rc;
    if (int rc = apps::run_generate_command(app, generate_cli); rc >= 0) return rc;
    if (int rc = apps::run_eval_command(app, eval_cli); rc >= 0) return rc;
    if (int rc = apps::run_tokenize_command(app, tokenize_cli); rc >= 0) return rc;
    if (int rc = apps::run_upcycle_command(app, upcycle_cli); rc >= 0) return rc;
    if (app.got_subcommand("bench") && app.get_subcommand("bench")->got_subcommand("a2a"))
      return run_a2a_bench_cli(&argc, &argv, a2a_cli);
    if (app.got_subcommand("bench") && app.get_subcommand("bench")->got_subcommand("pipeline"))
      return run_pipeline_bench_cli(&argc, &argv, pipe_cli);
    if (app.got_subcommand("bench")) {
      MOE_CHECK(bench_threads >= 1 && bench_threads <= 1024, "--threads must be in [1, 1024], got ", bench_threads);
      MOE_CHECK(std::isfinite(bench_opts.capacity_factor) && bench_opts.capacity_factor >= 0,
                "--capacity-factor must be a finite number >= 0, got ", bench_opts.capacity_factor);
      kernels::set_blas_threads(bench_threads);
      require_device(bench_opts.device, "--device");
      auto result = mixture::run_moe_layer_bench(bench_opts);
      std::printf("%s\n", bench_json ? mixture::moe_bench_json(result).c_str()
                                     : mixture::format_moe_bench_table(result).c_str());
      return 0;
    }
    if (app.got_subcommand("export")) {
      MOE_CHECK(std::isfinite(export_shard_mb) && export_shard_mb > 0 && export_shard_mb <= 1e9,
                "--shard-mb must be a positive number of megabytes (at most 1e9), got ", export_shard_mb);
      // Started once per rank, every copy would write the same folder at the same time.
      const int ranks = train::launcher_world_size();
      if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
      MOE_CHECK(ranks == 1, "export writes one folder from one process, but this is one of ", ranks,
                " ranks started by a launcher (mpirun/srun): run `moetrain export` without it");
      train::ExportResult r = train::export_checkpoint(
          export_ckpt, export_out, static_cast<size_t>(std::max(1.0, export_shard_mb * 1024 * 1024)),
          export_mtp == "drop");
      std::printf("exported %s -> %s (%d file(s), %.1f MB)\n", export_ckpt.c_str(), export_out.c_str(),
                  r.num_files, r.bytes / 1e6);
      return 0;
    }
    if (app.get_subcommands().empty()) {
      std::printf("%s", app.help().c_str());
      return 0;
    }
    if (app.got_subcommand("train")) {
      // --global-batch: the per-data-rank --batch it implies (no MPI needed; every rank agrees).
      if (app.get_subcommand("train")->count("--global-batch") > 0) {
        const int data_ranks = train_opts.parallel.dims.ep * train_opts.parallel.dims.dp;
        const int g = train_opts.data.global_batch;
        if (app.get_subcommand("train")->count("--batch") > 0)
          throw Error(str_cat("--global-batch ", g, " and --batch ", train_opts.data.batch,
                              ": give one (--batch is per data rank, --global-batch over all ", data_ranks, ")"));
        if (g < 1 || data_ranks < 1 || g % data_ranks != 0)
          throw Error(str_cat("--global-batch ", g, " must be a positive multiple of the data ranks (ep ",
                              train_opts.parallel.dims.ep, " x dp ", train_opts.parallel.dims.dp, " = ", data_ranks, ")"));
        train_opts.data.batch = g / data_ranks;
      }
      // --init-from: the folder's config is the model; a --preset given as well is compared with it.
      if (!train_opts.model.init_from.empty() && app.get_subcommand("train")->count("--preset") == 0)
        train_opts.model.preset.clear();
      comm::MpiRuntime mpi(&argc, &argv);
      try {
        train_opts.progress = !quiet;
        // --time-budget chooses the step count; an explicit --steps caps it.
        if (train_opts.time_budget_s > 0 && app.get_subcommand("train")->count("--steps") == 0)
          train_opts.steps = train::kTimeBudgetMaxSteps;
        train::install_stop_handlers();
        train::run_training(train_opts);
      } catch (const train::SetupError& e) {
        // Every rank stopped at the same point: report once, finalise MPI, exit 1.
        if (e.report_here()) std::fprintf(stderr, "moetrain: error: %s\n", e.what());
        return 1;
      } catch (const std::exception& e) {
        if (mpi.world_size() == 1) throw;
        // Other ranks may be waiting in a collective: end the whole job, not just this rank.
        std::fprintf(stderr, "moetrain: error (rank %d of %d): %s\n", mpi.world_rank(),
                     mpi.world_size(), e.what());
        std::fflush(stderr);
        comm::MpiRuntime::abort(1);
      }
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
