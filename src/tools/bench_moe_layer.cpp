// The MoE layer benchmark. See bench_moe_layer.h.
// Legend: T tokens, H hidden, E experts, k slots, F expert ffn, Fs shared ffn.
#include "tools/bench_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/buffer.h"
#include "core/error.h"
#include "tools/bench_driver.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/device_select.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"
#include "kernels/peak_rate.h"
#include "moe/moe_layer.h"

namespace moe::mixture {
namespace {
using tools::median;

void fill_normal(Buffer<float>& b, Rng rng, float stddev) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(rng.normal() * stddev);
}

void check_options(const MoeBenchOptions& o) {
  MOE_CHECK(o.tokens > 0 && o.hidden > 0 && o.experts > 0 && o.ffn > 0,
            "bench moe-layer: tokens=", o.tokens, " hidden=", o.hidden, " experts=", o.experts,
            " ffn=", o.ffn, " must all be > 0");
  MOE_CHECK(o.topk >= 1 && o.topk <= o.experts, "bench moe-layer: topk=", o.topk,
            " must be in [1, experts=", o.experts, "]");
  MOE_CHECK(o.shared >= 0 && o.warmup >= 0 && o.iters >= 1, "bench moe-layer: shared=", o.shared,
            " warmup=", o.warmup, " iters=", o.iters);
  MOE_CHECK(o.capacity_factor >= 0.0f && o.pft_capacity_factor >= 0.0f,
            "bench moe-layer: capacity factors must be >= 0");
}

// The same random model and batch for every path.
struct BenchData {
  Buffer<float> x, dy, gate, eg, eu, ed, sg, su, sd;
  Buffer<float> dgate, deg, deu, ded, dsg, dsu, dsd, dx;
};

// Naive double-precision output of token t: sum over its kept pairs of w · expert(x_t), plus the
// shared experts. The benchmark checks a sample of tokens with it, so a fast wrong result shows.
std::vector<double> naive_token_output(const BenchData& d, const MoeActivations& act, bool padded,
                                       int t, int H, int F, int Fs, int k) {
  std::vector<double> out(H, 0.0), h;
  const float* x = d.x.data() + static_cast<size_t>(t) * H;
  auto mlp = [&](const float* G, const float* U, const float* D, int f, double scale) {
    h.assign(f, 0.0);
    for (int i = 0; i < f; ++i) {
      double g = 0, u = 0;
      for (int c = 0; c < H; ++c) {
        g += static_cast<double>(G[static_cast<size_t>(i) * H + c]) * x[c];
        u += static_cast<double>(U[static_cast<size_t>(i) * H + c]) * x[c];
      }
      h[i] = g / (1.0 + std::exp(-g)) * u;
    }
    for (int c = 0; c < H; ++c) {
      double s = 0;
      for (int i = 0; i < f; ++i) s += static_cast<double>(D[static_cast<size_t>(c) * f + i]) * h[i];
      out[c] += scale * s;
    }
  };
  const size_t FH = static_cast<size_t>(F) * H;
  for (int j = 0; j < k; ++j) {
    size_t p = static_cast<size_t>(t) * k + j;
    int32_t pos = padded ? act.padded_layout.pos_of_slot_TK[p] : act.layout.row_of_slot_TK[p];
    if (pos < 0) continue;  // dropped
    size_t e = static_cast<size_t>(act.routing.topk_idx_TK[p]);
    mlp(d.eg.data() + e * FH, d.eu.data() + e * FH, d.ed.data() + e * FH, F,
        act.routing.topk_weight_TK[p]);
  }
  if (Fs > 0) mlp(d.sg.data(), d.su.data(), d.sd.data(), Fs, 1.0);
  return out;
}

MoeStepTimes mean_step_times(const std::vector<MoeStepTimes>& all) {
  MoeStepTimes mean;
  for (const MoeStepTimes& t : all)
    for (const NamedStep& s : named_steps()) {
      step_field(mean, s) += step_seconds(t, s) / static_cast<double>(all.size());
    }
  return mean;
}

// The best GEMM rate (GFLOP/s) now: on a shared machine the best of the run's measurements is the
// honest denominator (a single one can catch a busy moment). On the CPU each measurement is itself
// the best of several runs at 1024³ and 1536³; on a GPU, cuBLAS at blas_n³.
double roofline_gflops(const MoeBenchOptions& opts, int blas_n) {
#ifdef MOETRAIN_HAVE_CUDA
  if (opts.device == Device::kCuda) return kernels::cuda::measure_gemm_gflops(blas_n, 5, opts.precision == Precision::kBf16);
#endif
  return kernels::measure_peak_gflops(opts.precision);
}

// The layer of the run: padding-free (dropless unless --pft-capacity-factor) or the padded baseline.
MoeConfig layer_config(const MoeBenchOptions& opts, bool padded) {
  MoeConfig cfg;
  cfg.hidden = opts.hidden;
  cfg.ffn = opts.ffn;
  cfg.num_experts = opts.experts;
  cfg.top_k = opts.topk;
  cfg.shared_ffn = opts.shared * opts.ffn;
  cfg.padded = padded;
  cfg.capacity_factor = padded ? opts.capacity_factor : opts.pft_capacity_factor;
  return cfg;
}

// The random model and batch of the run (host), and its device copy on a GPU (dev is left empty on
// the CPU). Inputs and upstream gradient std 1, weights std 0.02: a random router on random inputs.
void make_bench_data(const MoeBenchOptions& opts, bool on_gpu, BenchData& d, BenchData& dev) {
  const int T = opts.tokens, H = opts.hidden, E = opts.experts, F = opts.ffn;
  const int Fs = opts.shared * opts.ffn;
  const size_t EFH = static_cast<size_t>(E) * F * H, FsH = static_cast<size_t>(Fs) * H;
  using Member = Buffer<float> BenchData::*;
  using Sized = std::pair<Member, size_t>;
  for (const Sized& b : {Sized{&BenchData::x, size_t(T) * H}, Sized{&BenchData::dy, size_t(T) * H},
                         Sized{&BenchData::gate, size_t(E) * H}, Sized{&BenchData::eg, EFH},
                         Sized{&BenchData::eu, EFH}, Sized{&BenchData::ed, EFH},
                         Sized{&BenchData::sg, FsH}, Sized{&BenchData::su, FsH},
                         Sized{&BenchData::sd, FsH}, Sized{&BenchData::dgate, size_t(E) * H},
                         Sized{&BenchData::deg, EFH}, Sized{&BenchData::deu, EFH},
                         Sized{&BenchData::ded, EFH}, Sized{&BenchData::dsg, FsH},
                         Sized{&BenchData::dsu, FsH}, Sized{&BenchData::dsd, FsH},
                         Sized{&BenchData::dx, size_t(T) * H}}) {
    (d.*b.first).resize(b.second);
    if (on_gpu) (dev.*b.first).resize(b.second, nullptr, Device::kCuda);
  }
  fill_normal(d.x, derive_rng(opts.seed, 0), 1.0f);
  fill_normal(d.dy, derive_rng(opts.seed, 1), 1.0f);
  fill_normal(d.gate, derive_rng(opts.seed, 2), 0.02f);
  fill_normal(d.eg, derive_rng(opts.seed, 3), 0.02f);
  fill_normal(d.eu, derive_rng(opts.seed, 4), 0.02f);
  fill_normal(d.ed, derive_rng(opts.seed, 5), 0.02f);
  fill_normal(d.sg, derive_rng(opts.seed, 6), 0.02f);
  fill_normal(d.su, derive_rng(opts.seed, 7), 0.02f);
  fill_normal(d.sd, derive_rng(opts.seed, 8), 0.02f);
  if (on_gpu)
    for (Member m : {&BenchData::x, &BenchData::dy, &BenchData::gate, &BenchData::eg,
                     &BenchData::eu, &BenchData::ed, &BenchData::sg, &BenchData::su,
                     &BenchData::sd})
      device_copy(Device::kCuda, (dev.*m).data(), Device::kCpu, (d.*m).data(), (d.*m).bytes());
}

}  // namespace

double moe_layer_useful_flops(const MoeBenchOptions& o, size_t real_rows) {
  const double T = o.tokens, H = o.hidden, E = o.experts, F = o.ffn;
  const double Fs = static_cast<double>(o.shared) * o.ffn;
  return 2.0 * T * H * E * 3.0 + 18.0 * static_cast<double>(real_rows) * H * F +
         18.0 * T * H * Fs;
}

MoeBenchResult run_moe_layer_bench(const MoeBenchOptions& opts) {
  check_options(opts);
  MOE_CHECK(opts.precision != Precision::kBf16 || opts.device == Device::kCuda || kernels::bf16_cpu_available(),
            "bench moe-layer: --precision bf16 --device cpu: ", kernels::bf16_cpu_unavailable_reason());
  MoeBenchResult res;
  res.opts = opts;
  const bool on_gpu = opts.device == Device::kCuda;
  const bool bf16 = opts.precision == Precision::kBf16;
  kernels::ExecContext ctx(opts.device, bf16);  // the layer's device, precision and workspaces
  const kernels::ContextScope on(ctx);
  // The roofline: the best GEMM of the run, measured before and after the layer.
  res.blas_n = on_gpu ? 4096 : kernels::peak_sizes().back();
  res.blas_gflops_1024 = roofline_gflops(opts, res.blas_n);

  const int T = opts.tokens, H = opts.hidden, E = opts.experts, k = opts.topk, F = opts.ffn;
  const int Fs = opts.shared * opts.ffn;
  const size_t EFH = static_cast<size_t>(E) * F * H, FsH = static_cast<size_t>(Fs) * H;
  BenchData d, dev;  // host data (and the naive check's inputs); its device copy on a GPU
  make_bench_data(opts, on_gpu, d, dev);
  BenchData& run = on_gpu ? dev : d;  // what the layer reads and writes
  // clang-format off
  MoeWeights w{run.gate.data(), {run.eg.data(), run.eu.data(), run.ed.data()},
               {run.sg.data(), run.su.data(), run.sd.data()}};
  MoeGrads g{run.dgate.data(), {run.deg.data(), run.deu.data(), run.ded.data()},
             {run.dsg.data(), run.dsu.data(), run.dsd.data()}};
  // clang-format on
  Buffer<float> y(static_cast<size_t>(T) * H, nullptr, opts.device);

  for (bool padded : {false, true}) {
    if (padded && (on_gpu || !opts.run_padded)) continue;  // the padded baseline: a CPU comparison
    MoeConfig cfg = layer_config(opts, padded);

    MemTracker tracker;
    MoeActivations act;
    MoeBackwardWorkspace workspace;  // backward's temporaries kept across iterations, as in training
    cfg.workspace = &workspace;
    std::vector<double> fwd, bwd, tot, expert;
    std::vector<MoeStepTimes> steps;
    size_t act_bytes = 0;
    for (int it = 0; it < opts.warmup + opts.iters; ++it) {
      MoeStepTimes times;
      cfg.step_times = &times;
      kernels::device_synchronize();
      double t0 = now_seconds();
      // bf16 on the CPU: the weights converted once per forward + backward (timed, in forward),
      // as the trainer does once per step.
      // clang-format off
      kernels::Bf16WeightScope bf16_weights({{run.gate.data(), run.gate.size()}, {run.eg.data(), EFH},
                                             {run.eu.data(), EFH}, {run.ed.data(), EFH},
                                             {run.sg.data(), FsH}, {run.su.data(), FsH}, {run.sd.data(), FsH}});
      // clang-format on
      moe_forward(y.data(), act, run.x.data(), w, cfg, T, 1, &tracker);
      kernels::device_synchronize();
      double t1 = now_seconds();
      act_bytes = tracker.current();  // everything forward keeps for backward
      moe_backward(run.dx.data(), g, run.dy.data(), 1.0f, act, run.x.data(), w, cfg, T, 1);
      kernels::device_synchronize();
      double t2 = now_seconds();
      cfg.step_times = nullptr;
      if (it < opts.warmup) continue;
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
      expert.push_back(times.experts + times.experts_bwd);
      steps.push_back(times);
    }

    MoeBenchRow row;
    row.path = padded ? "padded" : "padding-free";
    row.fwd_ms = median(fwd) * 1e3;
    row.bwd_ms = median(bwd) * 1e3;
    row.total_ms = median(tot) * 1e3;
    row.expert_gemm_ms = median(expert) * 1e3;
    row.steps = mean_step_times(steps);
    const int dropped = padded ? act.padded_layout.num_dropped : act.layout.num_dropped;
    const size_t real_rows = static_cast<size_t>(T) * k - static_cast<size_t>(dropped);
    const double expert_flops = 18.0 * static_cast<double>(real_rows) * H * F;
    row.gflops_layer = moe_layer_useful_flops(opts, real_rows) / (row.total_ms * 1e-3) * 1e-9;
    row.gflops_expert = expert_flops / (row.expert_gemm_ms * 1e-3) * 1e-9;
    row.activation_bytes = act_bytes;
    row.dropped_fraction = static_cast<double>(dropped) / (static_cast<double>(T) * k);
    row.padding_rows = padded ? act.padded_layout.padding_rows() : 0;
    // Verify: y still holds the last forward's output (brought to the host, with the routing the
    // naive check reads, from a GPU).
    Buffer<float> y_host(y.size());
    device_copy(Device::kCpu, y_host.data(), y.device(), y.data(), y.bytes());
    if (on_gpu) {
      for (Buffer<int32_t>* b : {&act.layout.row_of_slot_TK, &act.routing.topk_idx_TK}) {
        Buffer<int32_t> h(b->size());
        device_copy(Device::kCpu, h.data(), b->device(), b->data(), b->bytes());
        *b = std::move(h);
      }
      Buffer<float> h(act.routing.topk_weight_TK.size());
      device_copy(Device::kCpu, h.data(), Device::kCuda, act.routing.topk_weight_TK.data(), h.bytes());
      act.routing.topk_weight_TK = std::move(h);
    }
    row.checked_tokens = std::min(T, 16);
    for (int i = 0; i < row.checked_tokens; ++i) {
      int t = static_cast<int>(static_cast<int64_t>(i) * T / row.checked_tokens);
      std::vector<double> ref = naive_token_output(d, act, padded, t, H, F, Fs, k);
      double diff = 0, scale = 1e-30;
      for (int c = 0; c < H; ++c) {
        diff = std::max(diff, std::fabs(y_host[static_cast<size_t>(t) * H + c] - ref[c]));
        scale = std::max(scale, std::fabs(ref[c]));
      }
      // bf16 GEMM inputs round each operand to 8 bits of mantissa: a looser bound.
      if (!(diff <= (bf16 ? 3e-2 : 1e-3) * scale)) ++row.wrong_tokens;
    }
    res.rows.push_back(row);
  }
  res.blas_gflops_1024 = std::max(res.blas_gflops_1024, roofline_gflops(opts, res.blas_n));
  for (MoeBenchRow& row : res.rows) {
    row.frac_of_blas_layer = row.gflops_layer / res.blas_gflops_1024;
    row.frac_of_blas_expert = row.gflops_expert / res.blas_gflops_1024;
  }
  return res;
}

namespace {

// One line per step: ms (mean over iters) of each path, and its share of that path's total.
// The rows that are not experts' GEMMs are what keeps the layer from the sgemm rate.
std::string format_breakdown(const MoeBenchResult& r) {
  std::ostringstream os;
  char line[200];
  os << "# per-step ms (mean of iters; indented rows are parts of the step above)\n";
  std::snprintf(line, sizeof line, "%-18s", "step");
  os << line;
  for (const MoeBenchRow& row : r.rows) {
    std::snprintf(line, sizeof line, " %13s %6s", row.path.c_str(), "%");
    os << line;
  }
  os << "\n";
  for (const NamedStep& s : named_steps()) {
    std::snprintf(line, sizeof line, "%-18s", s.name);
    os << line;
    for (const MoeBenchRow& row : r.rows) {
      const double ms = step_seconds(row.steps, s) * 1e3;
      const double total = (row.steps.forward() + row.steps.backward()) * 1e3;
      std::snprintf(line, sizeof line, " %13.1f %6.1f", ms, total > 0 ? 100.0 * ms / total : 0.0);
      os << line;
    }
    os << "\n";
  }
  std::snprintf(line, sizeof line, "%-18s", "non-GEMM");
  os << line;
  for (const MoeBenchRow& row : r.rows) {
    const double total = (row.steps.forward() + row.steps.backward()) * 1e3;
    const double other = total - row.steps.expert_parts.gemm() * 1e3;
    std::snprintf(line, sizeof line, " %13.1f %6.1f", other, total > 0 ? 100.0 * other / total : 0.0);
    os << line;
  }
  os << "\n";
  return os.str();
}

}  // namespace

std::string format_moe_bench_table(const MoeBenchResult& r) {
  const MoeBenchOptions& o = r.opts;
  std::ostringstream os;
  std::string sizes = std::to_string(r.blas_n);  // CUDA: one size; the CPU peak: best of several
  if (o.device != Device::kCuda) {
    sizes.clear();
    for (int n : kernels::peak_sizes()) sizes += (sizes.empty() ? "" : ",") + std::to_string(n);
  }
  char line[320];
  std::snprintf(line, sizeof line,
                "# moe-layer  T=%d H=%d E=%d k=%d F=%d shared=%d  padded cf=%.2f  device %s %s  "
                "%s %s^3: %.1f GFLOP/s\n",
                o.tokens, o.hidden, o.experts, o.topk, o.ffn, o.shared, o.capacity_factor,
                name(o.device), name(o.precision),
                o.device == Device::kCuda         ? "cuBLAS"
                : o.precision == Precision::kBf16 ? "oneDNN bf16 peak, best of"
                                                  : "BLAS fp32 peak, best of",
                sizes.c_str(),
                r.blas_gflops_1024);
  os << line;
  std::snprintf(line, sizeof line, "%-13s %9s %9s %9s %10s %9s %9s %7s %7s %10s %8s %8s %7s\n",
                "path", "fwd(ms)", "bwd(ms)", "total(ms)", "expert(ms)", "GF/s", "GF/s-exp",
                "%blas", "%b-exp", "act(MiB)", "drop(%)", "pad-rows", "#wrong");
  os << line;
  for (const MoeBenchRow& row : r.rows) {
    std::snprintf(line, sizeof line,
                  "%-13s %9.1f %9.1f %9.1f %10.1f %9.1f %9.1f %7.1f %7.1f %10.1f %8.2f %8zu %3d/%-3d\n",
                  row.path.c_str(), row.fwd_ms, row.bwd_ms, row.total_ms, row.expert_gemm_ms,
                  row.gflops_layer, row.gflops_expert, 100.0 * row.frac_of_blas_layer,
                  100.0 * row.frac_of_blas_expert, row.activation_bytes / (1024.0 * 1024.0),
                  100.0 * row.dropped_fraction, row.padding_rows, row.wrong_tokens,
                  row.checked_tokens);
    os << line;
  }
  if (o.breakdown) os << format_breakdown(r);
  return os.str();
}

namespace {

nlohmann::json steps_json(const MoeStepTimes& t) {
  nlohmann::json j;
  for (const auto& [name, ms] : moe_step_times_ms(t)) j[name] = ms;
  return j;
}

}  // namespace

std::string moe_bench_json(const MoeBenchResult& r) {
  const MoeBenchOptions& o = r.opts;
  nlohmann::json j;
  j["bench"] = "moe-layer";
  // clang-format off
  j["options"] = {{"tokens", o.tokens},       {"hidden", o.hidden},
                  {"experts", o.experts},     {"topk", o.topk},
                  {"ffn", o.ffn},             {"capacity_factor", o.capacity_factor},
                  {"pft_capacity_factor", o.pft_capacity_factor},
                  {"shared", o.shared},       {"warmup", o.warmup},
                  {"iters", o.iters},         {"seed", o.seed},
                  {"device", name(o.device)}, {"precision", name(o.precision)}};
  // clang-format on
  j["blas_n"] = r.blas_n;  // CPU: the largest of the peak's sizes (kernels/peak_rate.h)
  j["peak_precision"] = name(o.device == Device::kCuda ? o.precision : Precision::kFp32);
  j["blas_gflops_1024"] = r.blas_gflops_1024;
  j["rows"] = nlohmann::json::array();
  for (const MoeBenchRow& row : r.rows) {
    j["rows"].push_back({{"path", row.path},
                         {"fwd_ms", row.fwd_ms},
                         {"bwd_ms", row.bwd_ms},
                         {"total_ms", row.total_ms},
                         {"expert_gemm_ms", row.expert_gemm_ms},
                         {"gflops_layer", row.gflops_layer},
                         {"gflops_expert", row.gflops_expert},
                         {"frac_of_blas_layer", row.frac_of_blas_layer},
                         {"frac_of_blas_expert", row.frac_of_blas_expert},
                         {"activation_bytes", row.activation_bytes},
                         {"dropped_fraction", row.dropped_fraction},
                         {"padding_rows", row.padding_rows},
                         {"checked_tokens", row.checked_tokens},
                         {"wrong_tokens", row.wrong_tokens},
                         {"steps_ms", steps_json(row.steps)}});
  }
  return j.dump(2);
}

}  // namespace moe::mixture
