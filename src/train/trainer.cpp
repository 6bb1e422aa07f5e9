#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

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
#include "train/migration.h"
#include "train/run_guard.h"
#include "train/run_memory.h"
#include "train/score_bias.h"

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
}

void validate_options(const TrainOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  MOE_CHECK(o.steps > 0, "--steps must be positive, got ", o.steps);
  MOE_CHECK(o.data.batch > 0, "--batch must be positive, got ", o.data.batch);
  MOE_CHECK(o.data.seq_len > 1, "--seq-len must be at least 2, got ", o.data.seq_len);
  MOE_CHECK(o.device.threads > 0 && o.device.threads <= 1024, "--threads must be in [1, 1024], got ", o.device.threads);
  MOE_CHECK(o.model.vocab_size >= 0 && o.model.vocab_size <= (1 << 24), "--vocab-size must be in [1, 2^24] (0 = the model's), got ",
            o.model.vocab_size);
  MOE_CHECK(o.data.eval_batches > 0, "--eval-batches must be positive, got ", o.data.eval_batches);
  MOE_CHECK(o.data.eval_every >= 0, "--eval-every must be >= 0 (0 = only at the end), got ", o.data.eval_every);
  const OptimConfig& c = o.optim;
  MOE_CHECK(finite(c.lr) && c.lr > 0 && c.lr <= 1, "--lr must be a number in (0, 1], got ", c.lr);
  MOE_CHECK(finite(c.min_lr) && c.min_lr >= 0, "--min-lr must be a number >= 0, got ", c.min_lr);
  MOE_CHECK(c.min_lr <= c.lr, "--min-lr ", c.min_lr, " is above --lr ", c.lr,
            " (the cosine schedule decays from --lr to --min-lr)");
  MOE_CHECK(c.warmup_steps >= 0, "--warmup must be >= 0, got ", c.warmup_steps);
  MOE_CHECK(finite(c.weight_decay) && c.weight_decay >= 0, "--weight-decay must be a number >= 0, got ",
            c.weight_decay);
  // Decoupled decay multiplies each weight by 1 - lr·wd: at lr·wd >= 1 it zeroes or flips them.
  MOE_CHECK(static_cast<double>(c.lr) * c.weight_decay < 1, "--weight-decay ", c.weight_decay, " with --lr ",
            c.lr, ": lr * weight decay = ", static_cast<double>(c.lr) * c.weight_decay,
            " >= 1 would zero or flip the weights every step");
  MOE_CHECK(finite(c.grad_clip) && c.grad_clip >= 0, "--grad-clip must be a number >= 0 (0 = off), got ",
            c.grad_clip);
  MOE_CHECK(finite(o.model.moe.capacity_factor) && o.model.moe.capacity_factor >= 0,
            "--capacity-factor must be >= 0 (0 = dropless), got ", o.model.moe.capacity_factor);
  MOE_CHECK(o.parallel.micro_batches >= 1, "--micro-batches must be >= 1, got ", o.parallel.micro_batches);
  MOE_CHECK(o.data.batch % o.parallel.micro_batches == 0, "--batch ", o.data.batch, " is not divisible by --micro-batches ",
            o.parallel.micro_batches);
  MOE_CHECK(o.checkpoint.keep >= 0, "--checkpoint.keep must be >= 0, got ", o.checkpoint.keep);
  MOE_CHECK(o.checkpoint.every >= 0, "--checkpoint.every must be >= 0, got ", o.checkpoint.every);
  MOE_CHECK(o.faults.max_bad_steps >= 1, "--max-bad-steps must be >= 1, got ", o.faults.max_bad_steps);
  for (int s : o.faults.nan_steps) MOE_CHECK(s >= 1, "--fault.nan-steps: steps count from 1, got ", s);
  for (int s : o.faults.inf_weight_steps) MOE_CHECK(s >= 1, "--fault.inf-weight-steps: steps count from 1, got ", s);
  parse_device(o.device.name, "--device");
  MOE_CHECK(o.device.precision == "fp32" || o.device.precision == "bf16", "--precision: expected fp32 or bf16, got '",
            o.device.precision, "'");
  MOE_CHECK(o.device.precision == "fp32" || o.device.name == "cuda" || kernels::bf16_cpu_available(),
            "--precision bf16 --device cpu: ", kernels::bf16_cpu_unavailable_reason());
  MOE_CHECK(o.balance.migrate_every >= 0, "--balance.migrate-every must be >= 0 (0 = never), got ", o.balance.migrate_every);
  MOE_CHECK(finite(o.balance.threshold) && o.balance.threshold > 1, "--balance.threshold must be a max/mean "
            "rank load > 1 (1 is perfect balance), got ", o.balance.threshold);
  MOE_CHECK(o.balance.migrate_every == 0 || !o.parallel.zero1, "--balance.migrate-every with --zero1: moving experts with a "
            "sharded AdamW state is not supported; use one of them");
  MOE_CHECK(o.balance.migrate_every == 0 || !o.model.moe.padded, "--balance.migrate-every with --padded: migration needs "
            "the padding-free layout");
  MOE_CHECK(finite(o.faults.comm_timeout_s) && o.faults.comm_timeout_s >= 0 && o.faults.comm_timeout_s < 1e9,
            "--comm.timeout must be a number of seconds >= 0 (0 = wait forever), got ", o.faults.comm_timeout_s);
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

// The MoE layers' step times in seconds, by step name (the metrics' time_s.moe).
json moe_times_json(const mixture::MoeStepTimes& t) {
  json j;
  for (const auto& [name, ms] : mixture::moe_step_times_ms(t)) j[name] = ms * 1e-3;
  return j;
}

// --profile's summary on stderr (rank 0's view): the steps' seconds split into the MoE layers'
// steps, the rest of forward + backward (attention, dense GEMMs, norms, embedding, loss), the
// gradient sync and the optimizer.
void print_profile(const mixture::MoeStepTimes& moe, double compute, double opt, double sync,
                   double steps) {
  const double moe_s = moe.forward() + moe.backward();
  auto line = [&](const char* name, double s) {
    std::fprintf(stderr, "  %-22s %9.3f s %6.1f%%\n", name, s, steps > 0 ? 100.0 * s / steps : 0.0);
  };
  std::fprintf(stderr, "profile (rank 0, all steps): %.3f s\n", steps);
  line("MoE layers", moe_s);
  for (const auto& [name, ms] : mixture::moe_step_times_ms(moe)) line(("  " + name).c_str(), ms * 1e-3);
  line("  expert GEMMs", moe.expert_parts.gemm());
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

// The model's parameters and AdamW moments where host code (checkpoint files, weight files) can
// read and write them: the buffers themselves on the CPU, host copies of a GPU's (copy = true
// fills them from the device; to_device() writes them back after a load).
class HostState {
 public:
  // --zero1: m and v are this rank's slices; here they are full logical tensors on the host
  // (copy = true gathers them from every rank: a collective; to_device() keeps this rank's slice).
  HostState(model::Model& model, AdamW& opt, bool copy, const parallel::ZeroShard& shard)
      : device_(model.device()), shard_(&shard) {
    if (shard.sharded()) {
      p_ = model.params();
      if (device_ != Device::kCpu) {
        hp_.resize(model.num_params());
        if (copy) device_copy(Device::kCpu, hp_.data(), device_, model.params(), hp_.size() * sizeof(float));
        p_ = hp_.data();
      }
      for (auto [buf, src] : {std::pair{&hm_, opt.m().data()}, {&hv_, opt.v().data()}}) {
        buf->resize(model.num_params());
        if (copy) shard.gather_full(src, device_, buf->data());
      }
      m_ = hm_.data();
      v_ = hv_.data();
      return;
    }
    if (device_ == Device::kCpu) {
      p_ = model.params();
      m_ = opt.m().data();
      v_ = opt.v().data();
      return;
    }
    for (auto [buf, src] : {std::pair{&hp_, model.params()}, {&hm_, opt.m().data()}, {&hv_, opt.v().data()}}) {
      buf->resize(model.num_params());
      if (copy) device_copy(Device::kCpu, buf->data(), device_, src, buf->size() * sizeof(float));
    }
    p_ = hp_.data();
    m_ = hm_.data();
    v_ = hv_.data();
  }
  float* params() { return p_; }
  float* m() { return m_; }
  float* v() { return v_; }
  void to_device(model::Model& model, AdamW& opt) {
    if (shard_->sharded()) {
      if (device_ != Device::kCpu)
        device_copy(device_, model.params(), Device::kCpu, hp_.data(), hp_.size() * sizeof(float));
      shard_->take_slice(hm_.data(), opt.m().data(), device_);
      shard_->take_slice(hv_.data(), opt.v().data(), device_);
      return;
    }
    if (device_ == Device::kCpu) return;
    for (auto [dst, src] : {std::pair{model.params(), &hp_}, {opt.m().data(), &hm_}, {opt.v().data(), &hv_}})
      device_copy(device_, dst, Device::kCpu, src->data(), src->size() * sizeof(float));
  }

 private:
  Device device_;
  const parallel::ZeroShard* shard_;
  std::vector<float> hp_, hm_, hv_;
  float* p_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;
};

// The parameters alone, read-only, on the host (see HostState).
class HostParams {
 public:
  explicit HostParams(const model::Model& model) : n_(model.num_params()) {
    if (model.device() == Device::kCpu) {
      p_ = model.params();
      return;
    }
    host_.resize(n_);
    device_copy(Device::kCpu, host_.data(), model.device(), model.params(), n_ * sizeof(float));
    p_ = host_.data();
  }
  const float* params() const { return p_; }
  size_t num_params() const { return n_; }

 private:
  size_t n_;
  std::vector<float> host_;
  const float* p_ = nullptr;
};

// x[0] = value on x's device (the fault-injection hooks).
void set_first(float* x, float value) {
  device_copy(kernels::active_device(), x, Device::kCpu, &value, sizeof(float));
}

// Writes every parameter with its Hugging Face name into one file on world rank 0, which gathers
// from the ranks of data-parallel index 0: every stage's tensors, and every EP rank's experts
// (together they hold each parameter exactly once).
void save_full_weights(const model::Model& model, const model::ModelConfig& cfg,
                       const parallel::Grid& g, const std::vector<int>& layers_per_stage,
                       const std::string& path) {
  if (g.me.dp != 0) return;
  const HostParams m(model);
  // Tensor parallelism: the TP group puts its slices together; its first rank goes on.
  const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg);
  std::vector<float> gathered;
  const float* params = m.params();
  if (g.dims.tp > 1) {
    gathered.resize(unsplit.total());
    parallel::tp_gather(model.layout(), m.params(), unsplit, gathered.data(), g.tp);
    params = gathered.data();
  }
  if (g.me.tp != 0) return;
  // What rank (pp, ep) contributes: everything on ep 0, only its experts on the others.
  auto owned = [](const model::ParamSpec& s, int ep_rank) { return ep_rank == 0 || s.is_expert; };
  if (g.world.rank() != 0) {
    std::vector<float> mine;
    for (const model::ParamSpec& s : unsplit.specs())
      if (owned(s, g.me.ep)) mine.insert(mine.end(), params + s.offset, params + s.offset + s.numel);
    g.world.send(mine.data(), static_cast<int64_t>(mine.size()), 0, /*tag=*/71);
    return;
  }
  model::ParamLayout full(cfg);
  std::vector<float> all(full.total());
  for (int pp = 0; pp < g.dims.pp; ++pp) {
    for (int ep = 0; ep < g.dims.ep; ++ep) {
      const int src = parallel::rank_of(g.dims, {pp, 0, ep, 0});
      model::ExpertShard shard = g.dims.ep > 1 ? model::ExpertShard::of(model.placement(), ep) : model::ExpertShard{};
      model::ParamLayout theirs(cfg, shard, parallel::stage_spec(layers_per_stage, pp));
      std::vector<float> buf;
      if (src == 0) {
        buf.assign(params, params + unsplit.total());
      } else {
        size_t n = 0;
        for (const model::ParamSpec& s : theirs.specs()) n += owned(s, ep) ? s.numel : 0;
        buf.resize(n);
        g.world.recv(buf.data(), static_cast<int64_t>(n), src, /*tag=*/71);
      }
      size_t pos = 0;
      for (const model::ParamSpec& s : theirs.specs()) {
        if (!owned(s, ep)) continue;
        const size_t from = src == 0 ? s.offset : pos;
        std::memcpy(all.data() + full.find(s.name).offset, buf.data() + from, s.numel * sizeof(float));
        pos += s.numel;
      }
    }
  }
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const model::ParamSpec& s : full.specs()) w.add_f32(s.name, s.shape, all.data() + s.offset);
  w.write(path);
}

// The expert placement a resume restores: the checkpoint's, when it was written by an EP group of
// this size (another size reshards from the contiguous placement: none). Errors name the field.
std::optional<balance::Placement> restored_placement(const CheckpointMeta& meta, const model::ModelConfig& cfg,
                                                     int ep, const std::string& path) {
  const json& p = meta.parallel;
  const bool same_ep = p.is_object() && p.contains("ep") && p["ep"].is_number_integer() && p["ep"] == ep;
  if (ep <= 1 || !same_ep || meta.expert_placement.empty()) return std::nullopt;
  std::vector<bool> is_moe(cfg.num_hidden_layers);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) is_moe[l] = cfg.is_moe_layer(l);
  return balance::Placement::from_json(meta.expert_placement, is_moe, cfg.n_routed_experts, ep,
                                       path + "/manifest.json: field \"expert_placement\"");
}

// Per-stage figures of a step: the worst rank of each stage (collective over the world).
std::vector<StageStats> gather_stage_stats(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                           double a2a_seconds, model::Model& model) {
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
  for (int r = 0; r < grid.world.size(); ++r) {
    StageStats& st = stages[parallel::coords_of(grid.dims, r).pp];
    const double* v = everyone.data() + static_cast<size_t>(r) * kStat;
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
  json rank_loads = json::array();
  std::vector<double> imbalance;
  json migration;
};

// Expert parallelism, after the update: the step's global loads (every MoE layer's, the same on
// every rank) give each layer's EP-rank loads; every --balance.migrate-every steps, the layers above
// the threshold migrate (train/migration.h), the same on every rank. Not after the last step
// (nothing would run on the new map) nor after a skipped one. Collective over the world.
StepBalance balance_step(model::Model& model, const TrainOptions& opts, const parallel::Grid& grid,
                         const std::vector<int>& moe_layer_ids, const std::vector<int64_t>& flat_loads, int step,
                         bool skipped, const std::vector<float*>& moving, bool report, bool tty) {
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
  if (opts.balance.migrate_every == 0 || skipped || (step + 1) % opts.balance.migrate_every != 0 || step + 1 >= opts.steps)
    return out;
  const double t0 = now_seconds();
  std::vector<LayerMigration> changed;
  const balance::Placement next = plan_migration(model.placement(), moe_layer_ids, loads, opts.balance.threshold, &changed);
  if (changed.empty()) return out;
  double moved = move_experts(model, next, grid.ep, moving);
  double seconds = now_seconds() - t0;
  grid.world.allreduce_sum(&moved, 1);
  grid.world.allreduce_max(&seconds, 1);
  json layers = json::array();
  for (const LayerMigration& lm : changed)
    layers.push_back({{"layer", lm.layer}, {"swaps", lm.swaps}, {"imbalance_before", lm.imbalance_before},
                      {"imbalance_after", lm.imbalance_after}});
  out.migration = {{"layers", layers}, {"bytes_moved", moved}, {"seconds", seconds}};
  if (report)
    for (const LayerMigration& lm : changed)
      std::fprintf(stderr, "%sstep %d: layer %d migrated %d expert swap(s), rank imbalance %.3f -> %.3f "
                   "(%s moved in %.1f ms, all layers)\n", tty ? "\n" : "", step + 1, lm.layer, lm.swaps,
                   lm.imbalance_before, lm.imbalance_after, format_bytes(moved).c_str(), 1e3 * seconds);
  return out;
}

}  // namespace

TrainResult run_training(const TrainOptions& opts) {
  MOE_CHECK(comm::MpiRuntime::initialized(), "run_training needs MPI initialised (comm::MpiRuntime)");

  // Setup: everything that bad input can break, checked on every rank, then agreed on. Nothing
  // large is allocated and no output is touched before the memory estimate and the folder locks.
  comm::Group world = comm::Group::world();
  std::optional<comm::CommTimeout> comm_timeout;
  if (world.size() > 1 && std::isfinite(opts.faults.comm_timeout_s) && opts.faults.comm_timeout_s > 0 &&
      opts.faults.comm_timeout_s < 1e9)
    comm_timeout.emplace(opts.faults.comm_timeout_s, &g_stop_requested);
  // Which ranks share this host (their memory adds up): a hash of each rank's host name.
  std::vector<double> host_of(world.size(), 0.0);
  {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const double mine = static_cast<double>(std::hash<std::string>{}(host) >> 12);  // exact in a double
    if (world.size() > 1)
      world.allgather(&mine, host_of.data(), 1);
    else
      host_of[0] = mine;
  }
  model::ModelConfig cfg;
  std::unique_ptr<io::Corpus> corpus;  // byte-level text or an indexed dataset (io/corpus.h)
  std::ofstream metrics;
  DirLock out_lock, ckpt_lock;
  const bool root = world.rank() == 0;
  std::string setup_error, ckpt_dir, resume_path;
  comm::A2aAlgorithm algo = comm::A2aAlgorithm::kFlat;
  try {
    validate_options(opts);
    algo = comm::parse_a2a_algorithm(opts.parallel.a2a);
    comm::parse_comm_backend(opts.device.comm_backend, "--comm.backend");
    parallel::parse_schedule(opts.parallel.schedule);
    model::parse_recompute(opts.model.recompute);
    comm::Topology::detect(world.size(), opts.parallel.topo_ranks_per_node, opts.parallel.topo_nodes_per_group);
    // The device: usable here (a CUDA build and a GPU), and a layout the GPU path has.
    const Device device = parse_device(opts.device.name, "--device");
    require_device(device, "--device");
    MOE_CHECK(device == Device::kCpu || !opts.model.moe.padded,
              "--padded: the capacity-padded baseline runs on the CPU only (--device cpu)");
    cfg = opts.model.config_path.empty() ? model::preset(opts.model.preset) : model::load_config(opts.model.config_path);
    MOE_CHECK(opts.data.seq_len <= cfg.max_position_embeddings, "--seq-len ", opts.data.seq_len,
              " exceeds the model's max_position_embeddings ", cfg.max_position_embeddings);
    if (opts.model.vocab_size > 0) cfg.vocab_size = opts.model.vocab_size;  // --vocab-size: a tokenized dataset's
    static_cast<void>(ScoreBias(cfg, opts.balance.bias_rate));  // --balance.bias-rate against the model, before any output
    const std::string data_path = opts.data.path.empty() ? default_corpus_path() : opts.data.path;
    const bool indexed = io::is_indexed_dataset(data_path);
    // Byte-level text needs the 256 byte ids; an indexed dataset's ids are checked when it loads.
    MOE_CHECK(indexed || cfg.vocab_size >= 256, "byte-level data needs vocab_size >= 256, the config has ",
              cfg.vocab_size);
    opts.parallel.dims.validate(world.size(), cfg);
    if (opts.parallel.dims.tp > 1) {
      // Each TP rank takes n = batch·seq_len/tp rows of every micro-batch (model.h: TensorParallel).
      MOE_CHECK(opts.data.seq_len % opts.parallel.dims.tp == 0, "--tp ", opts.parallel.dims.tp, " does not divide --seq-len ",
                opts.data.seq_len);
      MOE_CHECK(!(cfg.seq_aux && cfg.aux_loss_alpha > 0 && cfg.num_moe_layers() > 0) ||
                    (opts.data.batch / opts.parallel.micro_batches) % opts.parallel.dims.tp == 0,
                "--tp ", opts.parallel.dims.tp, " with seq_aux: the micro-batch of ", opts.data.batch / opts.parallel.micro_batches,
                " sequences per rank must split into whole sequences per TP rank");
      MOE_CHECK(opts.balance.migrate_every == 0, "--balance.migrate-every with --tp ", opts.parallel.dims.tp,
                ": expert migration under tensor parallelism is not supported yet; use --tp 1");
    }
    MOE_CHECK(opts.balance.migrate_every == 0 || opts.parallel.dims.ep > 1, "--balance.migrate-every ", opts.balance.migrate_every,
              " needs expert parallelism (--ep > 1): with --ep ", opts.parallel.dims.ep, " every expert is on every rank");
    parallel::split_layers(cfg, opts.parallel.dims.pp, opts.parallel.pp_layers);
    if (opts.data.path.empty() && !fs::exists(data_path))
      throw Error(str_cat(data_path, ": built-in corpus not found; run scripts/setup.sh first"));
    // A FIFO would block the open, a device never ends: only a regular file, checked by stat.
    if (indexed) {
      check_regular_input(io::idx_path(io::indexed_prefix(data_path)), "--data");
      check_regular_input(io::bin_path(io::indexed_prefix(data_path)), "--data");
    } else {
      check_regular_input(data_path, "--data");
    }
    {
      // Memory: every rank on this host, before anything of that size is allocated.
      const double corpus_bytes = io::corpus_resident_bytes(data_path);  // mmapped data: its tables only
      const std::vector<RankMemory> need = estimate_run_memory(cfg, opts, world.size(), corpus_bytes);
      std::vector<int> here;
      for (int r = 0; r < world.size(); ++r)
        if (host_of[r] == host_of[world.rank()]) here.push_back(r);
      check_memory_fits(need, here, available_memory(), opts);
      if (device == Device::kCuda) {
        // The model's state and activations live on the GPU: they must fit in what it has free.
        size_t free_b = 0, total_b = 0;
        cuda_mem_info(&free_b, &total_b);
        const double gpu_need = need[world.rank()].state + need[world.rank()].activations;
        MOE_CHECK(gpu_need <= static_cast<double>(free_b), "not enough GPU memory: this run needs ",
                  format_bytes(gpu_need), " (", static_cast<uint64_t>(gpu_need), " bytes: ",
                  format_bytes(need[world.rank()].state), " weights, gradients and AdamW state, ",
                  format_bytes(need[world.rank()].activations), " activations and workspace) on the GPU, ",
                  format_bytes(static_cast<double>(free_b)), " (", free_b, " bytes) free of ",
                  format_bytes(static_cast<double>(total_b)), "; use a smaller --batch or --seq-len, ",
                  "more --micro-batches or --recompute");
      }
    }
    corpus = io::open_corpus(data_path, cfg.vocab_size);
    // Both splits must hold a window (the checks name the file and the sizes).
    const int n_data = opts.parallel.dims.dp * opts.parallel.dims.ep;
    corpus->val_batches(opts.data.batch * n_data, opts.data.seq_len, 1);
    {
      Rng probe(0);
      std::vector<int32_t> one(static_cast<size_t>(opts.data.seq_len) + 1);
      corpus->sample_batch(one.data(), 1, opts.data.seq_len, probe, io::Split::kTrain);
    }
    ckpt_dir = opts.checkpoint.dir.empty() ? opts.out_dir + "/checkpoints" : opts.checkpoint.dir;
    if (root) {
      // Outputs: writable now, not after the last step; one run per folder (the lock is held
      // until this process ends; its file names the holder for a second run).
      const std::string what = str_cat("moetrain train --out ", opts.out_dir, " (", world.size(), " rank(s))");
      check_output_dir(opts.out_dir, "--out");
      out_lock = DirLock::acquire(opts.out_dir, "--out", what);
      for (const char* f : {"model.safetensors", "config.json", "metrics.jsonl"}) {
        const fs::path p = fs::path(opts.out_dir) / f;
        std::error_code ec;
        MOE_CHECK(!fs::exists(p, ec) || fs::is_regular_file(p, ec), p.string(),
                  ": exists and is not a regular file; the run could not write its results there");
      }
      check_output_dir(ckpt_dir, opts.checkpoint.dir.empty() ? "--out (its checkpoints folder)" : "--checkpoint.dir");
      std::error_code ec;
      if (!fs::equivalent(ckpt_dir, opts.out_dir, ec))
        ckpt_lock = DirLock::acquire(ckpt_dir, opts.checkpoint.dir.empty() ? "--out (its checkpoints folder)"
                                                                            : "--checkpoint.dir", what);
    }
    if (!opts.checkpoint.resume.empty()) {
      resume_path = opts.checkpoint.resume == "latest" ? find_latest_checkpoint(ckpt_dir) : opts.checkpoint.resume;
      MOE_CHECK(!resume_path.empty(), ckpt_dir, ": --resume latest found no complete checkpoint");
      CheckpointMeta meta = read_checkpoint_meta(resume_path, /*verify=*/true);
      const json want = model::config_to_json(cfg);
      for (const auto& [key, value] : want.items())
        MOE_CHECK(meta.config.contains(key) && meta.config[key] == value, resume_path,
                  ": checkpoint was written for a different model (", key, " = ",
                  meta.config.contains(key) ? meta.config[key].dump() : "missing", ", this run: ",
                  value.dump(), ")");
      MOE_CHECK(meta.step <= opts.steps, resume_path, ": checkpoint is at step ", meta.step,
                ", beyond --steps ", opts.steps);
      static_cast<void>(restored_placement(meta, cfg, opts.parallel.dims.ep, resume_path));  // checked before any output
    }
  } catch (const std::bad_alloc&) {
    setup_error = "out of memory during setup (std::bad_alloc): the memory estimate fitted, the machine did not";
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  // Agreement: the lowest failing rank reports; every rank stops.
  auto agree = [&world](const std::string& error) {
    if (world.size() > 1) {
      int64_t flag = error.empty() ? 0 : world.size() - world.rank();
      world.allreduce_max(&flag, 1);
      if (flag > 0) {
        const int reporter = world.size() - static_cast<int>(flag);
        throw SetupError(error.empty() ? "another rank failed during setup" : error, world.rank() == reporter);
      }
    } else if (!error.empty()) {
      throw SetupError(error, true);
    }
  };
  agree(setup_error);
  // Every check passed: only now is metrics.jsonl touched, so a run refused in setup leaves an
  // earlier run's file as it was. A resumed run appends to the run it continues; a fresh one
  // keeps the earlier file as metrics.jsonl.prev.
  if (root) {
    try {
      const std::string metrics_path = opts.out_dir + "/metrics.jsonl";
      std::error_code ec;
      if (opts.checkpoint.resume.empty() && fs::exists(metrics_path, ec) && fs::file_size(metrics_path, ec) > 0) {
        fs::rename(metrics_path, metrics_path + ".prev", ec);
        MOE_CHECK(!ec, metrics_path, ": cannot keep the earlier run's metrics as ", metrics_path, ".prev (",
                  ec.message(), ")");
        if (opts.progress)
          std::fprintf(stderr, "moetrain: %s holds an earlier run's metrics: kept as metrics.jsonl.prev\n",
                       opts.out_dir.c_str());
      }
      metrics.open(metrics_path, opts.checkpoint.resume.empty() ? std::ios::trunc : std::ios::app);
      MOE_CHECK(metrics.good(), metrics_path, ": cannot open for writing");
    } catch (const std::exception& e) {
      setup_error = e.what();
    }
  }
  agree(setup_error);

  parallel::Grid grid =
      parallel::make_grid(opts.parallel.dims, cfg, opts.parallel.topo_ranks_per_node, opts.parallel.topo_nodes_per_group);
  const int D = grid.data_size(), M = opts.parallel.micro_batches;
  const int B = opts.data.batch, T = opts.data.seq_len, B_global = B * D, Bm = B / M;
  const std::vector<int> layers_per_stage = parallel::split_layers(cfg, opts.parallel.dims.pp, opts.parallel.pp_layers);
  const model::StageSpec stage = parallel::stage_spec(layers_per_stage, grid.me.pp);
  const parallel::Schedule schedule = parallel::parse_schedule(opts.parallel.schedule);
  std::vector<int32_t> val = corpus->val_batches(B_global, T, opts.data.eval_batches);

  kernels::set_blas_threads(opts.device.threads);
  const Device device = parse_device(opts.device.name, "--device");
  const int gpu = select_device(device, grid.topo.local_rank(grid.world.rank()));
  kernels::set_active_device(device);  // every buffer and kernel of the model from here on
  // The transport of device buffers: NCCL when every rank has its own GPU, else MPI with host
  // staging. Decided from every rank's (host, GPU), so all ranks agree.
  comm::CommBackend backend = comm::CommBackend::kMpi;
  std::string backend_why = "one rank";
  if (grid.world.size() > 1) {
    std::vector<double> gpus(grid.world.size());
    const double mine = gpu;
    grid.world.allgather(&mine, gpus.data(), 1);
    std::vector<std::pair<double, int>> gpu_of_rank(grid.world.size());
    for (int r = 0; r < grid.world.size(); ++r)
      gpu_of_rank[r] = {host_of[r], static_cast<int>(gpus[r])};
    backend = comm::choose_comm_backend(comm::parse_comm_backend(opts.device.comm_backend, "--comm.backend"),
                                        gpu_of_rank, device == Device::kCuda && comm::nccl_loadable(),
                                        &backend_why);
    if (backend == comm::CommBackend::kNccl)
      for (comm::Group* g : {&grid.ep, &grid.dp, &grid.data, &grid.pp, &grid.tp, &grid.tokens})
        if (g->valid() && g->size() > 1) g->enable_nccl();
  }
  kernels::set_gemm_bf16(opts.device.precision == "bf16");
  struct CpuAgain {  // later work in this process (tests run several trainings) starts on the CPU
    ~CpuAgain() {
      kernels::set_gemm_bf16(false);
      kernels::set_active_device(Device::kCpu);
    }
  } cpu_again;
  TrainResult res;
  // The MFU denominator: the same run's dense GEMM rate on the device in the run's precision
  // (on the CPU the best of several sgemm runs, kernels/peak_rate.h: the fp32 peak).
  std::string peak_precision = opts.device.precision;
#ifdef MOETRAIN_HAVE_CUDA
  if (device == Device::kCuda)
    res.peak_gflops = kernels::cuda::measure_gemm_gflops(4096, 3, opts.device.precision == "bf16");
  else
#endif
    res.peak_gflops = kernels::measure_peak_gflops(peak_precision);

  comm::TrafficStats traffic;
  comm::TokenExchange exchange(grid.ep, grid.topo, algo, &traffic);
  mixture::ExpertParallel ep_ctx;
  ep_ctx.exchange = grid.dims.ep > 1 ? &exchange : nullptr;
  ep_ctx.rank = grid.me.ep;
  ep_ctx.size = grid.dims.ep;
  ep_ctx.reduce_aux_stats = [&grid](std::vector<double>& v) {
    grid.tokens.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  };
  // Experts that may move are summed in logical order (train/migration.h): the math stays the same.
  ep_ctx.placement_independent_sum = opts.balance.migrate_every > 0;
  const model::TensorParallel tp_ctx{&grid.tp, grid.me.tp, grid.dims.tp};
  model::Model model(cfg, opts.model.moe, D > 1 || grid.dims.tp > 1 ? &ep_ctx : nullptr, stage,
                     model::parse_recompute(opts.model.recompute), &tp_ctx);
  // noaux_tc: every MoE layer's selection bias, the same on every rank (train/score_bias.h).
  ScoreBias score_bias(cfg, opts.balance.bias_rate);
  // The exchange's staging rows (send/receive buffers, RBD pools, HALO rails) are workspace of
  // this rank like backward's temporaries: charged, so the measured peak includes them.
  exchange.set_staging_tracker(&model.work_memory());
  model.init_weights(opts.data.seed);
  OptimConfig oc = opts.optim;
  oc.total_steps = opts.steps;
  // --zero1: this rank keeps and updates only its slice of the AdamW state (parallel/zero1.h).
  const parallel::ZeroShard shard = opts.parallel.zero1 ? parallel::ZeroShard::split(model.layout(), grid)
                                               : parallel::ZeroShard::whole(model.layout());
  AdamW opt(model.layout(), oc, shard.ranges(), &model.total_memory());
  opt.set_norm_reducer([&grid, &shard](double replicated, double experts, double split) {
    if (shard.sharded()) {
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
  // AdamW state bytes of every world rank (metrics.jsonl "optimizer_bytes"; --zero1 divides them).
  std::vector<double> optimizer_bytes(grid.world.size());
  {
    const double mine = static_cast<double>((opt.m().size() + opt.v().size()) * sizeof(float));
    grid.world.allgather(&mine, optimizer_bytes.data(), 1);
  }
  MemTracker pipe_mem(&model.total_memory());
  Rng data_rng = derive_rng(opts.data.seed, /*stream=*/1);
  // Which rank writes each logical tensor (each exactly once): data-parallel index 0, and for
  // tensors replicated over the EP group, its first rank.
  const parallel::RankCoords me = grid.me;
  auto owned = [me](const model::ParamSpec& s) { return me.dp == 0 && me.tp == 0 && (me.ep == 0 || s.is_expert); };
  json parallel_json = {{"pp", grid.dims.pp}, {"dp", grid.dims.dp}, {"ep", grid.dims.ep},
                        {"tp", grid.dims.tp}, {"layers_per_stage", layers_per_stage},
                        {"micro_batches", M}, {"a2a", opts.parallel.a2a}, {"batch_per_rank", B}};
  int step0 = 0, bad_steps = 0, bad_in_a_row = 0, good_steps = 0, steps_run = 0, bad_steps_at_start = 0;
  std::string last_checkpoint;
  // Whether weights and AdamW moments are finite on every rank (a collective).
  auto state_finite = [&]() {
    // A sum of squares in double is finite exactly when every element is (|x| <= 3.4e38 squares to
    // at most 1.2e77): one reduction on the state's own device, no host copy of a GPU's weights.
    auto finite = [](const float* p, size_t n) { return std::isfinite(kernels::sum_squares(p, n)); };
    int64_t bad = finite(model.params(), model.num_params()) && finite(opt.m().data(), opt.m().size()) &&
                          finite(opt.v().data(), opt.v().size())
                      ? 0
                      : 1;
    if (grid.world.size() > 1) grid.world.allreduce_max(&bad, 1);
    return bad == 0;
  };
  bool stopped_early = false;
  if (!resume_path.empty()) {
    CheckpointMeta meta = read_checkpoint_meta(resume_path, /*verify=*/false);  // verified in setup
    {
      // The experts' places first (the tensors are loaded by name into them): kept when the EP
      // group has the size that wrote them; a reshard starts from the contiguous placement.
      if (std::optional<balance::Placement> p = restored_placement(meta, cfg, grid.dims.ep, resume_path)) {
        model.set_placement(*p);
        // A moved placement keeps summing in logical order, as the run that moved it did.
        if (!model.placement().is_contiguous()) ep_ctx.placement_independent_sum = true;
      }
      HostState h(model, opt, /*copy=*/false, shard);
      if (grid.dims.tp > 1) {
        // The checkpoint holds logical tensors: each TP rank keeps its slices of them.
        const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg);
        std::vector<float> p(unsplit.total()), m(unsplit.total()), v(unsplit.total());
        load_checkpoint_tensors(resume_path, unsplit, p.data(), m.data(), v.data());
        parallel::tp_slice(unsplit, p.data(), model.layout(), h.params());
        parallel::tp_slice(unsplit, m.data(), model.layout(), h.m());
        parallel::tp_slice(unsplit, v.data(), model.layout(), h.v());
      } else {
        load_checkpoint_tensors(resume_path, model.layout(), h.params(), h.m(), h.v());
      }
      h.to_device(model, opt);
    }
    score_bias.load_json(meta.router_bias, resume_path + "/manifest.json: field \"router_bias\"");
    step0 = meta.step;
    bad_steps = meta.bad_steps;
    bad_steps_at_start = bad_steps;
    data_rng.set_state(meta.data_rng_state);
    last_checkpoint = resume_path;
    if (root && opts.progress)
      std::fprintf(stderr, "resumed from %s at step %d\n", resume_path.c_str(), step0);
  }
  score_bias.apply(model);
  // The global batch is [M][D][Bm] sequences: micro-batch m of data rank d is one block, so the
  // m-th micro-batches of all data ranks form the m-th micro-batch of one process.
  std::vector<int32_t> tokens(static_cast<size_t>(B_global) * (T + 1));
  auto micro_tokens = [&](int m) {
    return tokens.data() + (static_cast<size_t>(m) * D + grid.data_rank()) * Bm * (T + 1);
  };

  const bool tty = isatty(STDERR_FILENO);
  const double flops_per_step = model.flops_per_token(T) * B_global * T;
  const model::ParamCounts pc = model::count_params(cfg);
  if (opts.progress && root && device == Device::kCuda && grid.world.size() > 1)
    std::fprintf(stderr, "moetrain: device buffers between ranks over %s (%s)\n",
                 backend == comm::CommBackend::kNccl ? "NCCL" : "MPI, staged through the host",
                 backend_why.c_str());
  if (opts.progress && root) {
    std::string split;
    for (int l : layers_per_stage) split += (split.empty() ? "" : ",") + std::to_string(l);
    std::fprintf(stderr,
                 "moetrain: %s, %.2fM params (%.2fM active), %d layers, E=%d k=%d, global batch "
                 "%dx%d in %d micro-batch(es), %d steps, %d rank(s) [%s, layers %s, %s, a2a %s, "
                 "recompute %s, %s], %d BLAS thread(s) per rank (%s), peak %.1f GFLOP/s per rank (%s GEMM)\n",
                 opts.model.config_path.empty() ? opts.model.preset.c_str() : opts.model.config_path.c_str(),
                 pc.total / 1e6, pc.active / 1e6, cfg.num_hidden_layers, cfg.n_routed_experts,
                 cfg.num_experts_per_tok, B_global, T, M, opts.steps, grid.world.size(),
                 grid.dims.describe().c_str(), split.c_str(), parallel::schedule_name(schedule),
                 comm::a2a_algorithm_name(algo), opts.model.recompute.c_str(),
                 grid.topo.describe().c_str(), opts.device.threads,
                 opts.device.name == "cuda" ? "cuBLAS" : ("OpenBLAS " + kernels::blas_core_description()).c_str(),
                 res.peak_gflops,
                 opts.device.precision == "bf16" && opts.device.name != "cuda" ? "oneDNN bf16" : peak_precision.c_str());
  }

  std::vector<model::Model::MicroBatchPtr> mbs;
  for (int m = 0; m < M; ++m) mbs.push_back(model.new_micro_batch());
  // The metrics carry every MoE layer's loads, not only the root's stage: each stage puts its
  // layers' loads at their place among all MoE layers (the first moe_before_stage belong to earlier
  // stages) and the pipeline group sums them. moe_layer_ids names the layers for `moetrain report`.
  std::vector<int> moe_layer_ids;
  int moe_before_stage = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    moe_layer_ids.push_back(l);
    if (l < stage.first_layer) ++moe_before_stage;
  }
  // Tokenized data whose sidecar gives the held-out text's bytes per token (1 for text: nats
  // per token are nats per byte already).
  const double bytes_per_token = corpus->val_bytes_per_token();
  const bool tokenized = corpus->tokenizer_kind() != "bytes" || bytes_per_token != 1.0;
  const double t_start = now_seconds();
  double ema_tps = 0.0;
  mixture::MoeStepTimes profile_moe;  // --profile: totals over the run
  double profile_compute = 0, profile_opt = 0, profile_sync = 0, profile_steps = 0;
  for (int step = step0; step < opts.steps; ++step) {
    double t_sync = 0, t_opt = 0;
    traffic.reset();
    mixture::MoeStepTimes moe_times;
    std::optional<MoeStepRecorder> moe_recorder;  // forward and backward only (not validation)
    if (opts.profile) moe_recorder.emplace(&moe_times);
    const double t0 = now_seconds();
    // Every rank draws the same global batch and keeps its share, so any layout sees the same
    // data as one process.
    corpus->sample_batch(tokens.data(), B_global, T, data_rng, io::Split::kTrain);
    model.zero_grads();
    model.activation_memory().reset_peak();
    model.work_memory().reset_peak();
    model.total_memory().reset_peak();
    model::LossParts loss;
    std::vector<int64_t> flat_loads;
    double dispatch_bytes = 0;  // the largest micro-batch's (model.h: moe_dispatch_bytes)
    parallel::StageCallbacks cb;
    cb.forward = [&](int m, const float* x_in, float* x_out) {
      model::LossParts lp = model.forward(*mbs[m], micro_tokens(m), x_in, x_out, Bm, T);
      loss.ce += lp.ce / M;
      loss.aux += lp.aux / M;
      dispatch_bytes = std::max(dispatch_bytes, static_cast<double>(model.moe_dispatch_bytes(*mbs[m])));
      std::vector<int64_t> f;
      for (auto& l : model.expert_loads(*mbs[m])) f.insert(f.end(), l.begin(), l.end());
      if (flat_loads.empty()) flat_loads.assign(f.size(), 0);
      for (size_t i = 0; i < f.size(); ++i) flat_loads[i] += f[i];
    };
    cb.backward = [&](int m, const float* dy_out, float* dx_in) {
      model.backward(*mbs[m], dy_out, dx_in, 1.0f / (D * M));
    };
    const size_t act_floats = static_cast<size_t>(Bm) * T / grid.dims.tp * cfg.hidden_size;
    parallel::PipelineTimes pt;
    {  // bf16 on the CPU: the weights converted once for the step's forward and backward passes
      kernels::Bf16WeightScope bf16_weights(model.params(), model.num_params());
      pt = parallel::run_pipeline(grid.pp, schedule, M, act_floats, cb, &pipe_mem, device);
    }
    moe_recorder.reset();
    {
      ScopedTimer t(t_sync);
      parallel::sync_tensor_parallel(model.layout(), model.grads(), grid);
      if (shard.sharded())
        shard.reduce_scatter(model.grads());
      else
        parallel::sync_gradients(model.layout(), model.grads(), grid);
    }
    // Global figures: losses averaged over the data ranks and summed over the stages (ce lives on
    // the last stage, each stage has its own layers' aux losses); loads and bytes summed.
    loss.ce = data_mean(grid, loss.ce);
    loss.aux = data_mean(grid, loss.aux);
    if (grid.pp.size() > 1) {
      double parts[2] = {loss.ce, loss.aux};
      grid.pp.allreduce_sum(parts, 2);
      loss.ce = parts[0];
      loss.aux = parts[1];
    }
    loss.total = loss.ce + loss.aux;
    if (std::find(opts.faults.nan_steps.begin(), opts.faults.nan_steps.end(), step + 1) !=
        opts.faults.nan_steps.end())
      set_first(model.grads(), NAN);  // test hook: a non-finite gradient on every rank's first tensor
    double gnorm = NAN;
    bool skipped = false;
    {
      ScopedTimer t(t_opt);
      // A non-finite loss or gradient norm (the same on every rank) skips the update.
      if (std::isfinite(loss.total)) gnorm = opt.step(model.params(), model.grads(), step);
      skipped = !std::isfinite(loss.total) || !std::isfinite(gnorm);
      if (shard.sharded() && !skipped) shard.allgather(model.params());  // every rank's updated slice
    }
    if (std::find(opts.faults.inf_weight_steps.begin(), opts.faults.inf_weight_steps.end(), step + 1) !=
        opts.faults.inf_weight_steps.end())
      set_first(model.params(), INFINITY);  // test hook: the update "overflowed" one weight on every rank
    if (skipped) {
      ++bad_steps;
      ++bad_in_a_row;
      if (root)
        std::fprintf(stderr, "%sstep %d: non-finite %s, update skipped (%d in a row, %d in all)\n",
                     tty ? "\n" : "", step + 1, std::isfinite(loss.total) ? "gradient" : "loss",
                     bad_in_a_row, bad_steps);
      // The loss and the norm are global: every rank stops here together, one reports.
      if (bad_in_a_row >= opts.faults.max_bad_steps)
        throw SetupError(str_cat(bad_in_a_row, " non-finite steps in a row (--max-bad-steps ", opts.faults.max_bad_steps,
                                 "): stopping; the last good checkpoint is ",
                                 last_checkpoint.empty() ? std::string("none") : last_checkpoint),
                         root);
    } else {
      bad_in_a_row = 0;
    }
    const double dt = now_seconds() - t0;
    std::vector<int64_t> bytes;
    for (int c = 0; c < comm::kNumLinkClasses; ++c) bytes.push_back(static_cast<int64_t>(traffic.bytes[c]));
    flat_loads = global_expert_loads(grid, std::move(flat_loads), moe_layer_ids.size() * cfg.n_routed_experts,
                                     moe_before_stage * cfg.n_routed_experts);
    // Aux-loss-free balancing: the step's global loads move the selection bias (not on a skipped
    // step: its update did not happen either).
    if (score_bias.active() && !skipped) {
      score_bias.update(flat_loads);
      score_bias.apply(model);
    }
    // Expert parallelism: rank loads, and every --balance.migrate-every steps a migration.
    const StepBalance balance = balance_step(model, opts, grid, moe_layer_ids, flat_loads, step, skipped,
                                             {model.params(), opt.m().data(), opt.v().data()},
                                             root && opts.progress, tty);
    if (grid.world.size() > 1) grid.world.allreduce_sum(bytes.data(), static_cast<int64_t>(bytes.size()));
    const std::vector<StageStats> stages = gather_stage_stats(grid, pt, traffic.seconds, model);
    double t_a2a = 0, bubble = 0;
    for (const StageStats& st : stages) {
      t_a2a = std::max(t_a2a, st.a2a_s);
      bubble = std::max(bubble, st.step_s > 0 ? st.bubble_s / st.step_s : 0.0);
    }

    if (opts.profile) {
      mixture::add_step_times(profile_moe, moe_times);
      profile_compute += pt.compute_s;
      profile_opt += t_opt;
      profile_sync += t_sync;
      profile_steps += dt;
    }
    // Every world rank's MoE token-row bytes (metrics.jsonl "moe_dispatch_bytes"; TP divides them).
    std::vector<double> dispatch_bytes_all(grid.world.size(), dispatch_bytes);
    if (grid.world.size() > 1) grid.world.allgather(&dispatch_bytes, dispatch_bytes_all.data(), 1);
    const double tps = B_global * T / dt;
    ema_tps = step == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
    const double mfu = flops_per_step / dt / (res.peak_gflops * 1e9 * grid.world.size());
    res.losses.push_back(loss.total);
    res.last_stages = stages;

    const bool last = step + 1 == opts.steps;
    double vl = NAN;
    if (last || (opts.data.eval_every > 0 && (step + 1) % opts.data.eval_every == 0)) {
      vl = validation_loss(model, val, B, T, opts.data.eval_batches, grid);
      res.val_losses.emplace_back(step + 1, vl);
    }
    // Metrics go out before the checkpoint: a step whose checkpoint exists has its line.
    auto write_metrics_and_progress = [&]() {

      json loads_json = json::array();
      const int E = cfg.n_routed_experts;
      for (size_t pos = 0; E > 0 && pos < flat_loads.size(); pos += E)
        loads_json.push_back(std::vector<int64_t>(flat_loads.begin() + pos, flat_loads.begin() + pos + E));
      json stages_json = json::array();
      for (size_t i = 0; i < stages.size(); ++i) {
        const StageStats& st = stages[i];
        stages_json.push_back({{"stage", i},
                               {"layers", layers_per_stage[i]},
                               {"compute_s", st.compute_s},
                               {"bubble_s", st.bubble_s},
                               {"all_to_all_s", st.a2a_s},
                               {"step_s", st.step_s},
                               {"activation_peak_bytes", st.activation_peak_bytes},
                               {"total_peak_bytes", st.total_peak_bytes},
                               {"max_in_flight", st.max_in_flight}});
      }
      json rec = {{"step", step + 1},
                  {"loss", loss.total},
                  {"ce_loss", loss.ce},
                  {"aux_loss", loss.aux},
                  {"lr", learning_rate(oc, step)},
                  {"grad_norm", gnorm},
                  {"tokens", static_cast<long long>(B_global) * T},
                  {"tokens_per_s", tps},
                  {"mfu", mfu},
                  {"mfu_peak", {{"gflops", res.peak_gflops}, {"precision", peak_precision}}},
                  {"step_time_s", dt},
                  {"elapsed_s", now_seconds() - t_start},  // wall time since this process started training
                  {"bubble_fraction", bubble},
                  {"time_s",
                   {{"pipeline", pt.total_s}, {"compute", pt.compute_s}, {"bubble", pt.wait_s},
                    {"grad_sync", t_sync}, {"optimizer", t_opt}, {"all_to_all", t_a2a}}},
                  {"a2a_bytes",
                   {{"same_rank", bytes[0]}, {"intra_node", bytes[1]}, {"inter_node", bytes[2]},
                    {"inter_group", bytes[3]}}},
                  {"activation_peak_bytes", model.activation_memory().peak()},
                  {"optimizer_bytes", optimizer_bytes},
                  {"moe_dispatch_bytes", dispatch_bytes_all},
                  {"stages", stages_json},
                  {"expert_loads", loads_json},
                  {"expert_loads_layers", moe_layer_ids}};
      if (opts.profile) rec["time_s"]["moe"] = moe_times_json(moe_times);
      if (!balance.imbalance.empty()) {  // per MoE layer: tokens per EP rank, and their max/mean
        rec["rank_loads"] = balance.rank_loads;
        rec["load_imbalance"] = balance.imbalance;
      }
      if (!balance.migration.is_null()) rec["migration"] = balance.migration;
      if (!std::isnan(vl)) rec["val_loss"] = vl;
      // Tokenized data: the held-out loss per byte of text as well, comparable with a byte model's.
      if (!std::isnan(vl) && tokenized && bytes_per_token > 0) rec["val_loss_nats_per_byte"] = vl / bytes_per_token;
      metrics << rec.dump() << "\n";
      metrics.flush();

      if (opts.progress) {
        const double elapsed = now_seconds() - t_start;
        const double eta = elapsed / (step + 1 - step0) * (opts.steps - step - 1);
        char line[256];
        std::snprintf(line, sizeof line,
                      "step %5d/%d  loss %.4f  aux %.4f  %7.0f tok/s  MFU %5.1f%%  a2a %4.1f%%  "
                      "bubble %4.1f%%  ETA %s",
                      step + 1, opts.steps, loss.total, loss.aux, ema_tps, 100.0 * mfu,
                      100.0 * t_a2a / dt, 100.0 * bubble, format_duration(eta).c_str());
        std::string s = line;
        if (!std::isnan(vl)) s += str_cat("  val ", vl);
        if (!std::isnan(vl) && tokenized && bytes_per_token > 0) s += str_cat(" (", vl / bytes_per_token, " nats/byte)");
        if (tty) {
          std::fprintf(stderr, "\r%-130s", s.c_str());
          if (!std::isnan(vl) || last) std::fprintf(stderr, "\n");
        } else if (!std::isnan(vl) || step == 0 || (step + 1) % 20 == 0) {
          std::fprintf(stderr, "%s\n", s.c_str());
        }
        std::fflush(stderr);
      }
    };
    if (root) write_metrics_and_progress();
    // Checkpoint every N steps, at the end, and when a scheduler asks us to stop (SIGTERM/SIGINT
    // on any rank: all ranks agree, finish this step, save, and exit cleanly).
    int64_t stop = g_stop_requested ? 1 : 0;
    if (grid.world.size() > 1) grid.world.allreduce_max(&stop, 1);
    // No checkpoint during a streak of non-finite steps: the last good one stays the newest.
    bool save = bad_in_a_row == 0 &&
                (last || stop || (opts.checkpoint.every > 0 && (step + 1) % opts.checkpoint.every == 0));
    // A checkpoint is only ever called good when its tensors are: a finite loss and gradient can
    // still overflow in the update.
    if (save && !state_finite()) {
      save = false;
      if (root)
        std::fprintf(stderr, "%sstep %d: weights or AdamW state not finite after the update: no checkpoint "
                     "written; the last good one is %s\n", tty ? "\n" : "", step + 1,
                     last_checkpoint.empty() ? "none" : last_checkpoint.c_str());
    }
    if (save && !ckpt_dir.empty()) {
      CheckpointMeta meta;
      meta.step = step + 1;
      meta.data_rng_state = data_rng.state();
      meta.seed = opts.data.seed;
      meta.bad_steps = bad_steps;
      meta.config = model::config_to_json(cfg);
      meta.parallel = parallel_json;
      meta.expert_placement = model.placement().to_json();
      meta.router_bias = score_bias.to_json();
      HostState h(model, opt, /*copy=*/true, shard);
      if (grid.dims.tp > 1) {
        // Logical tensors, whatever the TP degree: the TP group gathers its slices (owned() keeps
        // the writing to its first rank).
        const model::ParamLayout unsplit = parallel::unsplit_layout(model.layout(), cfg);
        std::vector<float> p(unsplit.total()), m(unsplit.total()), v(unsplit.total());
        parallel::tp_gather(model.layout(), h.params(), unsplit, p.data(), grid.tp);
        parallel::tp_gather(model.layout(), h.m(), unsplit, m.data(), grid.tp);
        parallel::tp_gather(model.layout(), h.v(), unsplit, v.data(), grid.tp);
        last_checkpoint = save_checkpoint(grid.world, ckpt_dir, opts.checkpoint.keep, meta,
                                          {&unsplit, p.data(), m.data(), v.data(), owned});
      } else {
        last_checkpoint = save_checkpoint(grid.world, ckpt_dir, opts.checkpoint.keep, meta,
                                          {&model.layout(), h.params(), h.m(), h.v(), owned});
      }
    }
    ++steps_run;
    if (!skipped) ++good_steps;
    if (stop) {
      stopped_early = true;
      if (root)
        std::fprintf(stderr, "%sstopping on request after step %d; checkpoint %s\n", tty ? "\n" : "",
                     step + 1, last_checkpoint.empty() ? "none (no good step yet)" : last_checkpoint.c_str());
    }
    if (stop) break;
  }
  res.seconds = now_seconds() - t_start;
  res.bad_steps = bad_steps;
  // A run that never updated the weights did not train: say so and fail, whatever the reason.
  if (steps_run > 0 && good_steps == 0)
    throw SetupError(str_cat("every step of this run was skipped (", bad_steps - bad_steps_at_start,
                             " non-finite loss or gradient): nothing trained, no weights written; the last good "
                             "checkpoint is ", last_checkpoint.empty() ? std::string("none") : last_checkpoint),
                     root);
  if (stopped_early) return res;
  if (!state_finite())
    throw SetupError(str_cat("the final weights are not finite: no weights written; the last good checkpoint is ",
                             last_checkpoint.empty() ? std::string("none") : last_checkpoint),
                     root);
  const int ran = std::max(1, opts.steps - step0);
  res.tokens_per_s = static_cast<double>(B_global) * T * ran / res.seconds;
  res.mfu = flops_per_step * ran / res.seconds / (res.peak_gflops * 1e9 * grid.world.size());

  if (opts.profile && root) print_profile(profile_moe, profile_compute, profile_opt, profile_sync, profile_steps);
  if (root) model::save_config(cfg, opts.out_dir + "/config.json");
  save_full_weights(model, cfg, grid, layers_per_stage, opts.out_dir + "/model.safetensors");
  if (opts.progress && root) {
    const double final_val = res.val_losses.empty() ? NAN : res.val_losses.back().second;
    char val_text[160];
    if (!tokenized)
      std::snprintf(val_text, sizeof val_text, "%.4f nats/byte", final_val);
    else if (bytes_per_token > 0)
      std::snprintf(val_text, sizeof val_text, "%.4f nats/token = %.4f nats/byte", final_val,
                    final_val / bytes_per_token);
    else
      std::snprintf(val_text, sizeof val_text, "%.4f nats/token (no tokenizer sidecar: bytes unknown)", final_val);
    std::fprintf(stderr,
                 "done: %d steps in %s, %.0f tokens/s, MFU %.1f%%, final val loss %s; "
                 "wrote %s/{model.safetensors,config.json,metrics.jsonl}\n",
                 opts.steps, format_duration(res.seconds).c_str(), res.tokens_per_s, 100 * res.mfu,
                 val_text, opts.out_dir.c_str());
  }
  return res;
}

}  // namespace moe::train
