#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "comm/exchange.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/dataset.h"
#include "io/safetensors.h"
#include "kernels/gemm.h"
#include "model/weights_io.h"
#include "parallel/grid.h"

namespace moe::train {
namespace fs = std::filesystem;
using nlohmann::json;

std::string default_corpus_path() {
  if (fs::exists("data/kjv.txt")) return "data/kjv.txt";
  return std::string(MOETRAIN_SOURCE_DIR) + "/data/kjv.txt";
}

namespace {

std::string format_duration(double s) {
  int t = static_cast<int>(std::lround(s));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  return buf;
}

// Mean over the data group of one value per rank.
double data_mean(const parallel::Grid& g, double v) {
  if (g.data.size() > 1) g.data.allreduce_sum(&v, 1);
  return v / g.data.size();
}

// Validation cross-entropy of the fixed held-out batches; each data rank evaluates its share.
double validation_loss(model::Model& m, const std::vector<int32_t>& val, int B_local, int T,
                       int n, const parallel::Grid& g) {
  const size_t per_global = static_cast<size_t>(B_local) * g.data_size() * (T + 1);
  const size_t offset = static_cast<size_t>(g.data_rank()) * B_local * (T + 1);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += m.evaluate(val.data() + i * per_global + offset, B_local, T).ce;
  return data_mean(g, sum / n);
}

// Writes every parameter with its Hugging Face name into one file: rank 0 gathers the routed
// experts of its EP group (ranks of dp index 0 hold every expert once between them).
void save_full_weights(const model::Model& m, const model::ModelConfig& cfg,
                       const parallel::Grid& g, const std::string& path) {
  if (g.dims.ep == 1) {
    if (g.world.rank() == 0) model::save_weights(m, path);
    return;
  }
  if (g.me.dp != 0 || g.me.pp != 0 || g.me.tp != 0) return;
  auto expert_values = [](const model::ParamLayout& layout, const float* params) {
    std::vector<float> v;
    for (const model::ParamSpec& s : layout.specs())
      if (s.is_expert) v.insert(v.end(), params + s.offset, params + s.offset + s.numel);
    return v;
  };
  if (g.ep.rank() != 0) {
    std::vector<float> mine = expert_values(m.layout(), m.params());
    g.ep.send(mine.data(), static_cast<int64_t>(mine.size()), 0, /*tag=*/71);
    return;
  }
  model::ParamLayout full(cfg);
  std::vector<float> all(full.total());
  for (const model::ParamSpec& s : m.layout().specs())
    std::memcpy(all.data() + full.find(s.name).offset, m.params() + s.offset, s.numel * sizeof(float));
  const int El = cfg.n_routed_experts / g.dims.ep;
  for (int r = 1; r < g.dims.ep; ++r) {
    model::ParamLayout theirs(cfg, {r * El, El});
    std::vector<float> buf(theirs.total());  // only the expert part is received
    size_t n = 0;
    for (const model::ParamSpec& s : theirs.specs()) n += s.is_expert ? s.numel : 0;
    g.ep.recv(buf.data(), static_cast<int64_t>(n), r, /*tag=*/71);
    size_t pos = 0;
    for (const model::ParamSpec& s : theirs.specs()) {
      if (!s.is_expert) continue;
      std::memcpy(all.data() + full.find(s.name).offset, buf.data() + pos, s.numel * sizeof(float));
      pos += s.numel;
    }
  }
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const model::ParamSpec& s : full.specs()) w.add_f32(s.name, s.shape, all.data() + s.offset);
  w.write(path);
}

}  // namespace

TrainResult run_training(const TrainOptions& opts) {
  MOE_CHECK(opts.steps > 0, "--steps must be positive, got ", opts.steps);
  MOE_CHECK(opts.batch > 0, "--batch must be positive, got ", opts.batch);
  MOE_CHECK(opts.seq_len > 1, "--seq-len must be at least 2, got ", opts.seq_len);
  MOE_CHECK(opts.threads > 0, "--threads must be positive, got ", opts.threads);
  MOE_CHECK(opts.eval_batches > 0, "--eval-batches must be positive, got ", opts.eval_batches);
  MOE_CHECK(comm::MpiRuntime::initialized(), "run_training needs MPI initialised (comm::MpiRuntime)");

  // Setup: everything that bad input can break, checked on every rank, then agreed on.
  comm::Group world = comm::Group::world();
  model::ModelConfig cfg;
  std::optional<io::ByteCorpus> corpus;
  std::ofstream metrics;
  const bool root = world.rank() == 0;
  std::string setup_error;
  comm::A2aAlgorithm algo = comm::A2aAlgorithm::kFlat;
  try {
    algo = comm::parse_a2a_algorithm(opts.a2a);
    comm::Topology::detect(world.size(), opts.topo_ranks_per_node, opts.topo_nodes_per_group);
    cfg = opts.config_path.empty() ? model::preset(opts.preset) : model::load_config(opts.config_path);
    MOE_CHECK(opts.seq_len <= cfg.max_position_embeddings, "--seq-len ", opts.seq_len,
              " exceeds the model's max_position_embeddings ", cfg.max_position_embeddings);
    MOE_CHECK(cfg.vocab_size >= 256, "byte-level data needs vocab_size >= 256, the config has ",
              cfg.vocab_size);
    opts.dims.validate(world.size(), cfg);
    const std::string data_path = opts.data_path.empty() ? default_corpus_path() : opts.data_path;
    if (opts.data_path.empty() && !fs::exists(data_path))
      throw Error(str_cat(data_path, ": built-in corpus not found; run scripts/setup.sh first"));
    corpus.emplace(io::ByteCorpus::load(data_path));
    // Both splits must hold a window (the checks name the file and the sizes).
    const int n_data = opts.dims.dp * opts.dims.ep;
    corpus->val_batches(opts.batch * n_data, opts.seq_len, 1);
    {
      Rng probe(0);
      std::vector<int32_t> one(static_cast<size_t>(opts.seq_len) + 1);
      corpus->sample_batch(one.data(), 1, opts.seq_len, probe, io::Split::kTrain);
    }
    if (root) {
      std::error_code ec;
      fs::create_directories(opts.out_dir, ec);
      MOE_CHECK(!ec, opts.out_dir, ": cannot create output folder (", ec.message(), ")");
      const std::string metrics_path = opts.out_dir + "/metrics.jsonl";
      metrics.open(metrics_path, std::ios::trunc);
      MOE_CHECK(metrics.good(), metrics_path, ": cannot open for writing");
    }
  } catch (const Error& e) {
    setup_error = e.what();
  }
  if (world.size() > 1) {
    // The lowest failing rank reports; every rank stops.
    int64_t flag = setup_error.empty() ? 0 : world.size() - world.rank();
    world.allreduce_max(&flag, 1);
    if (flag > 0) {
      const int reporter = world.size() - static_cast<int>(flag);
      throw SetupError(setup_error.empty() ? "another rank failed during setup" : setup_error,
                       world.rank() == reporter);
    }
  } else if (!setup_error.empty()) {
    throw SetupError(setup_error, true);
  }

  parallel::Grid grid =
      parallel::make_grid(opts.dims, cfg, opts.topo_ranks_per_node, opts.topo_nodes_per_group);
  const int D = grid.data_size();
  const int B = opts.batch, T = opts.seq_len, B_global = B * D;
  std::vector<int32_t> val = corpus->val_batches(B_global, T, opts.eval_batches);

  kernels::set_blas_threads(opts.threads);
  TrainResult res;
  res.peak_gflops = kernels::measure_gemm_gflops(1024, 3);

  comm::TrafficStats traffic;
  comm::TokenExchange exchange(grid.ep, grid.topo, algo, &traffic);
  mixture::ExpertParallel ep_ctx;
  ep_ctx.exchange = grid.dims.ep > 1 ? &exchange : nullptr;
  ep_ctx.rank = grid.me.ep;
  ep_ctx.size = grid.dims.ep;
  ep_ctx.reduce_aux_stats = [&grid](std::vector<double>& v) {
    grid.data.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  };
  model::Model model(cfg, opts.moe, D > 1 ? &ep_ctx : nullptr);
  model.init_weights(opts.seed);
  OptimConfig oc = opts.optim;
  oc.total_steps = opts.steps;
  AdamW opt(model.layout(), oc);
  if (grid.dims.ep > 1)
    opt.set_expert_norm_reducer([&grid](double s) {
      grid.ep.allreduce_sum(&s, 1);
      return s;
    });
  Rng data_rng = derive_rng(opts.seed, /*stream=*/1);
  std::vector<int32_t> tokens(static_cast<size_t>(B_global) * (T + 1));
  const int32_t* my_tokens = tokens.data() + static_cast<size_t>(grid.data_rank()) * B * (T + 1);

  const bool tty = isatty(STDERR_FILENO);
  const double flops_per_step = model.flops_per_token(T) * B_global * T;
  const model::ParamCounts pc = model::count_params(cfg);
  if (opts.progress && root)
    std::fprintf(stderr,
                 "moetrain: %s, %.2fM params (%.2fM active), %d layers, E=%d k=%d, global batch "
                 "%dx%d, %d steps, %d rank(s) [%s, a2a %s, %s], %d BLAS thread(s) per rank, peak "
                 "%.1f GFLOP/s per rank (1024^3 sgemm)\n",
                 opts.config_path.empty() ? opts.preset.c_str() : opts.config_path.c_str(),
                 pc.total / 1e6, pc.active / 1e6, cfg.num_hidden_layers, cfg.n_routed_experts,
                 cfg.num_experts_per_tok, B_global, T, opts.steps, grid.world.size(),
                 grid.dims.describe().c_str(), comm::a2a_algorithm_name(algo),
                 grid.topo.describe().c_str(), opts.threads, res.peak_gflops);

  const double t_start = now_seconds();
  double ema_tps = 0.0;
  for (int step = 0; step < opts.steps; ++step) {
    double t_fwd = 0, t_bwd = 0, t_sync = 0, t_opt = 0;
    traffic.reset();
    const double t0 = now_seconds();
    // Every rank draws the same global batch and keeps its share, so any layout sees the same
    // data as one process.
    corpus->sample_batch(tokens.data(), B_global, T, data_rng, io::Split::kTrain);
    model.zero_grads();
    model.activation_memory().reset_peak();
    model::LossParts loss;
    {
      ScopedTimer t(t_fwd);
      loss = model.forward(my_tokens, B, T);
    }
    auto loads = model.expert_loads();
    {
      ScopedTimer t(t_bwd);
      model.backward(1.0f / D);
    }
    {
      ScopedTimer t(t_sync);
      parallel::sync_gradients(model.layout(), model.grads(), grid);
    }
    double gnorm;
    {
      ScopedTimer t(t_opt);
      gnorm = opt.step(model.params(), model.grads(), step);
    }
    const double dt = now_seconds() - t0;
    // Global figures: losses averaged over the data ranks, loads and bytes summed.
    loss.total = data_mean(grid, loss.total);
    loss.ce = data_mean(grid, loss.ce);
    loss.aux = data_mean(grid, loss.aux);
    MOE_CHECK(std::isfinite(loss.total), "step ", step + 1, ": loss is not finite (", loss.total, ")");
    std::vector<int64_t> flat_loads;
    for (auto& l : loads) flat_loads.insert(flat_loads.end(), l.begin(), l.end());
    std::vector<int64_t> bytes;
    for (int c = 0; c < comm::kNumLinkClasses; ++c) bytes.push_back(static_cast<int64_t>(traffic.bytes[c]));
    if (grid.data.size() > 1 && !flat_loads.empty())
      grid.data.allreduce_sum(flat_loads.data(), static_cast<int64_t>(flat_loads.size()));
    if (grid.world.size() > 1) grid.world.allreduce_sum(bytes.data(), static_cast<int64_t>(bytes.size()));
    double t_a2a = traffic.seconds;
    if (grid.world.size() > 1) grid.world.allreduce_max(&t_a2a, 1);

    const double tps = B_global * T / dt;
    ema_tps = step == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
    const double mfu = flops_per_step / dt / (res.peak_gflops * 1e9 * grid.world.size());
    res.losses.push_back(loss.total);

    const bool last = step + 1 == opts.steps;
    double vl = NAN;
    if (last || (opts.eval_every > 0 && (step + 1) % opts.eval_every == 0)) {
      vl = validation_loss(model, val, B, T, opts.eval_batches, grid);
      res.val_losses.emplace_back(step + 1, vl);
    }
    if (!root) continue;

    json loads_json = json::array();
    size_t pos = 0;
    for (auto& l : loads) {
      loads_json.push_back(std::vector<int64_t>(flat_loads.begin() + pos, flat_loads.begin() + pos + l.size()));
      pos += l.size();
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
                {"step_time_s", dt},
                {"time_s",
                 {{"forward", t_fwd}, {"backward", t_bwd}, {"grad_sync", t_sync},
                  {"optimizer", t_opt}, {"all_to_all", t_a2a}}},
                {"a2a_bytes",
                 {{"same_rank", bytes[0]}, {"intra_node", bytes[1]}, {"inter_node", bytes[2]},
                  {"inter_group", bytes[3]}}},
                {"activation_peak_bytes", model.activation_memory().peak()},
                {"expert_loads", loads_json}};
    if (!std::isnan(vl)) rec["val_loss"] = vl;
    metrics << rec.dump() << "\n";
    metrics.flush();

    if (opts.progress) {
      const double elapsed = now_seconds() - t_start;
      const double eta = elapsed / (step + 1) * (opts.steps - step - 1);
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5d/%d  loss %.4f  aux %.4f  %7.0f tok/s  MFU %5.1f%%  a2a %4.1f%%  ETA %s",
                    step + 1, opts.steps, loss.total, loss.aux, ema_tps, 100.0 * mfu,
                    100.0 * t_a2a / dt, format_duration(eta).c_str());
      std::string s = line;
      if (!std::isnan(vl)) s += str_cat("  val ", vl);
      if (tty) {
        std::fprintf(stderr, "\r%-120s", s.c_str());
        if (!std::isnan(vl) || last) std::fprintf(stderr, "\n");
      } else if (!std::isnan(vl) || step == 0 || (step + 1) % 20 == 0) {
        std::fprintf(stderr, "%s\n", s.c_str());
      }
      std::fflush(stderr);
    }
  }
  res.seconds = now_seconds() - t_start;
  res.tokens_per_s = static_cast<double>(B_global) * T * opts.steps / res.seconds;
  res.mfu = flops_per_step * opts.steps / res.seconds / (res.peak_gflops * 1e9 * grid.world.size());

  if (root) model::save_config(cfg, opts.out_dir + "/config.json");
  save_full_weights(model, cfg, grid, opts.out_dir + "/model.safetensors");
  if (opts.progress && root)
    std::fprintf(stderr,
                 "done: %d steps in %s, %.0f tokens/s, MFU %.1f%%, final val loss %.4f nats/byte; "
                 "wrote %s/{model.safetensors,config.json,metrics.jsonl}\n",
                 opts.steps, format_duration(res.seconds).c_str(), res.tokens_per_s, 100 * res.mfu,
                 res.val_losses.back().second, opts.out_dir.c_str());
  return res;
}

}  // namespace moe::train
