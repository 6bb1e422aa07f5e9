// The training loop: data -> forward -> backward -> gradient sync -> clip -> AdamW, with a live
// progress line, one JSON line of metrics per step, periodic validation, and at the end the
// weights as safetensors (Hugging Face DeepSeek names) plus config.json in the output folder.
// One process, or many under mpirun: every EP × DP rank reads its own share of the global batch,
// experts split over EP, stages over PP, heads / dense FFN / tokens over TP (model.h:
// TensorParallel). Needs MPI initialised (comm::MpiRuntime). The run's parts: train/run_setup.h
// (checks and parsed options), the Trainer in trainer.cpp (the loop and one step) and the
// components it calls (listed at the top of trainer.cpp), train/step_record.h (the metrics line),
// train/checkpointer.h (checkpoints and the weights file); options.cpp validates these options.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/modes.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/parallel_dims.h"
#include "train/optimizer.h"

namespace moe::train {

// The options of one run, one group per concern: adding a parallelism, a balancing policy or a
// device changes one group (and its CLI flags, src/apps/moetrain.cpp). Modes are core/modes.h's
// enums, parsed once by the CLI; a mode that may be "auto" is a std::optional (std::nullopt =
// auto), which the run's setup resolves (RunSetup, train/run_setup.h).
struct ModelOptions {
  std::string preset = "tiny";
  std::string config_path;  // a Hugging Face config.json; overrides preset when set
  // --init-from: a Hugging Face model folder whose config and weights the run starts from, with a
  // fresh optimizer and schedule (train/init_from.h); preset ("" unless given) and config_path
  // must then agree with its config.
  std::string init_from;
  int vocab_size = 0;                      // --vocab-size: overrides the preset's / config's (0 = keep it)
  model::MoeOptions moe;                   // --capacity-factor, --padded
  Recompute recompute = Recompute::kNone;  // activation checkpointing: none | moe | full
  float mtp_weight = 0.3f;                 // --mtp.weight: multi-token prediction's loss weight (DeepSeek-V3)
};

struct DataOptions {
  std::string path;      // text file, bytes are tokens; default: the built-in KJV corpus;
                         // or an indexed dataset PREFIX[.idx|.bin] (io/corpus.h)
  int batch = 16;        // sequences per step per data rank (global = batch · ep · dp; the
                         // TP ranks of a data rank share it)
  int global_batch = 0;  // --global-batch (CLI only): sets batch = global_batch / (ep · dp)
  int micro_batch = 0;   // --micro-batch (CLI only): sets micro_batches = batch / micro_batch
  int seq_len = 128;
  uint64_t seed = 1234;  // weights and data order
  int eval_every = 100;  // validation every N steps (and at the end); 0 = only at the end
  int eval_batches = 8;
};

struct ParallelOptions {
  parallel::ParallelDims dims;          // --pp --dp --ep --tp
  std::optional<A2a> a2a = A2a::kFlat;  // token exchange: flat | rbd | halo | rbd-halo | auto (nullopt)
  std::string a2a_cluster;              // --cluster: the profile --a2a auto prices the exchanges with
  int topo_ranks_per_node = 0;          // force the topology (0 = from the launcher)
  int topo_nodes_per_group = 0;
  int micro_batches = 1;                // M: per-rank batch split into M micro-batches (gradient accumulation)
  std::vector<int> pp_layers;           // explicit layers per stage (--pp.layers); empty = even split
  Schedule schedule = Schedule::k1F1B;  // pipeline schedule: 1f1b | gpipe
  bool zero1 = false;                   // --zero1: AdamW state split over the ranks sharing each gradient
  bool comm_overlap = false;            // --comm.overlap: shared experts beside the exchange (moe_layer.h)
};

struct BalanceOptions {
  // --balance.bias-rate: gamma of aux-loss-free balancing (topk_method noaux_tc); unset = the
  // config's bias_update_speed (default 1e-3).
  std::optional<float> bias_rate;
  // Expert migration (train/migration.h): every N steps (0 = never), the layers whose max/mean
  // EP-rank load exceeds the threshold (> 1) move experts between the ranks of their EP group.
  int migrate_every = 0;
  double threshold = 1.1;
};

struct CheckpointOptions {
  // Checkpoints (train/checkpoint.h): folder (default <out>/checkpoints), every N steps (0: only
  // at the end and on SIGTERM/SIGINT), how many to keep; resume from "latest" or a folder.
  std::string dir;
  int every = 0;
  int keep = 3;
  std::string resume;
};

struct FaultOptions {
  int max_bad_steps = 5;              // non-finite steps in a row before the run stops with an error
  std::vector<int> nan_steps;         // test hook: poison the gradients of these (1-based) steps
  std::vector<int> inf_weight_steps;  // test hook: an Inf weight after these steps' updates
  // A rank waiting longer than this in one MPI operation ends the job naming itself, the
  // operation and the group (comm::CommTimeout). 0 = wait forever.
  double comm_timeout_s = 600;
};

struct DeviceOptions {
  // Where the model runs (--device cpu|cuda; a rank uses the GPU of its local rank modulo the
  // visible GPUs) and the GEMM input precision (--precision fp32|bf16|auto; auto = std::nullopt).
  Device type = Device::kCpu;
  std::optional<Precision> precision = Precision::kFp32;
  // How device buffers move between ranks (--comm.backend auto|mpi|nccl): auto (std::nullopt) =
  // NCCL when every rank has its own GPU and libnccl.so.2 loads, else staged through the host over MPI.
  std::optional<CommBackend> comm_backend;
  int threads = 1;  // BLAS threads
  // MFU's denominator, GFLOP/s per rank at the run's precision (--peak-gflops: e.g. a calibrated
  // profile's peak_flops / 1e9). 0: measured at start (CPU: best of several short sgemm runs).
  double peak_gflops = 0;
};

struct TrainOptions {
  std::string out_dir = "out";
  int steps = 1200;  // optimizer steps; with a time budget, the most it may choose
  // --time-budget: seconds of training steps (forward, backward, exchange, optimizer; not the
  // held-out evaluations, checkpoints or setup). The step count, and with it the cosine
  // schedule, is chosen once from the median time of the warm-up steps, whose learning rates do
  // not depend on it, so `--steps N` with the chosen N repeats the run exactly. 0 = off.
  double time_budget_s = 0;
  bool progress = true;  // live progress line on stderr
  bool profile = false;  // --profile: MoE step times in metrics.jsonl, a summary at the end
  ModelOptions model;
  DataOptions data;
  OptimConfig optim;  // total_steps is set from steps
  ParallelOptions parallel;
  BalanceOptions balance;
  CheckpointOptions checkpoint;
  FaultOptions faults;
  DeviceOptions device;
};

// --time-budget without --steps: the most steps it may choose.
constexpr int kTimeBudgetMaxSteps = 100'000'000;
// --time-budget needs this many warm-up steps: the first two are not timed (first-touch page
// faults, JIT kernels), and the median of the rest sets the step count.
constexpr int kTimeBudgetMinWarmup = 4;

// A duration as the CLI takes it: a number of seconds, or a number with the unit s, m (or min)
// or h ("300", "90s", "5m", "1.5h"); in (0, 1e7] seconds. Throws moe::Error naming `flag`.
double parse_duration_s(const std::string& text, const char* flag);

// Every option's value on its own (ranges, finiteness, consistency between flags): throws
// moe::Error with one line naming the flag and the value. run_training calls it first.
void validate_options(const TrainOptions& opts);

// Per-stage figures of one step, as reported in metrics.jsonl ("stages": [...]).
struct StageStats {
  double compute_s = 0, bubble_s = 0, a2a_s = 0, step_s = 0;
  double activation_peak_bytes = 0, total_peak_bytes = 0;
  int max_in_flight = 0;
};

struct TrainResult {
  std::vector<double> losses;                      // total loss per step (global batch)
  std::vector<std::pair<int, double>> val_losses;  // (step, validation cross-entropy)
  double tokens_per_s = 0.0;
  double mfu = 0.0;
  double peak_gflops = 0.0;
  double seconds = 0.0;
  std::vector<StageStats> last_stages;  // per-stage figures of the last step
  int bad_steps = 0;                    // non-finite steps skipped
};

// SIGTERM / SIGINT handlers that make run_training finish its step, checkpoint and return (the
// CLI installs them; a scheduler's time limit then costs no work). A signal during setup stops
// the run after its first step. A second signal ends the process at once (exit status 128 + the
// signal), and a rank blocked in MPI after a stop request ends the job within
// min(--comm.timeout, 30 s) (comm::CommTimeout).
void install_stop_handlers();


// Bad input found while setting up a multi-rank run: every rank throws it together (after an
// agreement step), so the job ends cleanly instead of hanging or aborting; only the lowest rank
// that found a problem reports it (report_here), so the user sees one line.
class SetupError : public Error {
 public:
  SetupError(const std::string& what, bool report_here) : Error(what), report_here_(report_here) {}
  bool report_here() const { return report_here_; }

 private:
  bool report_here_;
};

// Files a run leaves in --out: model.safetensors and config.json (at the end), metrics.jsonl (one
// line per step, from the moment every setup check has passed; a resumed run appends, a fresh
// run keeps the earlier run's file as metrics.jsonl.prev), .moetrain.lock (held for the run, in
// --out and in the checkpoint folder: a second run on either folder is refused naming the first).
//
// Default location of the built-in corpus: ./data/kjv.txt, else <source dir>/data/kjv.txt.
std::string default_corpus_path();

TrainResult run_training(const TrainOptions& opts);

}  // namespace moe::train
