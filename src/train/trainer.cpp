#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "io/dataset.h"
#include "kernels/gemm.h"
#include "model/weights_io.h"

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

double validation_loss(model::Model& m, const std::vector<int32_t>& val, int B, int T, int n) {
  double sum = 0.0;
  const size_t per = static_cast<size_t>(B) * (T + 1);
  for (int i = 0; i < n; ++i) sum += m.evaluate(val.data() + i * per, B, T).ce;
  return sum / n;
}

}  // namespace

TrainResult run_training(const TrainOptions& opts) {
  MOE_CHECK(opts.steps > 0, "--steps must be positive, got ", opts.steps);
  MOE_CHECK(opts.batch > 0, "--batch must be positive, got ", opts.batch);
  MOE_CHECK(opts.seq_len > 1, "--seq-len must be at least 2, got ", opts.seq_len);
  MOE_CHECK(opts.threads > 0, "--threads must be positive, got ", opts.threads);
  MOE_CHECK(opts.eval_batches > 0, "--eval-batches must be positive, got ", opts.eval_batches);

  model::ModelConfig cfg =
      opts.config_path.empty() ? model::preset(opts.preset) : model::load_config(opts.config_path);
  MOE_CHECK(opts.seq_len <= cfg.max_position_embeddings, "--seq-len ", opts.seq_len,
            " exceeds the model's max_position_embeddings ", cfg.max_position_embeddings);
  MOE_CHECK(cfg.vocab_size >= 256, "byte-level data needs vocab_size >= 256, the config has ",
            cfg.vocab_size);
  const std::string data_path = opts.data_path.empty() ? default_corpus_path() : opts.data_path;
  if (opts.data_path.empty() && !fs::exists(data_path))
    throw Error(str_cat(data_path, ": built-in corpus not found; run scripts/setup.sh first"));
  io::ByteCorpus corpus = io::ByteCorpus::load(data_path);
  const int B = opts.batch, T = opts.seq_len;
  std::vector<int32_t> val = corpus.val_batches(B, T, opts.eval_batches);

  std::error_code ec;
  fs::create_directories(opts.out_dir, ec);
  MOE_CHECK(!ec, opts.out_dir, ": cannot create output folder (", ec.message(), ")");
  const std::string metrics_path = opts.out_dir + "/metrics.jsonl";
  std::ofstream metrics(metrics_path, std::ios::trunc);
  MOE_CHECK(metrics.good(), metrics_path, ": cannot open for writing");

  kernels::set_blas_threads(opts.threads);
  TrainResult res;
  res.peak_gflops = kernels::measure_gemm_gflops(1024, 3);

  model::Model model(cfg, opts.moe);
  model.init_weights(opts.seed);
  OptimConfig oc = opts.optim;
  oc.total_steps = opts.steps;
  AdamW opt(model.layout(), oc);
  Rng data_rng = derive_rng(opts.seed, /*stream=*/1);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));

  const bool tty = isatty(STDERR_FILENO);
  const double flops_per_step = model.flops_per_token(T) * B * T;
  const model::ParamCounts pc = model::count_params(cfg);
  if (opts.progress)
    std::fprintf(stderr,
                 "moetrain: %s, %.2fM params (%.2fM active), %d layers, E=%d k=%d, batch %dx%d, "
                 "%d steps, %d BLAS thread(s), peak %.1f GFLOP/s (1024^3 sgemm)\n",
                 opts.config_path.empty() ? opts.preset.c_str() : opts.config_path.c_str(),
                 pc.total / 1e6, pc.active / 1e6, cfg.num_hidden_layers, cfg.n_routed_experts,
                 cfg.num_experts_per_tok, B, T, opts.steps, opts.threads, res.peak_gflops);

  const double t_start = now_seconds();
  double ema_tps = 0.0;
  for (int step = 0; step < opts.steps; ++step) {
    double t_fwd = 0, t_bwd = 0, t_opt = 0;
    const double t0 = now_seconds();
    corpus.sample_batch(tokens.data(), B, T, data_rng, io::Split::kTrain);
    model.zero_grads();
    model.activation_memory().reset_peak();
    model::LossParts loss;
    {
      ScopedTimer t(t_fwd);
      loss = model.forward(tokens.data(), B, T);
    }
    auto loads = model.expert_loads();
    {
      ScopedTimer t(t_bwd);
      model.backward();
    }
    double gnorm;
    {
      ScopedTimer t(t_opt);
      gnorm = opt.step(model.params(), model.grads(), step);
    }
    MOE_CHECK(std::isfinite(loss.total), "step ", step + 1, ": loss is not finite (", loss.total, ")");
    const double dt = now_seconds() - t0;
    const double tps = B * T / dt;
    ema_tps = step == 0 ? tps : 0.9 * ema_tps + 0.1 * tps;
    const double mfu = flops_per_step / dt / (res.peak_gflops * 1e9);
    res.losses.push_back(loss.total);

    json rec = {{"step", step + 1},
                {"loss", loss.total},
                {"ce_loss", loss.ce},
                {"aux_loss", loss.aux},
                {"lr", learning_rate(oc, step)},
                {"grad_norm", gnorm},
                {"tokens", static_cast<long long>(B) * T},
                {"tokens_per_s", tps},
                {"mfu", mfu},
                {"step_time_s", dt},
                {"time_s", {{"forward", t_fwd}, {"backward", t_bwd}, {"optimizer", t_opt}}},
                {"activation_peak_bytes", model.activation_memory().peak()},
                {"expert_loads", loads}};
    const bool last = step + 1 == opts.steps;
    if (last || (opts.eval_every > 0 && (step + 1) % opts.eval_every == 0)) {
      double vl = validation_loss(model, val, B, T, opts.eval_batches);
      res.val_losses.emplace_back(step + 1, vl);
      rec["val_loss"] = vl;
    }
    metrics << rec.dump() << "\n";
    metrics.flush();

    if (opts.progress) {
      const double elapsed = now_seconds() - t_start;
      const double eta = elapsed / (step + 1) * (opts.steps - step - 1);
      char line[256];
      std::snprintf(line, sizeof line,
                    "step %5d/%d  loss %.4f  aux %.4f  %7.0f tok/s  MFU %5.1f%%  ETA %s", step + 1,
                    opts.steps, loss.total, loss.aux, ema_tps, 100.0 * mfu,
                    format_duration(eta).c_str());
      std::string s = line;
      if (rec.contains("val_loss")) s += str_cat("  val ", rec["val_loss"].get<double>());
      if (tty) {
        std::fprintf(stderr, "\r%-110s", s.c_str());
        if (rec.contains("val_loss") || last) std::fprintf(stderr, "\n");
      } else if (rec.contains("val_loss") || step == 0 || (step + 1) % 20 == 0) {
        std::fprintf(stderr, "%s\n", s.c_str());
      }
      std::fflush(stderr);
    }
  }
  res.seconds = now_seconds() - t_start;
  res.tokens_per_s = static_cast<double>(B) * T * opts.steps / res.seconds;
  res.mfu = flops_per_step * opts.steps / res.seconds / (res.peak_gflops * 1e9);

  model::save_config(cfg, opts.out_dir + "/config.json");
  model::save_weights(model, opts.out_dir + "/model.safetensors");
  if (opts.progress)
    std::fprintf(stderr,
                 "done: %d steps in %s, %.0f tokens/s, MFU %.1f%%, final val loss %.4f nats/byte; "
                 "wrote %s/{model.safetensors,config.json,metrics.jsonl}\n",
                 opts.steps, format_duration(res.seconds).c_str(), res.tokens_per_s, 100 * res.mfu,
                 res.val_losses.back().second, opts.out_dir.c_str());
  return res;
}

}  // namespace moe::train
