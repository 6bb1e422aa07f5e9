// The training loop (train/trainer.h). A step is: data -> forward/backward through the pipeline
// schedule -> gradient sync -> update -> components. The components, each in its own file:
// ExpertBalance (loads, selection bias, migration), BadStepPolicy and the test-only FaultInjector,
// TimeBudget, StepProfile, MfuPeak; the figures gathered over ranks (step_figures.h), the held-out
// loss (validation.h), the stderr lines (progress.h), the metrics line (step_record.h), the
// checkpoints (checkpointer.h).
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "comm/mpi_runtime.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/exec_context.h"
#include "kernels/gemm_bf16_cpu.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/expert_balance.h"
#include "train/fault_policy.h"
#include "train/init_from.h"
#include "train/mfu_peak.h"
#include "train/progress.h"
#include "train/run_device.h"
#include "train/run_model.h"
#include "train/run_optimizer.h"
#include "train/run_setup.h"
#include "train/step_figures.h"
#include "train/step_profile.h"
#include "train/step_record.h"
#include "train/time_budget.h"
#include "train/validation.h"

namespace moe::train {
namespace fs = std::filesystem;

namespace {

// One optimizer step's figures: what the metrics line, the progress line and the run's totals need.
struct StepOutcome {
  model::LossParts loss;  // of the global batch
  double grad_norm = NAN;
  bool skipped = false;  // a non-finite loss or gradient: no update
  double seconds = 0, sync_s = 0, optimizer_s = 0;
  parallel::PipelineTimes pipe;
  mixture::MoeStepTimes moe_times;  // --profile
  StepBalance balance;              // global expert loads, EP-rank loads, migration
  StepFigures fig;                  // exchange bytes, stages, the worst stage's exchange and bubble
};

// The run once its setup passed: the grid, the device, the model and its optimizer, the data and
// the components. run() is the loop; step() one optimizer step, log() the metrics and progress lines.
class Trainer {
 public:
  Trainer(const TrainOptions& opts, RunSetup& setup);
  TrainResult run();

 private:
  void resume(model::Model& model);
  StepOutcome step(int step);
  // The step's global batch into tokens_; a read that fails stops the run (stop_on_data_error).
  void read_batch(int step);
  // Forward and backward of the M micro-batches through the pipeline schedule, into s.
  void forward_backward(StepOutcome& s, std::vector<int64_t>& stage_loads, double& dispatch_bytes);
  void sync_gradients(StepOutcome& s);  // over TP, then the data ranks (or ZeRO-1's reduce-scatter)
  // The optimizer step (skipped on a non-finite loss or gradient), the fault hooks around it, and
  // the bad-step policy after it.
  void update(int step, StepOutcome& s);
  // The weights, AdamW state and data cursor after steps_done steps as a checkpoint.
  void save_checkpoint_at(int steps_done);
  // The training data could not be read (a .bin truncated under the run): every rank stops here,
  // after a checkpoint of the state the last step left, and throws SetupError (exit 1).
  [[noreturn]] void stop_on_data_error(int step, const std::string& what);
  void log(int step, const StepOutcome& s, double val_loss);
  // Collective: weights and AdamW moments finite on every rank (run_optimizer.h).
  bool state_finite() const { return train::state_finite(run_model_.model(), *optim_.adamw, grid_); }
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
  RunDevice device_;
  TrainResult res_;
  MfuPeak peak_;
  RunModel run_model_;  // the model, its exchange and parallel contexts
  ExpertBalance balance_;
  RunOptimizer optim_;  // AdamW, its ZeRO-1 shard, every rank's state bytes
  std::unique_ptr<MemTracker> pipe_mem_;
  Rng data_rng_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::vector<int32_t> tokens_;  // the global batch
  std::vector<model::Model::MicroBatchPtr> mbs_;
  double bytes_per_token_ = 1.0;
  bool tokenized_ = false;
  double flops_per_step_ = 0;
  TimeBudget budget_;  // the step count: --steps, or what --time-budget chose
  BadStepPolicy bad_steps_;
  const FaultInjector faults_;  // test hooks
  StepProfile profile_;
  int step0_ = 0, good_steps_ = 0, steps_run_ = 0;
  double t_start_ = 0, ema_tps_ = 0;
  double start_val_ = NAN;  // --init-from: the held-out loss of the loaded weights, before step 1
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
      device_(opts, setup, grid_),
      peak_(MfuPeak::find(opts.device, setup)),  // on the device, in the run's precision
      run_model_(opts, setup, grid_, stage_),
      balance_(setup.cfg, opts.balance, grid_, stage_, root_ && opts.progress, tty_),
      data_rng_(derive_rng(opts.data.seed, /*stream=*/1)),
      budget_(opts, root_ && opts.progress, tty_),
      bad_steps_(opts.faults.max_bad_steps, root_, tty_),
      faults_(opts.faults),
      profile_(opts.profile) {
  res_.peak_gflops = peak_.gflops;

  model::Model& model = run_model_.model();
  OptimConfig oc = opts.optim;
  oc.total_steps = budget_.total_steps();
  optim_ = make_run_optimizer(model, oc, grid_, opts.parallel.zero1);
  pipe_mem_ = std::make_unique<MemTracker>(&model.total_memory());
  nlohmann::json parallel_json = {{"pp", grid_.dims.pp},
                                  {"dp", grid_.dims.dp},
                                  {"ep", grid_.dims.ep},
                                  {"tp", grid_.dims.tp},
                                  {"layers_per_stage", layers_per_stage_},
                                  {"micro_batches", M_},
                                  {"a2a", name(setup.a2a)},
                                  {"batch_per_rank", B_}};
  checkpointer_ = std::make_unique<Checkpointer>(grid_, cfg_, setup.ckpt_dir, opts.checkpoint.keep,
                                                 std::move(parallel_json));
  if (!setup.resume_path.empty()) {
    resume(model);
  } else if (!opts.model.init_from.empty()) {
    init_from_folder(opts.model.init_from, model, balance_.score_bias());  // train/init_from.h; checked in setup
  }
  balance_.score_bias().apply(model);  // noaux_tc: every MoE layer's selection bias (train/score_bias.h)
  tokens_.resize(static_cast<size_t>(B_global_) * (T_ + 1));
  for (int m = 0; m < M_; ++m) mbs_.push_back(model.new_micro_batch());
  // Tokenized data whose sidecar gives the held-out text's bytes per token (1 for text: nats
  // per token are nats per byte already).
  bytes_per_token_ = setup.corpus->val_bytes_per_token();
  tokenized_ = setup.corpus->tokenizer_kind() != "bytes" || bytes_per_token_ != 1.0;
  flops_per_step_ = model.flops_per_token(T_) * B_global_ * T_;
}

void Trainer::resume(model::Model& model) {
  const CheckpointMeta meta = checkpointer_->resume(setup_.resume_path, model, *optim_.adamw, *optim_.shard);
  run_model_.after_resume();
  balance_.score_bias().load_json(meta.router_bias, setup_.resume_path + "/manifest.json: field \"router_bias\"");
  step0_ = meta.step;
  bad_steps_.resume(meta.bad_steps);
  budget_.resume(step0_, meta.time_budget_steps, setup_.resume_path, root_);
  optim_.adamw->set_total_steps(budget_.total_steps());
  data_rng_.set_state(meta.data_rng_state);
  if (root_ && opts_.progress) std::fprintf(stderr, "resumed from %s at step %d\n", setup_.resume_path.c_str(), step0_);
}

// Every rank draws the same global batch and keeps its share, so any layout sees the same data
// as one process. The global batch is [M][D][Bm] sequences: micro-batch m of data rank d is one
// block, so the m-th micro-batches of all data ranks form the m-th micro-batch of one process.
// A read that fails (the data changed under the run, issue 42 class 5) stops every rank at this
// step, before anything in it changed the state; the cursor goes back to where the step began.
void Trainer::read_batch(int step) {
  const uint64_t cursor = data_rng_.state();
  std::string data_error;
  try {
    setup_.corpus->sample_batch(tokens_.data(), B_global_, T_, data_rng_, io::Split::kTrain);
  } catch (const Error& e) {
    data_error = e.what();
  }
  int64_t bad_data = data_error.empty() ? 0 : 1;
  if (grid_.world.size() > 1) grid_.world.allreduce_max(&bad_data, 1);
  if (bad_data) {
    data_rng_.set_state(cursor);
    stop_on_data_error(step, data_error.empty() ? std::string("another rank could not read its training data")
                                                : data_error);
  }
}

void Trainer::forward_backward(StepOutcome& s, std::vector<int64_t>& stage_loads, double& dispatch_bytes) {
  model::Model& model = run_model_.model();
  std::optional<MoeStepRecorder> recorder;  // --profile: forward and backward only (not validation)
  profile_.record(recorder, model, &s.moe_times);
  auto micro_tokens = [&](int m) {
    return tokens_.data() + (static_cast<size_t>(m) * D_ + grid_.data_rank()) * Bm_ * (T_ + 1);
  };
  model.zero_grads();
  model.activation_memory().reset_peak();
  model.work_memory().reset_peak();
  model.total_memory().reset_peak();
  parallel::StageCallbacks cb;
  cb.forward = [&](int m, const float* x_in, float* x_out) {
    model::LossParts lp = model.forward(*mbs_[m], micro_tokens(m), x_in, x_out, Bm_, T_);
    s.loss.ce += lp.ce / M_;
    s.loss.aux += lp.aux / M_;
    s.loss.mtp += lp.mtp / M_;
    s.loss.mtp_weight = lp.mtp_weight;
    dispatch_bytes = std::max(dispatch_bytes, static_cast<double>(model.moe_dispatch_bytes(*mbs_[m])));
    ExpertBalance::add_micro_batch(model, *mbs_[m], stage_loads);
  };
  cb.backward = [&](int m, const float* dy_out, float* dx_in) {
    model.backward(*mbs_[m], dy_out, dx_in, 1.0f / (D_ * M_));
  };
  const size_t act_floats = static_cast<size_t>(Bm_) * T_ / grid_.dims.tp * cfg_.hidden_size;
  // bf16 on the CPU: the weights converted once for the step's forward and backward passes
  kernels::Bf16WeightScope bf16_weights(model.params(), model.num_params());
  s.pipe = parallel::run_pipeline(grid_.pp, setup_.schedule, M_, act_floats, cb, pipe_mem_.get(), setup_.device);
}

void Trainer::sync_gradients(StepOutcome& s) {
  model::Model& model = run_model_.model();
  ScopedTimer t(s.sync_s);
  parallel::sync_tensor_parallel(model.layout(), model.grads(), grid_);
  parallel::sync_tied_embedding(cfg_, model.layout(), model.grads(), grid_);
  if (optim_.shard->sharded())
    optim_.shard->reduce_scatter(model.grads());
  else
    parallel::sync_gradients(model.layout(), model.grads(), grid_);
}

void Trainer::update(int step, StepOutcome& s) {
  model::Model& model = run_model_.model();
  faults_.before_update(step, model.grads());
  {
    ScopedTimer t(s.optimizer_s);
    // A non-finite loss or gradient norm (the same on every rank) skips the update.
    const bool loss_finite = std::isfinite(s.loss.total);
    if (loss_finite) s.grad_norm = optim_.adamw->step(model.params(), model.grads(), step);
    s.skipped = !loss_finite || !std::isfinite(s.grad_norm);
    if (optim_.shard->sharded() && !s.skipped) optim_.shard->allgather(model.params());  // every rank's updated slice
  }
  faults_.after_update(step, model.params());
  bad_steps_.after_step(step, s.skipped, std::isfinite(s.loss.total), *checkpointer_);
}

// data -> forward/backward -> sync -> update -> components, then the figures over the ranks.
StepOutcome Trainer::step(int step) {
  model::Model& model = run_model_.model();
  StepOutcome s;
  run_model_.traffic().reset();
  const double t0 = now_seconds();
  read_batch(step);
  std::vector<int64_t> stage_loads;  // tokens per expert of this stage's MoE layers
  double dispatch_bytes = 0;         // the largest micro-batch's
  forward_backward(s, stage_loads, dispatch_bytes);
  sync_gradients(s);
  s.loss = global_loss(grid_, s.loss);
  update(step, s);
  s.seconds = now_seconds() - t0;
  s.balance = balance_.after_update(model, std::move(stage_loads), step, budget_.total_steps(), s.skipped,
                                    {model.params(), optim_.adamw->m().data(), optim_.adamw->v().data()});
  s.fig = gather_step_figures(grid_, s.pipe, run_model_.traffic(), model, dispatch_bytes);
  return s;
}

void Trainer::log(int step, const StepOutcome& s, double vl) {
  const double tps = B_global_ * T_ / s.seconds;
  ema_tps_ = step == step0_ ? tps : 0.9 * ema_tps_ + 0.1 * tps;
  const double mfu = peak_.mfu(flops_per_step_, s.seconds, grid_.world.size());
  if (!root_) return;
  StepRecord rec;  // the metrics line (train/step_record.h, docs/metrics.md)
  rec.step = step + 1;
  rec.loss = s.loss.total;
  rec.ce_loss = s.loss.ce;
  rec.aux_loss = s.loss.aux;
  rec.mtp_loss = s.loss.mtp;
  rec.lr = learning_rate(optim_.adamw->config(), step);
  rec.grad_norm = s.grad_norm;
  rec.tokens = static_cast<double>(static_cast<long long>(B_global_) * T_);
  rec.tokens_per_s = tps;
  rec.mfu = mfu;
  rec.mfu_peak = peak_.record();
  rec.step_time_s = s.seconds;
  rec.elapsed_s = now_seconds() - t_start_;  // wall time since this process started training
  rec.time_s = {s.pipe.total_s, s.pipe.compute_s, s.pipe.wait_s, s.sync_s, s.optimizer_s, NAN, {}};
  rec.ranks_per_node = grid_.topo.ranks_per_node;
  rec.activation_peak_bytes = static_cast<double>(run_model_.model().activation_memory().peak());
  rec.optimizer_bytes = optim_.bytes_per_rank;
  add_to_record(s.fig, layers_per_stage_, rec);
  balance_.add_to_record(s.balance, rec);
  profile_.add_to_record(s.moe_times, rec);
  rec.time_budget = budget_.take_record();
  rec.val_loss = vl;
  // Tokenized data: the held-out loss per byte of text as well, comparable with a byte model's.
  const double bytes_per_token = tokenized_ ? bytes_per_token_ : 0.0;
  if (!std::isnan(vl) && bytes_per_token > 0) rec.val_loss_nats_per_byte = vl / bytes_per_token;
  if (step == step0_) rec.val_loss_start = start_val_;
  append_step_record(setup_.metrics, rec, opts_.out_dir + "/metrics.jsonl");
  if (!opts_.progress) return;
  ProgressLine p;
  p.step = step;
  p.total_text = budget_.pending() ? std::string("?") : std::to_string(budget_.total_steps());
  p.last = step + 1 == budget_.total_steps();
  p.loss = s.loss;
  p.tokens_per_s = ema_tps_;
  p.mfu = mfu;
  p.a2a_share = s.fig.a2a_s / s.seconds;
  p.bubble = s.fig.bubble;
  p.eta_s = budget_.eta(step, step0_, now_seconds() - t_start_);
  p.val_loss = vl;
  p.bytes_per_token = bytes_per_token;
  print_progress(p, tty_);
}

void Trainer::save_checkpoint_at(int steps_done) {
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.data_rng_state = data_rng_.state();
  meta.seed = opts_.data.seed;
  meta.bad_steps = bad_steps_.total();
  meta.time_budget_steps = budget_.checkpoint_steps();
  meta.router_bias = balance_.score_bias().to_json();
  const io::Corpus::Identity data = setup_.corpus->identity();
  meta.data = {{"file", data.file}, {"bytes", data.bytes}, {"sample", data.sample}, {"mtime_ns", data.mtime_ns}};
  checkpointer_->save(std::move(meta), run_model_.model(), *optim_.adamw, *optim_.shard);
}

void Trainer::stop_on_data_error(int step, const std::string& what) {
  // The state is the one `step` steps left (this step had changed nothing yet): saved unless
  // this process ran no step, a checkpoint of it exists already, or it is not good.
  const std::string last = checkpointer_->last();
  const bool have = !last.empty() && checkpoint_step_of(fs::path(last).filename().string()) == step;
  if (step > step0_ && !have && bad_steps_.in_a_row() == 0 && !setup_.ckpt_dir.empty() && state_finite())
    save_checkpoint_at(step);
  if (root_ && tty_) std::fprintf(stderr, "\n");
  throw SetupError(str_cat(what, "; stopped before step ", step + 1, ", checkpoint ", checkpointer_->last_or_none()),
                   root_);
}

TrainResult Trainer::run() {
  // The whole run on the model's execution context: its steps, validation and checkpoints.
  const kernels::ContextScope on(run_model_.model().context());
  if (opts_.progress && root_)
    print_run_header(opts_, setup_, grid_, layers_per_stage_, budget_.steps_text(), peak_, device_.backend(), device_.backend_why());
  // --init-from: the loaded weights' held-out loss on the run's windows (`moetrain eval` of the
  // folder with this --batch x ep x dp, --seq-len and --eval-batches gives the same figure).
  if (!opts_.model.init_from.empty() && setup_.resume_path.empty()) {
    start_val_ = validation_loss(run_model_.model(), val_, B_, T_, opts_.data.eval_batches, grid_);
    if (root_ && opts_.progress) print_init_from_loss(opts_.model.init_from, start_val_);
  }
  t_start_ = now_seconds();
  bool stopped_early = false;
  for (int step = step0_; step < budget_.total_steps(); ++step) {
    const StepOutcome s = this->step(step);
    // --time-budget: after the warm-up the step count is chosen, and with it the schedule's end.
    if (budget_.after_step(step, s.seconds, grid_.world)) optim_.adamw->set_total_steps(budget_.total_steps());
    res_.losses.push_back(s.loss.total);
    res_.last_stages = s.fig.stages;
    profile_.add(s.moe_times, s.pipe.compute_s, s.optimizer_s, s.sync_s, s.seconds, s.fig.a2a_by_rank[grid_.world.rank()]);
    const bool last = step + 1 == budget_.total_steps();
    double vl = NAN;
    if (last || (opts_.data.eval_every > 0 && (step + 1) % opts_.data.eval_every == 0)) {
      vl = validation_loss(run_model_.model(), val_, B_, T_, opts_.data.eval_batches, grid_);
      res_.val_losses.emplace_back(step + 1, vl);
    }
    // Metrics go out before the checkpoint: a step whose checkpoint exists has its line.
    log(step, s, vl);
    // Checkpoint every N steps, at the end, and when a scheduler asks us to stop (SIGTERM/SIGINT
    // on any rank: all ranks agree, finish this step, save, and exit cleanly).
    int64_t stop = g_stop_requested ? 1 : 0;
    if (grid_.world.size() > 1) grid_.world.allreduce_max(&stop, 1);
    // No checkpoint during a streak of non-finite steps: the last good one stays the newest.
    bool save = bad_steps_.in_a_row() == 0 &&
                (last || stop || (opts_.checkpoint.every > 0 && (step + 1) % opts_.checkpoint.every == 0));
    // A checkpoint is only ever called good when its tensors are: a finite loss and gradient can
    // still overflow in the update.
    if (save && !state_finite()) {
      save = false;
      if (root_)
        std::fprintf(stderr, "%sstep %d: weights or AdamW state not finite after the update: no checkpoint "
                             "written; the last good one is %s\n",
                     tty_ ? "\n" : "", step + 1,
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
  res_.bad_steps = bad_steps_.total();
  // A run that never updated the weights did not train: say so and fail, whatever the reason.
  if (steps_run_ > 0 && good_steps_ == 0)
    throw SetupError(str_cat("every step of this run was skipped (", bad_steps_.this_process(),
                             " non-finite loss or gradient): nothing trained, no weights written; the last good "
                             "checkpoint is ",
                             checkpointer_->last_or_none()),
                     root_);
  if (stopped_early) return;
  if (!state_finite())
    throw SetupError(str_cat("the final weights are not finite: no weights written; the last good checkpoint is ",
                             checkpointer_->last_or_none()),
                     root_);
  const int ran = std::max(1, budget_.total_steps() - step0_);
  res_.tokens_per_s = static_cast<double>(B_global_) * T_ * ran / res_.seconds;
  res_.mfu = peak_.mfu(flops_per_step_ * ran, res_.seconds, grid_.world.size());
  if (profile_.on() && root_) profile_.print();
  if (root_) model::save_config(cfg_, opts_.out_dir + "/config.json");
  checkpointer_->write_weights(run_model_.model(), layers_per_stage_, balance_.score_bias().to_json(),
                               opts_.out_dir + "/model.safetensors");
  if (opts_.progress && root_)
    print_done(opts_, budget_.total_steps(), res_.seconds, budget_.train_s(), res_, tokenized_, bytes_per_token_);
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
