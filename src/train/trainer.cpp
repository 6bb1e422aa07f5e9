#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "comm/exchange.h"
#include "comm/mpi_runtime.h"
#include "comm/nccl.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/corpus.h"
#include "io/dataset.h"
#include "io/indexed_dataset.h"
#include "io/safetensors.h"
#include "kernels/adamw.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/peak_rate.h"
#include "model/weights_io.h"
#include "moe/bench_moe_layer.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero1.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/migration.h"
#include "train/run_guard.h"
#include "train/run_memory.h"
#include "train/run_setup.h"
#include "train/score_bias.h"
#include "train/step_record.h"
#include "train/value_ranges.h"

namespace moe::train {
namespace fs = std::filesystem;
using nlohmann::json;

std::string default_corpus_path() {
  if (fs::exists("data/kjv.txt")) return "data/kjv.txt";
  return std::string(MOETRAIN_SOURCE_DIR) + "/data/kjv.txt";
}

volatile std::sig_atomic_t g_stop_requested = 0;

// First signal: finish the step, checkpoint, return. Second: the user means it, end now (only
// async-signal-safe calls here).
void request_stop(int sig) {
  if (g_stop_requested) {
    static const char msg[] = "moetrain: second stop signal: exiting now, without a checkpoint\n";
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    _exit(128 + sig);
  }
  g_stop_requested = 1;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  io::set_stop_flag(&g_stop_requested);  // the dataset checks of setup stop too (issue 42, class 6)
}

double parse_duration_s(const std::string& text, const char* flag) {
  // A number (no sign, no exponent, no inf/nan), then an optional unit.
  size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  const std::string number = text.substr(0, end), unit = text.substr(end);
  const bool one_point = number.find('.') == number.rfind('.');
  const bool digit = number.find_first_of("0123456789") != std::string::npos;
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  MOE_CHECK(digit && one_point && scale > 0, flag, " must be a duration: seconds, or a number with the unit "
            "s, m or h (300, 90s, 5m, 1.5h), got '", text, "'");
  const double seconds = std::strtod(number.c_str(), nullptr) * scale;
  MOE_CHECK(seconds > 0 && seconds <= 1e7, flag, " must be more than 0 and at most 1e7 seconds, got '", text, "'");
  return seconds;
}

void validate_options(const TrainOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  // Every number's own range, from the one table (train/value_ranges.h); then what ties flags.
  const std::pair<const char*, double> values[] = {
      {"--steps", o.steps}, {"--batch", o.data.batch}, {"--seq-len", o.data.seq_len},
      {"--threads", o.device.threads}, {"--peak-gflops", o.device.peak_gflops},
      {"--vocab-size", o.model.vocab_size}, {"--eval-batches", o.data.eval_batches},
      {"--eval-every", o.data.eval_every}, {"--lr", o.optim.lr}, {"--min-lr", o.optim.min_lr},
      {"--warmup", o.optim.warmup_steps}, {"--weight-decay", o.optim.weight_decay},
      {"--grad-clip", o.optim.grad_clip}, {"--capacity-factor", o.model.moe.capacity_factor},
      {"--micro-batches", o.parallel.micro_batches}, {"--checkpoint.keep", o.checkpoint.keep},
      {"--checkpoint.every", o.checkpoint.every}, {"--max-bad-steps", o.faults.max_bad_steps},
      {"--balance.migrate-every", o.balance.migrate_every}, {"--balance.threshold", o.balance.threshold},
      {"--comm.timeout", o.faults.comm_timeout_s}, {"--topo.ranks-per-node", o.parallel.topo_ranks_per_node},
      {"--topo.nodes-per-group", o.parallel.topo_nodes_per_group}, {"--pp", o.parallel.dims.pp},
      {"--dp", o.parallel.dims.dp}, {"--ep", o.parallel.dims.ep}, {"--tp", o.parallel.dims.tp}};
  for (const auto& [name, v] : values) check_value(name, v);
  for (int s : o.faults.nan_steps) check_value("--fault.nan-steps", s);
  for (int s : o.faults.inf_weight_steps) check_value("--fault.inf-weight-steps", s);
  for (int n : o.parallel.pp_layers) check_value("--pp.layers", n);
  if (o.balance.bias_rate) check_value("--balance.bias-rate", *o.balance.bias_rate);
  MOE_CHECK(o.time_budget_s == 0 || (finite(o.time_budget_s) && o.time_budget_s > 0 && o.time_budget_s <= 1e7),
            "--time-budget must be more than 0 and at most 1e7 seconds, got ", o.time_budget_s);
  MOE_CHECK(o.time_budget_s == 0 || o.optim.warmup_steps >= kTimeBudgetMinWarmup, "--time-budget chooses the "
            "step count from the warm-up steps' time (their learning rates do not depend on it), so it needs "
            "--warmup >= ", kTimeBudgetMinWarmup, ", got ", o.optim.warmup_steps);
  const OptimConfig& c = o.optim;
  MOE_CHECK(c.min_lr <= c.lr, "--min-lr ", c.min_lr, " is above --lr ", c.lr,
            " (the cosine schedule decays from --lr to --min-lr)");
  // Decoupled decay multiplies each weight by 1 - lr·wd: at lr·wd >= 1 it zeroes or flips them.
  MOE_CHECK(static_cast<double>(c.lr) * c.weight_decay < 1, "--weight-decay ", c.weight_decay, " with --lr ",
            c.lr, ": lr * weight decay = ", static_cast<double>(c.lr) * c.weight_decay,
            " >= 1 would zero or flip the weights every step");
  MOE_CHECK(o.data.batch % o.parallel.micro_batches == 0, "--batch ", o.data.batch, " is not divisible by --micro-batches ",
            o.parallel.micro_batches);
  parse_device(o.device.name, "--device");
  MOE_CHECK(o.device.precision == "fp32" || o.device.precision == "bf16" || o.device.precision == "auto",
            "--precision: expected fp32, bf16 or auto, got '", o.device.precision, "'");
  MOE_CHECK(o.device.precision != "bf16" || o.device.name == "cuda" || kernels::bf16_cpu_available(),
            "--precision bf16 --device cpu: ", kernels::bf16_cpu_unavailable_reason());
  MOE_CHECK(o.balance.migrate_every == 0 || !o.parallel.zero1, "--balance.migrate-every with --zero1: moving experts with a "
            "sharded AdamW state is not supported; use one of them");
  MOE_CHECK(o.balance.migrate_every == 0 || !o.model.moe.padded, "--balance.migrate-every with --padded: migration needs "
            "the padding-free layout");
  MOE_CHECK(!o.out_dir.empty(), "--out must not be empty");
}

namespace {

// --profile: installs the MoE step recorder (moe/bench_moe_layer.h) for one training step.
class MoeStepRecorder {
 public:
  explicit MoeStepRecorder(mixture::MoeStepTimes* times)
      : installed_(times != nullptr), old_(times ? mixture::set_moe_step_times(times) : nullptr) {}
  ~MoeStepRecorder() {
    if (installed_) mixture::set_moe_step_times(old_);
  }
  MoeStepRecorder(const MoeStepRecorder&) = delete;
  MoeStepRecorder& operator=(const MoeStepRecorder&) = delete;

 private:
  bool installed_;
  mixture::MoeStepTimes* old_;
};

// --profile's summary on stderr (rank 0's view): the steps' seconds split into the MoE layers'
// steps, the rest of forward + backward (attention, dense GEMMs, norms, embedding, loss), the
// gradient sync and the optimizer.
void print_profile(const mixture::MoeStepTimes& moe, double compute, double opt, double sync,
                   double steps, double a2a) {
  const double moe_s = moe.forward() + moe.backward();
  auto line = [&](const char* name, double s) {
    std::fprintf(stderr, "  %-22s %9.3f s %6.1f%%\n", name, s, steps > 0 ? 100.0 * s / steps : 0.0);
  };
  std::fprintf(stderr, "profile (rank 0, all steps): %.3f s\n", steps);
  line("MoE layers", moe_s);
  for (const auto& [name, ms] : mixture::moe_step_times_ms(moe)) line(("  " + name).c_str(), ms * 1e-3);
  line("  expert GEMMs", moe.expert_parts.gemm());
  // The exchange (inside dispatch, combine and their adjoints): all of its wall time, and what of
  // it no computation covered (--comm.overlap hides some behind the shared experts).
  line("  all-to-all", a2a);
  line("  all-to-all exposed", a2a - moe.a2a_hidden);
  line("rest of fwd+bwd", compute - moe_s);
  line("grad sync", sync);
  line("optimizer", opt);
  line("other (data, metrics)", steps - compute - sync - opt);
}

std::string format_duration(double s) {
  int t = static_cast<int>(std::lround(s));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  return buf;
}

// A budget or a time measured against it: under a minute in seconds ("0.5s", "42.3s"), else as
// format_duration.
std::string format_budget(double s) {
  if (s >= 59.95) return format_duration(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3gs", s);
  return buf;
}

// Mean over the tokens group (every rank of a stage holds as many tokens) of one value per rank.
double data_mean(const parallel::Grid& g, double v) {
  if (g.tokens.size() > 1) g.tokens.allreduce_sum(&v, 1);
  return v / g.tokens.size();
}

// Validation cross-entropy of the fixed held-out batches: each data rank evaluates its share,
// passing activations through the pipeline stages (forward only, blocking p2p).
double validation_loss(model::Model& m, const std::vector<int32_t>& val, int B_local, int T,
                       int n, const parallel::Grid& g) {
  const size_t per_global = static_cast<size_t>(B_local) * g.data_size() * (T + 1);
  const size_t offset = static_cast<size_t>(g.data_rank()) * B_local * (T + 1);
  const model::StageSpec& st = m.stage();
  const size_t act = static_cast<size_t>(B_local) * T / m.tp_size() * m.config().hidden_size;
  // Where the model reads its input and writes its output: the active device (a GPU's buffers are
  // staged through the host by the blocking send/recv).
  Buffer<float> x_in(st.embedding ? 0 : act, nullptr, kernels::active_device());
  Buffer<float> x_out(st.head ? 0 : act, nullptr, kernels::active_device());
  auto mb = m.new_micro_batch();
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    const int32_t* tok = val.data() + i * per_global + offset;
    if (!st.embedding) g.pp.recv(x_in.data(), static_cast<int64_t>(act), g.pp.rank() - 1, 1000 + i);
    model::LossParts lp = m.forward(*mb, tok, st.embedding ? nullptr : x_in.data(),
                                    st.head ? nullptr : x_out.data(), B_local, T, /*keep=*/false);
    if (!st.head) g.pp.send(x_out.data(), static_cast<int64_t>(act), g.pp.rank() + 1, 1000 + i);
    sum += lp.ce;
  }
  double v = sum / n;  // non-zero on the last stage only
  if (g.pp.size() > 1) g.pp.allreduce_sum(&v, 1);
  return data_mean(g, v);
}

// x[0] = value on x's device (the fault-injection hooks).
void set_first(float* x, float value) {
  device_copy(kernels::active_device(), x, Device::kCpu, &value, sizeof(float));
}

// Per-stage figures of a step: the worst rank of each stage (collective over the world).
// a2a_by_rank: each world rank's own exchange seconds (a slow node shows in its ranks').
std::vector<StageStats> gather_stage_stats(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                           double a2a_seconds, model::Model& model,
                                           std::vector<double>& a2a_by_rank) {
  const int kStat = 7;
  std::vector<double> mine = {pt.compute_s, pt.wait_s, a2a_seconds, pt.total_s,
                              static_cast<double>(model.activation_memory().peak()),
                              static_cast<double>(model.total_memory().peak()),
                              static_cast<double>(pt.max_in_flight)};
  std::vector<double> everyone(static_cast<size_t>(kStat) * grid.world.size());
  if (grid.world.size() > 1)
    grid.world.allgather(mine.data(), everyone.data(), kStat);
  else
    everyone = mine;
  std::vector<StageStats> stages(grid.dims.pp);
  a2a_by_rank.assign(grid.world.size(), 0.0);
  for (int r = 0; r < grid.world.size(); ++r) {
    StageStats& st = stages[parallel::coords_of(grid.dims, r).pp];
    const double* v = everyone.data() + static_cast<size_t>(r) * kStat;
    a2a_by_rank[r] = v[2];
    st.compute_s = std::max(st.compute_s, v[0]);
    st.bubble_s = std::max(st.bubble_s, v[1]);
    st.a2a_s = std::max(st.a2a_s, v[2]);
    st.step_s = std::max(st.step_s, v[3]);
    st.activation_peak_bytes = std::max(st.activation_peak_bytes, v[4]);
    st.total_peak_bytes = std::max(st.total_peak_bytes, v[5]);
    st.max_in_flight = std::max(st.max_in_flight, static_cast<int>(v[6]));
  }
  return stages;
}

// The step's tokens per expert of every MoE layer of the model: this stage's layers (`mine`,
// summed over micro-batches) summed over the data ranks, then placed among all MoE layers (the first
// `offset` entries belong to earlier stages) and summed over the pipeline. The same on every rank.
std::vector<int64_t> global_expert_loads(const parallel::Grid& grid, std::vector<int64_t> mine, size_t all,
                                         size_t offset) {
  if (grid.tokens.size() > 1 && !mine.empty())
    grid.tokens.allreduce_sum(mine.data(), static_cast<int64_t>(mine.size()));
  if (grid.pp.size() <= 1 || all == 0) return mine;
  std::vector<int64_t> out(all, 0);
  std::copy(mine.begin(), mine.end(), out.begin() + offset);
  grid.pp.allreduce_sum(out.data(), static_cast<int64_t>(out.size()));
  return out;
}

// What a step did for expert balance: each MoE layer's tokens per EP rank and their max/mean under
// the placement of this step, and the migration after it ({} when none).
struct StepBalance {
  std::vector<std::vector<double>> rank_loads;
  std::vector<double> imbalance;
  std::optional<MigrationRecord> migration;
};

// Expert parallelism, after the update: the step's global loads (every MoE layer's, the same on
// every rank) give each layer's EP-rank loads; every --balance.migrate-every steps, the layers above
// the threshold migrate (train/migration.h), the same on every rank. Not after the last step
// (nothing would run on the new map) nor after a skipped one. Collective over the world.
StepBalance balance_step(model::Model& model, const TrainOptions& opts, const parallel::Grid& grid,
                         const std::vector<int>& moe_layer_ids, const std::vector<int64_t>& flat_loads, int step,
                         int total_steps, bool skipped, const std::vector<float*>& moving, bool report, bool tty) {
  StepBalance out;
  const int E = model.config().n_routed_experts;
  if (grid.dims.ep <= 1 || flat_loads.size() != moe_layer_ids.size() * E) return out;
  std::vector<std::vector<double>> loads(moe_layer_ids.size());
  for (size_t i = 0; i < moe_layer_ids.size(); ++i) {
    loads[i].assign(flat_loads.begin() + i * E, flat_loads.begin() + (i + 1) * E);
    const balance::LayerPlacement& where = model.placement().layers[moe_layer_ids[i]];
    out.rank_loads.push_back(balance::rank_loads(where, loads[i]));
    out.imbalance.push_back(balance::imbalance(where, loads[i]));
  }
  if (opts.balance.migrate_every == 0 || skipped || (step + 1) % opts.balance.migrate_every != 0 || step + 1 >= total_steps)
    return out;
  const double t0 = now_seconds();
  std::vector<LayerMigration> changed;
  const balance::Placement next = plan_migration(model.placement(), moe_layer_ids, loads, opts.balance.threshold, &changed);
  if (changed.empty()) return out;
  double moved = move_experts(model, next, grid.ep, moving);
  double seconds = now_seconds() - t0;
  grid.world.allreduce_sum(&moved, 1);
  grid.world.allreduce_max(&seconds, 1);
  MigrationRecord m{{}, moved, seconds};
  for (const LayerMigration& lm : changed) m.layers.push_back({lm.layer, lm.swaps, lm.imbalance_before, lm.imbalance_after});
  out.migration = std::move(m);
  if (report)
    for (const LayerMigration& lm : changed)
      std::fprintf(stderr, "%sstep %d: layer %d migrated %d expert swap(s), rank imbalance %.3f -> %.3f "
                   "(%s moved in %.1f ms, all layers)\n", tty ? "\n" : "", step + 1, lm.layer, lm.swaps,
                   lm.imbalance_before, lm.imbalance_after, format_bytes(moved).c_str(), 1e3 * seconds);
  return out;
}

// One optimizer step's figures: what the metrics line, the progress line and the run's totals need.
struct StepOutcome {
  model::LossParts loss;              // of the global batch
  double grad_norm = NAN;
  bool skipped = false;               // a non-finite loss or gradient: no update
  double seconds = 0, sync_s = 0, optimizer_s = 0;
  parallel::PipelineTimes pipe;
  mixture::MoeStepTimes moe_times;    // --profile
  std::vector<int64_t> loads;         // tokens per expert of every MoE layer (global)
  std::vector<int64_t> bytes;         // exchange bytes by link class, summed over the world
  std::vector<double> dispatch_bytes; // per world rank (model.h: moe_dispatch_bytes)
  StepBalance balance;
  std::vector<StageStats> stages;
  double a2a_s = 0, bubble = 0;       // the worst stage's
  std::vector<double> a2a_by_rank;    // each world rank's exchange seconds
};

// The run once its setup passed: the grid, the device, the model and its optimizer, the data and
// the checkpointer. run() is the loop; step() does one optimizer step, evaluate() the held-out
// loss, log() the metrics and progress lines, the Checkpointer the checkpoints and weights.
class Trainer {
 public:
  Trainer(const TrainOptions& opts, RunSetup& setup);
  TrainResult run();

 private:
  void choose_comm_backend(int gpu);
  void print_header() const;
  StepOutcome step(int step);
  // The weights, AdamW state and data cursor after steps_done steps as a checkpoint.
  void save_checkpoint_at(int steps_done);
  // The training data could not be read (a .bin truncated under the run): every rank stops here,
  // after a checkpoint of the state the last step left, and throws SetupError (exit 1).
  [[noreturn]] void stop_on_data_error(int step, const std::string& what);
  double evaluate() {
    return validation_loss(*model_, val_, B_, T_, opts_.data.eval_batches, grid_);
  }
  void log(int step, const StepOutcome& s, double val_loss);
  void choose_steps(int step, double step_seconds);  // --time-budget, once, after the warm-up
  bool state_finite() const;  // collective: weights and AdamW moments finite on every rank
  void finish(bool stopped_early);

  const TrainOptions& opts_;
  RunSetup& setup_;
  const model::ModelConfig& cfg_;
  const bool root_;
  const bool tty_;
  parallel::Grid grid_;
  const int D_, M_, B_, T_, B_global_, Bm_;
  const std::vector<int> layers_per_stage_;
  const model::StageSpec stage_;
  const std::vector<int32_t> val_;
  comm::CommBackend backend_ = comm::CommBackend::kMpi;
  std::string backend_why_ = "one rank";
  std::string peak_precision_;
  std::string peak_source_;  // where res_.peak_gflops came from: "measured" or "--peak-gflops"
  TrainResult res_;
  struct CpuAgain {  // later work in this process (tests run several trainings) starts on the CPU
    ~CpuAgain() {
      kernels::set_gemm_bf16(false);
      kernels::set_active_device(Device::kCpu);
    }
  } cpu_again_;
  comm::TrafficStats traffic_;
  std::unique_ptr<comm::TokenExchange> exchange_;
  mixture::ExpertParallel ep_ctx_;
  model::TensorParallel tp_ctx_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<ScoreBias> score_bias_;
  std::unique_ptr<parallel::ZeroShard> shard_;
  std::unique_ptr<AdamW> opt_;
  std::vector<double> optimizer_bytes_;  // AdamW state bytes of every world rank
  std::unique_ptr<MemTracker> pipe_mem_;
  Rng data_rng_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::vector<int32_t> tokens_;  // the global batch
  std::vector<model::Model::MicroBatchPtr> mbs_;
  std::vector<int> moe_layer_ids_;  // every MoE layer of the model (metrics, balance)
  int moe_before_stage_ = 0;        // MoE layers of earlier stages
  double bytes_per_token_ = 1.0;
  bool tokenized_ = false;
  double flops_per_step_ = 0;
  int total_steps_ = 0;         // --steps, or what --time-budget chose (then also in the optimizer)
  bool budget_pending_ = false;  // --time-budget: the step count is not chosen yet
  std::vector<double> warmup_times_;  // --time-budget: the timed warm-up steps of this process
  double train_s_ = 0;           // seconds inside step() in this process: --time-budget's clock
  std::optional<TimeBudgetRecord> budget_record_;  // the choice, until the metrics line of its step carries it
  int step0_ = 0, bad_steps_ = 0, bad_in_a_row_ = 0, good_steps_ = 0, steps_run_ = 0, bad_steps_at_start_ = 0;
  double t_start_ = 0, ema_tps_ = 0;
  mixture::MoeStepTimes profile_moe_;  // --profile: totals over the run
  double profile_compute_ = 0, profile_opt_ = 0, profile_sync_ = 0, profile_steps_ = 0, profile_a2a_ = 0;
};

Trainer::Trainer(const TrainOptions& opts, RunSetup& setup)
    : opts_(opts),
      setup_(setup),
      cfg_(setup.cfg),
      root_(setup.root),
      tty_(isatty(STDERR_FILENO)),
      grid_(parallel::make_grid(opts.parallel.dims, setup.cfg, opts.parallel.topo_ranks_per_node,
                                opts.parallel.topo_nodes_per_group)),
      D_(grid_.data_size()),
      M_(opts.parallel.micro_batches),
      B_(opts.data.batch),
      T_(opts.data.seq_len),
      B_global_(B_ * D_),
      Bm_(B_ / M_),
      layers_per_stage_(parallel::split_layers(setup.cfg, opts.parallel.dims.pp, opts.parallel.pp_layers)),
      stage_(parallel::stage_spec(layers_per_stage_, grid_.me.pp)),
      val_(setup.corpus->val_batches(B_global_, T_, opts.data.eval_batches)),
      data_rng_(derive_rng(opts.data.seed, /*stream=*/1)) {
  kernels::set_blas_threads(opts.device.threads);
  const int gpu = select_device(setup.device, grid_.topo.local_rank(grid_.world.rank()));
  kernels::set_active_device(setup.device);  // every buffer and kernel of the model from here on
  choose_comm_backend(gpu);
  kernels::set_gemm_bf16(setup.bf16);
  // The MFU denominator: the same run's dense GEMM rate on the device in the run's precision
  // (on the CPU the best of several sgemm runs, kernels/peak_rate.h: the fp32 peak).
  peak_precision_ = setup.precision;
  peak_source_ = opts.device.peak_gflops > 0 ? "--peak-gflops" : "measured";
  if (opts.device.peak_gflops > 0)  // the user's figure (a calibrated profile): no noise at all
    res_.peak_gflops = opts.device.peak_gflops;
  else
#ifdef MOETRAIN_HAVE_CUDA
  if (setup.device == Device::kCuda)
    res_.peak_gflops = kernels::cuda::measure_gemm_gflops(4096, 3, setup.bf16);
  else
#endif
  if (setup.auto_fp32_peak > 0)  // --precision auto measured both already
    res_.peak_gflops = setup.bf16 ? setup.auto_bf16_peak : setup.auto_fp32_peak;
  else
    res_.peak_gflops = kernels::measure_peak_gflops(peak_precision_);

  exchange_ = std::make_unique<comm::TokenExchange>(grid_.ep, grid_.topo, setup.a2a, &traffic_);
  ep_ctx_.exchange = grid_.dims.ep > 1 ? exchange_.get() : nullptr;
  ep_ctx_.rank = grid_.me.ep;
  ep_ctx_.size = grid_.dims.ep;
  ep_ctx_.reduce_aux_stats = [this](std::vector<double>& v) {
    grid_.tokens.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  };
  // Experts that may move are summed in logical order (train/migration.h): the math stays the same.
  ep_ctx_.placement_independent_sum = opts.balance.migrate_every > 0;
  ep_ctx_.overlap_shared = opts.parallel.comm_overlap;
  tp_ctx_ = {&grid_.tp, grid_.me.tp, grid_.dims.tp};
  model_ = std::make_unique<model::Model>(cfg_, opts.model.moe, D_ > 1 || grid_.dims.tp > 1 ? &ep_ctx_ : nullptr,
                                          stage_, setup.recompute, &tp_ctx_);
  model::Model& model = *model_;
  // noaux_tc: every MoE layer's selection bias, the same on every rank (train/score_bias.h).
  score_bias_ = std::make_unique<ScoreBias>(cfg_, opts.balance.bias_rate);
  // The exchange's staging rows (send/receive buffers, RBD pools, HALO rails) are workspace of
  // this rank like backward's temporaries: charged, so the measured peak includes them.
  exchange_->set_staging_tracker(&model.work_memory());
  model.init_weights(opts.data.seed);
  total_steps_ = opts.steps;
  budget_pending_ = opts.time_budget_s > 0;
  OptimConfig oc = opts.optim;
  oc.total_steps = total_steps_;
  // --zero1: this rank keeps and updates only its slice of the AdamW state (parallel/zero1.h).
  shard_ = std::make_unique<parallel::ZeroShard>(opts.parallel.zero1
                                                     ? parallel::ZeroShard::split(model.layout(), grid_)
                                                     : parallel::ZeroShard::whole(model.layout()));
  opt_ = std::make_unique<AdamW>(model.layout(), oc, shard_->ranges(), &model.total_memory());
  opt_->set_norm_reducer([this](double replicated, double experts, double split) {
    const parallel::Grid& grid = grid_;
    if (shard_->sharded()) {
      // Each rank's slice of every kind: the data group (EP × DP) completes them.
      double parts[3] = {replicated, experts, split};
      if (grid.data.size() > 1) grid.data.allreduce_sum(parts, 3);
      replicated = parts[0];
      experts = parts[1];
      split = parts[2];
    } else if (grid.ep.size() > 1) {
      grid.ep.allreduce_sum(&experts, 1);
    }
    // The TP ranks hold the same replicated tensors and experts, and each its own slices.
    if (grid.tp.size() > 1) grid.tp.allreduce_sum(&split, 1);
    double sq = replicated + experts + split;
    if (grid.pp.size() > 1) grid.pp.allreduce_sum(&sq, 1);
    return sq;
  });
  optimizer_bytes_.assign(grid_.world.size(), 0.0);
  {
    const double mine = static_cast<double>((opt_->m().size() + opt_->v().size()) * sizeof(float));
    grid_.world.allgather(&mine, optimizer_bytes_.data(), 1);
  }
  pipe_mem_ = std::make_unique<MemTracker>(&model.total_memory());
  json parallel_json = {{"pp", grid_.dims.pp}, {"dp", grid_.dims.dp}, {"ep", grid_.dims.ep},
                        {"tp", grid_.dims.tp}, {"layers_per_stage", layers_per_stage_},
                        {"micro_batches", M_}, {"a2a", comm::a2a_algorithm_name(setup.a2a)}, {"batch_per_rank", B_}};
  checkpointer_ = std::make_unique<Checkpointer>(grid_, cfg_, setup.ckpt_dir, opts.checkpoint.keep,
                                                 std::move(parallel_json));
  if (!setup.resume_path.empty()) {
    const CheckpointMeta meta = checkpointer_->resume(setup.resume_path, model, *opt_, *shard_);
    // A moved placement keeps summing in logical order, as the run that moved it did.
    if (!model.placement().is_contiguous()) ep_ctx_.placement_independent_sum = true;
    score_bias_->load_json(meta.router_bias, setup.resume_path + "/manifest.json: field \"router_bias\"");
    step0_ = meta.step;
    bad_steps_ = meta.bad_steps;
    // --time-budget: the count chosen before the checkpoint stays (the schedule must not move);
    // a checkpoint written during the warm-up lets this run choose it.
    if (opts.time_budget_s > 0 && meta.time_budget_steps > 0) {
      total_steps_ = std::min(meta.time_budget_steps, opts.steps);
      budget_pending_ = false;
      if (root_ && opts.progress)
        std::fprintf(stderr, "--time-budget: keeping the %d steps the checkpoint's run chose\n", total_steps_);
    } else if (opts.time_budget_s > 0 && step0_ > opts.optim.warmup_steps) {
      throw SetupError(str_cat("--time-budget: ", setup.resume_path, " is at step ", step0_, ", past the ",
                               opts.optim.warmup_steps, " warm-up steps whose time chooses the step count, and its "
                               "run did not use --time-budget: resume it with --steps"),
                       root_);
    } else if (opts.time_budget_s == 0 && meta.time_budget_steps > 0 && meta.time_budget_steps != opts.steps &&
               root_ && opts.progress) {
      std::fprintf(stderr, "note: the checkpoint's run chose %d steps with --time-budget; this run's schedule ends "
                   "at --steps %d\n", meta.time_budget_steps, opts.steps);
    }
    opt_->set_total_steps(total_steps_);
    bad_steps_at_start_ = bad_steps_;
    data_rng_.set_state(meta.data_rng_state);
    if (root_ && opts.progress)
      std::fprintf(stderr, "resumed from %s at step %d\n", setup.resume_path.c_str(), step0_);
  }
  score_bias_->apply(model);
  tokens_.resize(static_cast<size_t>(B_global_) * (T_ + 1));
  for (int m = 0; m < M_; ++m) mbs_.push_back(model.new_micro_batch());
  // The metrics carry every MoE layer's loads, not only the root's stage: each stage puts its
  // layers' loads at their place among all MoE layers (the first moe_before_stage_ belong to
  // earlier stages) and the pipeline group sums them. moe_layer_ids_ names them for `moetrain report`.
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    if (!cfg_.is_moe_layer(l)) continue;
    moe_layer_ids_.push_back(l);
    if (l < stage_.first_layer) ++moe_before_stage_;
  }
  // Tokenized data whose sidecar gives the held-out text's bytes per token (1 for text: nats
  // per token are nats per byte already).
  bytes_per_token_ = setup.corpus->val_bytes_per_token();
  tokenized_ = setup.corpus->tokenizer_kind() != "bytes" || bytes_per_token_ != 1.0;
  flops_per_step_ = model.flops_per_token(T_) * B_global_ * T_;
}

void Trainer::choose_comm_backend(int gpu) {
  // The transport of device buffers: NCCL when every rank has its own GPU, else MPI with host
  // staging. Decided from every rank's (host, GPU), so all ranks agree.
  if (grid_.world.size() <= 1) return;
  std::vector<double> gpus(grid_.world.size());
  const double mine = gpu;
  grid_.world.allgather(&mine, gpus.data(), 1);
  std::vector<std::pair<double, int>> gpu_of_rank(grid_.world.size());
  for (int r = 0; r < grid_.world.size(); ++r) gpu_of_rank[r] = {setup_.host_of[r], static_cast<int>(gpus[r])};
  std::string nccl_why;
  const bool nccl = setup_.device == Device::kCuda && comm::nccl_loadable(&nccl_why);
  backend_ = comm::choose_comm_backend(setup_.comm_backend, gpu_of_rank, nccl, &backend_why_, nccl_why);
  if (backend_ == comm::CommBackend::kNccl)
    for (comm::Group* g : {&grid_.ep, &grid_.dp, &grid_.data, &grid_.pp, &grid_.tp, &grid_.tokens})
      if (g->valid() && g->size() > 1) g->enable_nccl();
}

void Trainer::print_header() const {
  if (!opts_.progress || !root_) return;
  if (setup_.device == Device::kCuda && grid_.world.size() > 1)
    std::fprintf(stderr, "moetrain: device buffers between ranks over %s (%s)\n",
                 backend_ == comm::CommBackend::kNccl ? "NCCL" : "MPI, staged through the host",
                 backend_why_.c_str());
  const model::ParamCounts pc = model::count_params(cfg_);
  std::string split;
  for (int l : layers_per_stage_) {
    if (!split.empty()) split += ',';
    split += std::to_string(l);
  }
  const bool cuda = setup_.device == Device::kCuda;
  const std::string steps_text =
      budget_pending_ ? str_cat("steps to fill a ", format_budget(opts_.time_budget_s), " time budget",
                                opts_.steps < kTimeBudgetMaxSteps ? str_cat(" (at most ", opts_.steps, ")") : "")
                      : str_cat(total_steps_, " steps");
  const std::string blas = cuda ? std::string("cuBLAS") : str_cat("OpenBLAS ", kernels::blas_core_description());
  std::fprintf(stderr,
               "moetrain: %s, %.2fM params (%.2fM active), %d layers, E=%d k=%d, global batch "
               "%dx%d in %d micro-batch(es), %s, %d rank(s) [%s, layers %s, %s, a2a %s, "
               "recompute %s, %s], %d BLAS thread(s) per rank (%s), peak %.1f GFLOP/s per rank (%s GEMM%s)\n",
               opts_.model.config_path.empty() ? opts_.model.preset.c_str() : opts_.model.config_path.c_str(),
               pc.total / 1e6, pc.active / 1e6, cfg_.num_hidden_layers, cfg_.n_routed_experts,
               cfg_.num_experts_per_tok, B_global_, T_, M_, steps_text.c_str(), grid_.world.size(),
               grid_.dims.describe().c_str(), split.c_str(), parallel::schedule_name(setup_.schedule),
               comm::a2a_algorithm_name(setup_.a2a), model::recompute_name(setup_.recompute),
               grid_.topo.describe().c_str(), opts_.device.threads,
               blas.c_str(), res_.peak_gflops,
               setup_.bf16 && !cuda ? "oneDNN bf16" : peak_precision_.c_str(),
               peak_source_ == "measured" ? "" : str_cat(", given by ", peak_source_).c_str());
  if (!setup_.a2a_auto_why.empty()) std::fprintf(stderr, "moetrain: --a2a auto: %s\n", setup_.a2a_auto_why.c_str());
  if (opts_.parallel.comm_overlap) {
    const char* why = grid_.dims.ep < 2                 ? "no effect: no token exchange (--ep 1)"
                      : cfg_.n_shared_experts == 0       ? "no effect: the model has no shared experts"
                      : cuda                             ? "no effect on CUDA (the staged exchange shares the compute stream)"
                                                         : "the shared experts run beside each MoE layer's exchange";
    std::fprintf(stderr, "moetrain: --comm.overlap: %s\n", why);
  }
  if (opts_.device.precision == "auto")
    std::fprintf(stderr, "moetrain: --precision auto: %s (%s)\n", setup_.precision.c_str(),
                 setup_.auto_fp32_peak > 0
                     ? str_cat("bf16 peak ", static_cast<int>(setup_.auto_bf16_peak), " against fp32 ",
                               static_cast<int>(setup_.auto_fp32_peak), " GFLOP/s on rank 0; bf16 needs ",
                               kAutoBf16MinGain, "x on every rank").c_str()
                     : cuda ? "auto picks bf16 only on a CPU; ask for --precision bf16 on CUDA"
                            : str_cat("no bf16 GEMM here: ", kernels::bf16_cpu_unavailable_reason()).c_str());
}

bool Trainer::state_finite() const {
  // A sum of squares in double is finite exactly when every element is (|x| <= 3.4e38 squares to
  // at most 1.2e77): one reduction on the state's own device, no host copy of a GPU's weights.
  auto finite = [](const float* p, size_t n) { return std::isfinite(kernels::sum_squares(p, n)); };
  int64_t bad = finite(model_->params(), model_->num_params()) && finite(opt_->m().data(), opt_->m().size()) &&
                        finite(opt_->v().data(), opt_->v().size())
                    ? 0
                    : 1;
  if (grid_.world.size() > 1) grid_.world.allreduce_max(&bad, 1);
  return bad == 0;
}

StepOutcome Trainer::step(int step) {
  model::Model& model = *model_;
  const parallel::Grid& grid = grid_;
  StepOutcome s;
  traffic_.reset();
  std::optional<MoeStepRecorder> moe_recorder;  // forward and backward only (not validation)
  if (opts_.profile) moe_recorder.emplace(&s.moe_times);
  const double t0 = now_seconds();
  // Every rank draws the same global batch and keeps its share, so any layout sees the same data
  // as one process. The global batch is [M][D][Bm] sequences: micro-batch m of data rank d is one
  // block, so the m-th micro-batches of all data ranks form the m-th micro-batch of one process.
  // A read that fails (the data changed under the run, issue 42 class 5) stops every rank at this
  // step, before anything in it changed the state; the cursor goes back to where the step began.
  {
    const uint64_t cursor = data_rng_.state();
    std::string data_error;
    try {
      setup_.corpus->sample_batch(tokens_.data(), B_global_, T_, data_rng_, io::Split::kTrain);
    } catch (const Error& e) {
      data_error = e.what();
    }
    int64_t bad_data = data_error.empty() ? 0 : 1;
    if (grid.world.size() > 1) grid.world.allreduce_max(&bad_data, 1);
    if (bad_data) {
      data_rng_.set_state(cursor);
      stop_on_data_error(step, data_error.empty() ? std::string("another rank could not read its training data")
                                                  : data_error);
    }
  }
  auto micro_tokens = [&](int m) {
    return tokens_.data() + (static_cast<size_t>(m) * D_ + grid.data_rank()) * Bm_ * (T_ + 1);
  };
  model.zero_grads();
  model.activation_memory().reset_peak();
  model.work_memory().reset_peak();
  model.total_memory().reset_peak();
  model::LossParts& loss = s.loss;
  std::vector<int64_t>& flat_loads = s.loads;
  double dispatch_bytes = 0;  // the largest micro-batch's
  parallel::StageCallbacks cb;
  cb.forward = [&](int m, const float* x_in, float* x_out) {
    model::LossParts lp = model.forward(*mbs_[m], micro_tokens(m), x_in, x_out, Bm_, T_);
    loss.ce += lp.ce / M_;
    loss.aux += lp.aux / M_;
    dispatch_bytes = std::max(dispatch_bytes, static_cast<double>(model.moe_dispatch_bytes(*mbs_[m])));
    std::vector<int64_t> f;
    for (auto& l : model.expert_loads(*mbs_[m])) f.insert(f.end(), l.begin(), l.end());
    if (flat_loads.empty()) flat_loads.assign(f.size(), 0);
    for (size_t i = 0; i < f.size(); ++i) flat_loads[i] += f[i];
  };
  cb.backward = [&](int m, const float* dy_out, float* dx_in) {
    model.backward(*mbs_[m], dy_out, dx_in, 1.0f / (D_ * M_));
  };
  const size_t act_floats = static_cast<size_t>(Bm_) * T_ / grid.dims.tp * cfg_.hidden_size;
  {  // bf16 on the CPU: the weights converted once for the step's forward and backward passes
    kernels::Bf16WeightScope bf16_weights(model.params(), model.num_params());
    s.pipe = parallel::run_pipeline(grid.pp, setup_.schedule, M_, act_floats, cb, pipe_mem_.get(), setup_.device);
  }
  moe_recorder.reset();
  {
    ScopedTimer t(s.sync_s);
    parallel::sync_tensor_parallel(model.layout(), model.grads(), grid);
    if (shard_->sharded())
      shard_->reduce_scatter(model.grads());
    else
      parallel::sync_gradients(model.layout(), model.grads(), grid);
  }
  // Global figures: losses averaged over the ranks of a stage and summed over the stages (ce lives
  // on the last stage, each stage has its own layers' aux losses); loads and bytes summed.
  loss.ce = data_mean(grid, loss.ce);
  loss.aux = data_mean(grid, loss.aux);
  if (grid.pp.size() > 1) {
    double parts[2] = {loss.ce, loss.aux};
    grid.pp.allreduce_sum(parts, 2);
    loss.ce = parts[0];
    loss.aux = parts[1];
  }
  loss.total = loss.ce + loss.aux;
  auto hook = [step](const std::vector<int>& steps) {
    return std::find(steps.begin(), steps.end(), step + 1) != steps.end();
  };
  if (hook(opts_.faults.nan_steps))
    set_first(model.grads(), NAN);  // test hook: a non-finite gradient on every rank's first tensor
  {
    ScopedTimer t(s.optimizer_s);
    // A non-finite loss or gradient norm (the same on every rank) skips the update.
    if (std::isfinite(loss.total)) s.grad_norm = opt_->step(model.params(), model.grads(), step);
    s.skipped = !std::isfinite(loss.total) || !std::isfinite(s.grad_norm);
    if (shard_->sharded() && !s.skipped) shard_->allgather(model.params());  // every rank's updated slice
  }
  if (hook(opts_.faults.inf_weight_steps))
    set_first(model.params(), INFINITY);  // test hook: the update "overflowed" one weight on every rank
  if (s.skipped) {
    ++bad_steps_;
    ++bad_in_a_row_;
    if (root_)
      std::fprintf(stderr, "%sstep %d: non-finite %s, update skipped (%d in a row, %d in all)\n",
                   tty_ ? "\n" : "", step + 1, std::isfinite(loss.total) ? "gradient" : "loss", bad_in_a_row_,
                   bad_steps_);
    // The loss and the norm are global: every rank stops here together, one reports.
    if (bad_in_a_row_ >= opts_.faults.max_bad_steps)
      throw SetupError(str_cat(bad_in_a_row_, " non-finite steps in a row (--max-bad-steps ",
                               opts_.faults.max_bad_steps, "): stopping; the last good checkpoint is ",
                               checkpointer_->last_or_none()),
                       root_);
  } else {
    bad_in_a_row_ = 0;
  }
  s.seconds = now_seconds() - t0;
  for (int c = 0; c < comm::kNumLinkClasses; ++c) s.bytes.push_back(static_cast<int64_t>(traffic_.bytes[c]));
  flat_loads = global_expert_loads(grid, std::move(flat_loads), moe_layer_ids_.size() * cfg_.n_routed_experts,
                                   moe_before_stage_ * cfg_.n_routed_experts);
  // Aux-loss-free balancing: the step's global loads move the selection bias (not on a skipped
  // step: its update did not happen either).
  if (score_bias_->active() && !s.skipped) {
    score_bias_->update(flat_loads);
    score_bias_->apply(model);
  }
  // Expert parallelism: rank loads, and every --balance.migrate-every steps a migration.
  s.balance = balance_step(model, opts_, grid, moe_layer_ids_, flat_loads, step, total_steps_, s.skipped,
                           {model.params(), opt_->m().data(), opt_->v().data()}, root_ && opts_.progress, tty_);
  if (grid.world.size() > 1) grid.world.allreduce_sum(s.bytes.data(), static_cast<int64_t>(s.bytes.size()));
  s.stages = gather_stage_stats(grid, s.pipe, traffic_.seconds, model, s.a2a_by_rank);
  for (const StageStats& st : s.stages) {
    s.a2a_s = std::max(s.a2a_s, st.a2a_s);
    s.bubble = std::max(s.bubble, st.step_s > 0 ? st.bubble_s / st.step_s : 0.0);
  }
  s.dispatch_bytes.assign(grid.world.size(), dispatch_bytes);
  if (grid.world.size() > 1) grid.world.allgather(&dispatch_bytes, s.dispatch_bytes.data(), 1);
  return s;
}

// --time-budget: steps 0..warmup run at learning rates that do not depend on the step count, so
// the count is chosen after step `warmup` from the median time of this process's warm-up steps
// (its first two untimed: first-touch page faults, JIT kernels), the slowest rank's, and fixed
// from there on: --steps with the chosen count repeats the run exactly.
void Trainer::choose_steps(int step, double step_seconds) {
  if (step >= step0_ + 2) warmup_times_.push_back(step_seconds);
  if (step < opts_.optim.warmup_steps) return;
  if (warmup_times_.empty()) warmup_times_.push_back(step_seconds);  // resumed at the warm-up's end
  std::vector<double> t = warmup_times_;
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  // Every rank must choose the same count: the slowest rank's median and clock decide.
  double agreed[2] = {t[t.size() / 2], train_s_};
  if (grid_.world.size() > 1) grid_.world.allreduce_max(agreed, 2);
  const double median = std::max(agreed[0], 1e-9);
  // Steps of an earlier process (a resumed run) count at the median.
  const double spent = agreed[1] + step0_ * median;
  const double more = std::floor(std::max(0.0, opts_.time_budget_s - spent) / median);
  total_steps_ = static_cast<int>(std::min<double>(opts_.steps, step + 1 + more));
  opt_->set_total_steps(total_steps_);
  budget_pending_ = false;
  budget_record_ = TimeBudgetRecord{opts_.time_budget_s, median, spent, static_cast<int>(warmup_times_.size()),
                                    total_steps_};
  if (root_ && opts_.progress)
    std::fprintf(stderr, "%s--time-budget %s: %d steps (median step %.3g s over %d warm-up steps; `--steps %d` "
                 "repeats this run)\n", tty_ ? "\n" : "", format_budget(opts_.time_budget_s).c_str(),
                 total_steps_, median, static_cast<int>(warmup_times_.size()), total_steps_);
}

void Trainer::log(int step, const StepOutcome& s, double vl) {
  const double tps = B_global_ * T_ / s.seconds;
  ema_tps_ = step == step0_ ? tps : 0.9 * ema_tps_ + 0.1 * tps;
  const double mfu = flops_per_step_ / s.seconds / (res_.peak_gflops * 1e9 * grid_.world.size());
  if (!root_) return;
  StepRecord rec;
  rec.step = step + 1;
  rec.loss = s.loss.total;
  rec.ce_loss = s.loss.ce;
  rec.aux_loss = s.loss.aux;
  rec.lr = learning_rate(opt_->config(), step);
  rec.grad_norm = s.grad_norm;
  rec.tokens = static_cast<double>(static_cast<long long>(B_global_) * T_);
  rec.tokens_per_s = tps;
  rec.mfu = mfu;
  rec.mfu_peak = {res_.peak_gflops, peak_precision_, peak_source_};
  rec.step_time_s = s.seconds;
  rec.elapsed_s = now_seconds() - t_start_;  // wall time since this process started training
  rec.bubble_fraction = s.bubble;
  rec.time_s = {s.pipe.total_s, s.pipe.compute_s, s.pipe.wait_s, s.sync_s, s.optimizer_s, s.a2a_s, {}};
  if (opts_.profile)
    for (const auto& [name, ms] : mixture::moe_step_times_ms(s.moe_times)) rec.time_s.moe.emplace_back(name, ms * 1e-3);
  rec.a2a_rank_s = s.a2a_by_rank;
  rec.ranks_per_node = grid_.topo.ranks_per_node;
  for (int c = 0; c < 4; ++c) rec.a2a_bytes[c] = static_cast<double>(s.bytes[c]);
  rec.activation_peak_bytes = static_cast<double>(model_->activation_memory().peak());
  rec.optimizer_bytes = optimizer_bytes_;
  rec.moe_dispatch_bytes = s.dispatch_bytes;
  for (size_t i = 0; i < s.stages.size(); ++i) {
    const StageStats& st = s.stages[i];
    rec.stages.push_back({static_cast<int>(i), static_cast<double>(layers_per_stage_[i]), st.compute_s, st.bubble_s,
                          st.a2a_s, st.step_s, st.activation_peak_bytes, st.total_peak_bytes,
                          static_cast<double>(st.max_in_flight)});
  }
  const int E = cfg_.n_routed_experts;
  for (size_t pos = 0; E > 0 && pos < s.loads.size(); pos += E)
    rec.expert_loads.emplace_back(s.loads.begin() + pos, s.loads.begin() + pos + E);
  rec.expert_loads_layers = moe_layer_ids_;
  rec.rank_loads = s.balance.rank_loads;  // per MoE layer: tokens per EP rank, and their max/mean
  rec.load_imbalance = s.balance.imbalance;
  rec.migration = s.balance.migration;
  rec.time_budget = std::exchange(budget_record_, std::nullopt);
  rec.val_loss = vl;
  // Tokenized data: the held-out loss per byte of text as well, comparable with a byte model's.
  if (!std::isnan(vl) && tokenized_ && bytes_per_token_ > 0) rec.val_loss_nats_per_byte = vl / bytes_per_token_;
  setup_.metrics << to_json(rec).dump() << "\n";
  setup_.metrics.flush();
  // A write that fails (a full disk, a file-size limit: EFBIG, SIGXFSZ being ignored) stops the
  // run with one line instead of training on with metrics silently cut short.
  if (!setup_.metrics.good())
    throw Error(str_cat(opts_.out_dir, "/metrics.jsonl: cannot write the record of step ", step + 1, " (",
                        std::strerror(errno), ")"));

  if (!opts_.progress) return;
  const bool last = step + 1 == total_steps_;
  const double elapsed = now_seconds() - t_start_;
  // Before --time-budget has chosen the count, the budget left is the estimate.
  const double eta = budget_pending_ ? std::max(0.0, opts_.time_budget_s - train_s_)
                                     : elapsed / (step + 1 - step0_) * (total_steps_ - step - 1);
  const std::string total_text = budget_pending_ ? std::string("?") : std::to_string(total_steps_);
  char line[256];
  std::snprintf(line, sizeof line,
                "step %5d/%s  loss %.4f  aux %.4f  %7.0f tok/s  MFU %5.1f%%  a2a %4.1f%%  "
                "bubble %4.1f%%  ETA %s",
                step + 1, total_text.c_str(), s.loss.total, s.loss.aux, ema_tps_, 100.0 * mfu, 100.0 * s.a2a_s / s.seconds,
                100.0 * s.bubble, format_duration(eta).c_str());
  std::string text = line;
  if (!std::isnan(vl)) text += str_cat("  val ", vl);
  if (!std::isnan(vl) && tokenized_ && bytes_per_token_ > 0) text += str_cat(" (", vl / bytes_per_token_, " nats/byte)");
  if (tty_) {
    std::fprintf(stderr, "\r%-130s", text.c_str());
    if (!std::isnan(vl) || last) std::fprintf(stderr, "\n");
  } else if (!std::isnan(vl) || step == 0 || (step + 1) % 20 == 0) {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void Trainer::save_checkpoint_at(int steps_done) {
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.data_rng_state = data_rng_.state();
  meta.seed = opts_.data.seed;
  meta.bad_steps = bad_steps_;
  meta.time_budget_steps = opts_.time_budget_s > 0 && !budget_pending_ ? total_steps_ : 0;
  meta.router_bias = score_bias_->to_json();
  const io::Corpus::Identity data = setup_.corpus->identity();
  meta.data = {{"file", data.file}, {"bytes", data.bytes}, {"sample", data.sample}, {"mtime_ns", data.mtime_ns}};
  checkpointer_->save(std::move(meta), *model_, *opt_, *shard_);
}

void Trainer::stop_on_data_error(int step, const std::string& what) {
  // The state is the one `step` steps left (this step had changed nothing yet): saved unless
  // this process ran no step, a checkpoint of it exists already, or it is not good.
  const std::string last = checkpointer_->last();
  const bool have = !last.empty() && checkpoint_step_of(fs::path(last).filename().string()) == step;
  if (step > step0_ && !have && bad_in_a_row_ == 0 && !setup_.ckpt_dir.empty() && state_finite())
    save_checkpoint_at(step);
  if (root_ && tty_) std::fprintf(stderr, "\n");
  throw SetupError(str_cat(what, "; stopped before step ", step + 1, ", checkpoint ", checkpointer_->last_or_none()),
                   root_);
}

TrainResult Trainer::run() {
  print_header();
  t_start_ = now_seconds();
  bool stopped_early = false;
  for (int step = step0_; step < total_steps_; ++step) {
    const StepOutcome s = this->step(step);
    train_s_ += s.seconds;
    if (budget_pending_) choose_steps(step, s.seconds);
    res_.losses.push_back(s.loss.total);
    res_.last_stages = s.stages;
    if (opts_.profile) {
      mixture::add_step_times(profile_moe_, s.moe_times);
      profile_compute_ += s.pipe.compute_s;
      profile_opt_ += s.optimizer_s;
      profile_sync_ += s.sync_s;
      profile_steps_ += s.seconds;
      profile_a2a_ += s.a2a_by_rank[grid_.world.rank()];
    }
    const bool last = step + 1 == total_steps_;
    double vl = NAN;
    if (last || (opts_.data.eval_every > 0 && (step + 1) % opts_.data.eval_every == 0)) {
      vl = evaluate();
      res_.val_losses.emplace_back(step + 1, vl);
    }
    // Metrics go out before the checkpoint: a step whose checkpoint exists has its line.
    log(step, s, vl);
    // Checkpoint every N steps, at the end, and when a scheduler asks us to stop (SIGTERM/SIGINT
    // on any rank: all ranks agree, finish this step, save, and exit cleanly).
    int64_t stop = g_stop_requested ? 1 : 0;
    if (grid_.world.size() > 1) grid_.world.allreduce_max(&stop, 1);
    // No checkpoint during a streak of non-finite steps: the last good one stays the newest.
    bool save = bad_in_a_row_ == 0 &&
                (last || stop || (opts_.checkpoint.every > 0 && (step + 1) % opts_.checkpoint.every == 0));
    // A checkpoint is only ever called good when its tensors are: a finite loss and gradient can
    // still overflow in the update.
    if (save && !state_finite()) {
      save = false;
      if (root_)
        std::fprintf(stderr, "%sstep %d: weights or AdamW state not finite after the update: no checkpoint "
                     "written; the last good one is %s\n", tty_ ? "\n" : "", step + 1,
                     checkpointer_->last_or_none().c_str());
    }
    if (save && !setup_.ckpt_dir.empty()) save_checkpoint_at(step + 1);
    ++steps_run_;
    if (!s.skipped) ++good_steps_;
    if (stop) {
      stopped_early = true;
      if (root_)
        std::fprintf(stderr, "%sstopping on request after step %d; checkpoint %s\n", tty_ ? "\n" : "", step + 1,
                     checkpointer_->last().empty() ? "none (no good step yet)" : checkpointer_->last().c_str());
      break;
    }
  }
  finish(stopped_early);
  return res_;
}

void Trainer::finish(bool stopped_early) {
  res_.seconds = now_seconds() - t_start_;
  res_.bad_steps = bad_steps_;
  // A run that never updated the weights did not train: say so and fail, whatever the reason.
  if (steps_run_ > 0 && good_steps_ == 0)
    throw SetupError(str_cat("every step of this run was skipped (", bad_steps_ - bad_steps_at_start_,
                             " non-finite loss or gradient): nothing trained, no weights written; the last good "
                             "checkpoint is ", checkpointer_->last_or_none()),
                     root_);
  if (stopped_early) return;
  if (!state_finite())
    throw SetupError(str_cat("the final weights are not finite: no weights written; the last good checkpoint is ",
                             checkpointer_->last_or_none()),
                     root_);
  const int ran = std::max(1, total_steps_ - step0_);
  res_.tokens_per_s = static_cast<double>(B_global_) * T_ * ran / res_.seconds;
  res_.mfu = flops_per_step_ * ran / res_.seconds / (res_.peak_gflops * 1e9 * grid_.world.size());

  if (opts_.profile && root_) print_profile(profile_moe_, profile_compute_, profile_opt_, profile_sync_, profile_steps_, profile_a2a_);
  if (root_) model::save_config(cfg_, opts_.out_dir + "/config.json");
  checkpointer_->write_weights(*model_, layers_per_stage_, opts_.out_dir + "/model.safetensors");
  if (opts_.progress && root_) {
    const double final_val = res_.val_losses.empty() ? NAN : res_.val_losses.back().second;
    char val_text[160];
    if (!tokenized_)
      std::snprintf(val_text, sizeof val_text, "%.4f nats/byte", final_val);
    else if (bytes_per_token_ > 0)
      std::snprintf(val_text, sizeof val_text, "%.4f nats/token = %.4f nats/byte", final_val,
                    final_val / bytes_per_token_);
    else
      std::snprintf(val_text, sizeof val_text,
                    "%.4f nats/token (bytes per token unknown: no sidecar, or no tokenizer model beside the dataset)",
                    final_val);
    const std::string budget_text =
        opts_.time_budget_s > 0 ? str_cat(" (training steps ", format_budget(train_s_), " of the ",
                                          format_budget(opts_.time_budget_s), " budget)")
                                : std::string();
    std::fprintf(stderr,
                 "done: %d steps in %s%s, %.0f tokens/s, MFU %.1f%%, final val loss %s; "
                 "wrote %s/{model.safetensors,config.json,metrics.jsonl}\n",
                 total_steps_, format_duration(res_.seconds).c_str(), budget_text.c_str(), res_.tokens_per_s,
                 100 * res_.mfu, val_text, opts_.out_dir.c_str());
  }
}

}  // namespace

TrainResult run_training(const TrainOptions& opts) {
  MOE_CHECK(comm::MpiRuntime::initialized() || comm::MpiRuntime::local_world(),
            "run_training needs MPI initialised or a world of one (comm::MpiRuntime)");
  std::unique_ptr<RunSetup> setup = setup_run(opts);
  Trainer trainer(opts, *setup);
  return trainer.run();
}

}  // namespace moe::train
