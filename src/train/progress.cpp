#include "train/progress.h"

#include <cmath>
#include <cstdio>

#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "train/time_budget.h"

namespace moe::train {

void print_run_header(const TrainOptions& opts, const RunSetup& setup, const parallel::Grid& grid,
                      const std::vector<int>& layers_per_stage, const std::string& steps_text, const MfuPeak& peak,
                      CommBackend backend, const std::string& backend_why) {
  const model::ModelConfig& cfg = setup.cfg;
  if (setup.device == Device::kCuda && grid.world.size() > 1)
    std::fprintf(stderr, "moetrain: device buffers between ranks over %s (%s)\n",
                 backend == CommBackend::kNccl ? "NCCL" : "MPI, staged through the host", backend_why.c_str());
  const model::ParamCounts pc = model::count_params(cfg);
  std::string split;
  for (int l : layers_per_stage) {
    if (!split.empty()) split += ',';
    split += std::to_string(l);
  }
  const bool cuda = setup.device == Device::kCuda;
  const std::string blas = cuda ? std::string("cuBLAS") : str_cat("OpenBLAS ", kernels::blas_core_description());
  std::fprintf(stderr,
               "moetrain: %s, %.2fM params (%.2fM active), %d layers, E=%d k=%d, global batch "
               "%dx%d in %d micro-batch(es), %s, %d rank(s) [%s, layers %s, %s, a2a %s, "
               "recompute %s, %s], %d BLAS thread(s) per rank (%s), peak %.1f GFLOP/s per rank (%s)\n",
               !opts.model.init_from.empty()    ? opts.model.init_from.c_str()
               : opts.model.config_path.empty() ? opts.model.preset.c_str()
                                                : opts.model.config_path.c_str(),
               pc.total / 1e6, pc.active / 1e6, cfg.num_hidden_layers, cfg.n_routed_experts, cfg.num_experts_per_tok,
               opts.data.batch * grid.data_size(), opts.data.seq_len, opts.parallel.micro_batches, steps_text.c_str(),
               grid.world.size(), grid.dims.describe().c_str(), split.c_str(), name(setup.schedule),
               name(setup.a2a), name(setup.recompute),
               grid.topo.describe().c_str(), opts.device.threads, blas.c_str(), peak.gflops,
               peak.describe(setup.precision == Precision::kBf16 && !cuda).c_str());
  if (!setup.a2a_auto_why.empty()) std::fprintf(stderr, "moetrain: --a2a auto: %s\n", setup.a2a_auto_why.c_str());
  if (opts.parallel.comm_overlap) {
    const char* why = grid.dims.ep < 2            ? "no effect: no token exchange (--ep 1)"
                      : cfg.n_shared_experts == 0 ? "no effect: the model has no shared experts"
                      : cuda                      ? "no effect on CUDA (the staged exchange shares the compute stream)"
                                                  : "the shared experts run beside each MoE layer's exchange";
    std::fprintf(stderr, "moetrain: --comm.overlap: %s\n", why);
  }
  if (!opts.device.precision)
    // clang-format off
    std::fprintf(stderr, "moetrain: --precision auto: %s (%s)\n", name(setup.precision),
                 setup.auto_fp32_peak > 0
                     ? str_cat("bf16 peak ", static_cast<int>(setup.auto_bf16_peak), " against fp32 ",
                               static_cast<int>(setup.auto_fp32_peak), " GFLOP/s on rank 0; bf16 needs ",
                               kAutoBf16MinGain, "x on every rank").c_str()
                     : cuda ? "auto picks bf16 only on a CPU; ask for --precision bf16 on CUDA"
                            : str_cat("no bf16 GEMM here: ", kernels::bf16_cpu_unavailable_reason()).c_str());
  // clang-format on
}

void print_progress(const ProgressLine& p, bool tty) {
  char line[256];
  std::snprintf(line, sizeof line,
                "step %5d/%s  loss %.4f  aux %.4f  %7.0f tok/s  MFU %5.1f%%  a2a %4.1f%%  "
                "bubble %4.1f%%  ETA %s",
                p.step + 1, p.total_text.c_str(), p.loss.total, p.loss.aux, p.tokens_per_s, 100.0 * p.mfu,
                100.0 * p.a2a_share, 100.0 * p.bubble, format_duration(p.eta_s).c_str());
  std::string text = line;
  const bool val = !std::isnan(p.val_loss);
  if (val) text += str_cat("  val ", p.val_loss);
  if (val && p.bytes_per_token > 0) text += str_cat(" (", p.val_loss / p.bytes_per_token, " nats/byte)");
  if (tty) {
    std::fprintf(stderr, "\r%-130s", text.c_str());
    if (val || p.last) std::fprintf(stderr, "\n");
  } else if (val || p.step == 0 || (p.step + 1) % 20 == 0) {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void print_done(const TrainOptions& opts, int steps, double seconds, double train_s, const TrainResult& res,
                bool tokenized, double bytes_per_token) {
  const double final_val = res.val_losses.empty() ? NAN : res.val_losses.back().second;
  char val_text[160];
  if (!tokenized)
    std::snprintf(val_text, sizeof val_text, "%.4f nats/byte", final_val);
  else if (bytes_per_token > 0)
    std::snprintf(val_text, sizeof val_text, "%.4f nats/token = %.4f nats/byte", final_val,
                  final_val / bytes_per_token);
  else
    std::snprintf(val_text, sizeof val_text,
                  "%.4f nats/token (bytes per token unknown: no sidecar, or no tokenizer model beside the dataset)",
                  final_val);
  const std::string budget_text =
      opts.time_budget_s > 0 ? str_cat(" (training steps ", format_budget(train_s), " of the ",
                                       format_budget(opts.time_budget_s), " budget)")
                             : std::string();
  std::fprintf(stderr,
               "done: %d steps in %s%s, %.0f tokens/s, MFU %.1f%%, final val loss %s; "
               "wrote %s/{model.safetensors,config.json,metrics.jsonl}\n",
               steps, format_duration(seconds).c_str(), budget_text.c_str(), res.tokens_per_s, 100 * res.mfu,
               val_text, opts.out_dir.c_str());
}

void print_init_from_loss(const std::string& dir, double loss) {
  std::fprintf(stderr, "--init-from %s: held-out loss %.6f before the first step\n", dir.c_str(), loss);
}

}  // namespace moe::train
