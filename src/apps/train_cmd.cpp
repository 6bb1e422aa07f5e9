// `moetrain train`. See train_cmd.h.
#include "apps/train_cmd.h"

#include <cstdio>
#include <exception>
#include <string>

#include "apps/cli_checks.h"
#include "apps/mode_option.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "model/config.h"
#include "train/run_guard.h"

namespace moe::apps {

void add_train_command(CLI::App& app, TrainCli& s) {
  train::TrainOptions& o = s.opts;
  bool& quiet = s.quiet;
  CLI::App* t = add_command(app, "train", "train a model (default: the tiny preset on the built-in corpus)");
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
  t->add_option("--micro-batches", o.parallel.micro_batches, "micro-batches per step on each data rank (pipeline / gradient accumulation)")->capture_default_str();
  t->add_option("--micro-batch", o.data.micro_batch,
                "sequences per micro-batch on each data rank (Megatron's micro-batch size): sets "
                "--micro-batches to the per-data-rank batch / this");
  t->add_option("--pp.layers", o.parallel.pp_layers, "layers per pipeline stage, e.g. 5,4,4,3 (default: even)")->delimiter(',');
  add_mode_option(t, "--pp.schedule", o.parallel.schedule, "pipeline schedule: 1f1b or gpipe");
  add_mode_option(t, "--recompute", o.model.recompute, "activation checkpointing: none, moe or full");
  t->add_option("--mtp.weight", o.model.mtp_weight,
                "multi-token prediction's loss weight lambda (configs with num_nextn_predict_layers 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  t->add_option_function<float>(
      "--balance.bias-rate", [&o](const float& v) { o.balance.bias_rate = v; },
      "aux-loss-free balancing (topk_method noaux_tc): bias step gamma (default: the config's "
      "bias_update_speed, 1e-3)");
  t->add_option("--balance.migrate-every", o.balance.migrate_every,
                "expert migration (Piper): every N steps, rebalance the EP ranks' loads (0 = never)")
      ->capture_default_str();
  t->add_option("--balance.threshold", o.balance.threshold,
                "migrate a layer when its max/mean EP-rank load exceeds this (> 1)")
      ->capture_default_str();
  add_mode_option(t, "--a2a", o.parallel.a2a, "token exchange: flat, rbd (X-MoE dedup), halo (Piper 3-phase), rbd-halo (both), "
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
  add_mode_option(t, "--device", o.device.type, "cpu or cuda (one GPU per rank: local rank modulo the visible GPUs)");
  add_mode_option(t, "--comm.backend", o.device.comm_backend,
                  "auto, mpi or nccl: how GPU buffers move between ranks (auto: NCCL when every rank "
                  "has its own GPU, else staged through the host over MPI)");
  add_mode_option(t, "--precision", o.device.precision, "fp32; bf16 GEMM inputs with fp32 accumulation (cuBLAS, or oneDNN on a CPU with AVX-512 BF16); or auto: bf16 where this CPU measures its bf16 GEMM peak at least 1.3x its fp32 peak, else fp32 (and fp32 on CUDA)");
  t->add_flag("--zero1", o.parallel.zero1,
              "ZeRO-1: split the AdamW state over the data ranks (reduce-scatter, sliced update, "
              "all-gather); with one data rank a no-op");
  t->add_flag("--quiet", quiet, "no progress output");
  t->add_flag("--profile", o.profile, "time the MoE layers' steps: time_s.moe in metrics.jsonl, a summary at the end");
}

int run_train_command(CLI::App& app, TrainCli& s, int* argc, char*** argv) {
  if (!app.got_subcommand("train")) return -1;
  CLI::App* t = app.get_subcommand("train");
  train::TrainOptions& o = s.opts;
  // --global-batch: the per-data-rank --batch it implies (no MPI needed; every rank agrees).
  if (t->count("--global-batch") > 0) {
    const int data_ranks = o.parallel.dims.ep * o.parallel.dims.dp;
    const int g = o.data.global_batch;
    if (t->count("--batch") > 0)
      throw Error(str_cat("--global-batch ", g, " and --batch ", o.data.batch,
                          ": give one (--batch is per data rank, --global-batch over all ", data_ranks, ")"));
    if (g < 1 || data_ranks < 1 || g % data_ranks != 0)
      throw Error(str_cat("--global-batch ", g, " must be a positive multiple of the data ranks (ep ",
                          o.parallel.dims.ep, " x dp ", o.parallel.dims.dp, " = ", data_ranks, ")"));
    o.data.batch = g / data_ranks;
  }
  // --micro-batch: the --micro-batches it implies for the per-data-rank batch.
  if (t->count("--micro-batch") > 0) {
    const int mb = o.data.micro_batch;
    if (t->count("--micro-batches") > 0)
      throw Error(str_cat("--micro-batch ", mb, " and --micro-batches ", o.parallel.micro_batches,
                          ": give one (--micro-batch is sequences per micro-batch, --micro-batches their count)"));
    if (mb < 1 || o.data.batch % mb != 0)
      throw Error(str_cat("--micro-batch ", mb, " must be a positive divisor of the per-data-rank batch ",
                          o.data.batch, " (--batch, or --global-batch / (ep x dp))"));
    o.parallel.micro_batches = o.data.batch / mb;
  }
  // --init-from: the folder's config is the model; a --preset given as well is compared with it.
  if (!o.model.init_from.empty() && t->count("--preset") == 0) o.model.preset.clear();
  comm::MpiRuntime mpi(argc, argv);
  try {
    o.progress = !s.quiet;
    // --time-budget chooses the step count; an explicit --steps caps it.
    if (o.time_budget_s > 0 && t->count("--steps") == 0) o.steps = train::kTimeBudgetMaxSteps;
    train::install_stop_handlers();
    train::run_training(o);
  } catch (const train::SetupError& e) {
    // Every rank stopped at the same point: report once, finalise MPI, exit 1.
    if (e.report_here()) std::fprintf(stderr, "moetrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) throw;
    // Other ranks may be waiting in a collective: end the whole job, not just this rank.
    std::fprintf(stderr, "moetrain: error (rank %d of %d): %s\n", mpi.world_rank(), mpi.world_size(), e.what());
    std::fflush(stderr);
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

}  // namespace moe::apps
