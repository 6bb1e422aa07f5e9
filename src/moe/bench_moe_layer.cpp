// The MoE layer benchmark. See bench_moe_layer.h.
// Legend: T tokens, H hidden, E experts, k slots, F expert ffn, Fs shared ffn.
#include "moe/bench_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/buffer.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "moe/moe_layer.h"

namespace moe::mixture {
namespace {

void fill_normal(Buffer<float>& b, Rng rng, float stddev) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(rng.normal() * stddev);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
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

}  // namespace

double moe_layer_useful_flops(const MoeBenchOptions& o, size_t real_rows) {
  const double T = o.tokens, H = o.hidden, E = o.experts, F = o.ffn;
  const double Fs = static_cast<double>(o.shared) * o.ffn;
  return 2.0 * T * H * E * 3.0 + 18.0 * static_cast<double>(real_rows) * H * F +
         18.0 * T * H * Fs;
}

MoeBenchResult run_moe_layer_bench(const MoeBenchOptions& opts) {
  check_options(opts);
  MoeBenchResult res;
  res.opts = opts;
  // The roofline: best 1024³ sgemm of the run, measured before and after the layer (on a shared
  // machine the best is the honest denominator; a single measurement can catch a busy moment).
  res.blas_gflops_1024 = kernels::measure_gemm_gflops(1024);

  const int T = opts.tokens, H = opts.hidden, E = opts.experts, k = opts.topk, F = opts.ffn;
  const int Fs = opts.shared * opts.ffn;
  const size_t EFH = static_cast<size_t>(E) * F * H, FsH = static_cast<size_t>(Fs) * H;
  BenchData d;
  using Sized = std::pair<Buffer<float>*, size_t>;
  for (const Sized& b : {Sized{&d.x, size_t(T) * H}, Sized{&d.dy, size_t(T) * H},
                         Sized{&d.gate, size_t(E) * H}, Sized{&d.eg, EFH}, Sized{&d.eu, EFH},
                         Sized{&d.ed, EFH}, Sized{&d.sg, FsH}, Sized{&d.su, FsH},
                         Sized{&d.sd, FsH}, Sized{&d.dgate, size_t(E) * H}, Sized{&d.deg, EFH},
                         Sized{&d.deu, EFH}, Sized{&d.ded, EFH}, Sized{&d.dsg, FsH},
                         Sized{&d.dsu, FsH}, Sized{&d.dsd, FsH}, Sized{&d.dx, size_t(T) * H}}) {
    b.first->resize(b.second);
  }
  // Inputs and upstream gradient std 1, weights std 0.02: a random router on random inputs.
  fill_normal(d.x, derive_rng(opts.seed, 0), 1.0f);
  fill_normal(d.dy, derive_rng(opts.seed, 1), 1.0f);
  fill_normal(d.gate, derive_rng(opts.seed, 2), 0.02f);
  fill_normal(d.eg, derive_rng(opts.seed, 3), 0.02f);
  fill_normal(d.eu, derive_rng(opts.seed, 4), 0.02f);
  fill_normal(d.ed, derive_rng(opts.seed, 5), 0.02f);
  fill_normal(d.sg, derive_rng(opts.seed, 6), 0.02f);
  fill_normal(d.su, derive_rng(opts.seed, 7), 0.02f);
  fill_normal(d.sd, derive_rng(opts.seed, 8), 0.02f);
  MoeWeights w{d.gate.data(), {d.eg.data(), d.eu.data(), d.ed.data()},
               {d.sg.data(), d.su.data(), d.sd.data()}};
  MoeGrads g{d.dgate.data(), {d.deg.data(), d.deu.data(), d.ded.data()},
             {d.dsg.data(), d.dsu.data(), d.dsd.data()}};
  Buffer<float> y(static_cast<size_t>(T) * H);

  for (bool padded : {false, true}) {
    MoeConfig cfg;
    cfg.hidden = H;
    cfg.ffn = F;
    cfg.num_experts = E;
    cfg.top_k = k;
    cfg.shared_ffn = Fs;
    cfg.padded = padded;
    cfg.capacity_factor = padded ? opts.capacity_factor : opts.pft_capacity_factor;

    MemTracker tracker;
    MoeActivations act;
    std::vector<double> fwd, bwd, tot, expert;
    size_t act_bytes = 0;
    for (int it = 0; it < opts.warmup + opts.iters; ++it) {
      MoeStepTimes times;
      MoeStepTimes* old = set_moe_step_times(&times);
      double t0 = now_seconds();
      moe_forward(y.data(), act, d.x.data(), w, cfg, T, 1, &tracker);
      double t1 = now_seconds();
      act_bytes = tracker.current();  // everything forward keeps for backward
      moe_backward(d.dx.data(), g, d.dy.data(), 1.0f, act, d.x.data(), w, cfg, T, 1);
      double t2 = now_seconds();
      set_moe_step_times(old);
      if (it < opts.warmup) continue;
      fwd.push_back(t1 - t0);
      bwd.push_back(t2 - t1);
      tot.push_back(t2 - t0);
      expert.push_back(times.experts + times.experts_bwd);
    }

    MoeBenchRow row;
    row.path = padded ? "padded" : "padding-free";
    row.fwd_ms = median(fwd) * 1e3;
    row.bwd_ms = median(bwd) * 1e3;
    row.total_ms = median(tot) * 1e3;
    row.expert_gemm_ms = median(expert) * 1e3;
    const int dropped = padded ? act.padded_layout.num_dropped : act.layout.num_dropped;
    const size_t real_rows = static_cast<size_t>(T) * k - static_cast<size_t>(dropped);
    const double expert_flops = 18.0 * static_cast<double>(real_rows) * H * F;
    row.gflops_layer = moe_layer_useful_flops(opts, real_rows) / (row.total_ms * 1e-3) * 1e-9;
    row.gflops_expert = expert_flops / (row.expert_gemm_ms * 1e-3) * 1e-9;
    row.activation_bytes = act_bytes;
    row.dropped_fraction = static_cast<double>(dropped) / (static_cast<double>(T) * k);
    row.padding_rows = padded ? act.padded_layout.padding_rows() : 0;
    // Verify: y still holds the last forward's output.
    row.checked_tokens = std::min(T, 16);
    for (int i = 0; i < row.checked_tokens; ++i) {
      int t = static_cast<int>(static_cast<int64_t>(i) * T / row.checked_tokens);
      std::vector<double> ref = naive_token_output(d, act, padded, t, H, F, Fs, k);
      double diff = 0, scale = 1e-30;
      for (int c = 0; c < H; ++c) {
        diff = std::max(diff, std::fabs(y[static_cast<size_t>(t) * H + c] - ref[c]));
        scale = std::max(scale, std::fabs(ref[c]));
      }
      if (!(diff <= 1e-3 * scale)) ++row.wrong_tokens;
    }
    res.rows.push_back(row);
  }
  res.blas_gflops_1024 = std::max(res.blas_gflops_1024, kernels::measure_gemm_gflops(1024));
  for (MoeBenchRow& row : res.rows) {
    row.frac_of_blas_layer = row.gflops_layer / res.blas_gflops_1024;
    row.frac_of_blas_expert = row.gflops_expert / res.blas_gflops_1024;
  }
  return res;
}

std::string format_moe_bench_table(const MoeBenchResult& r) {
  const MoeBenchOptions& o = r.opts;
  std::ostringstream os;
  char line[320];
  std::snprintf(line, sizeof line,
                "# moe-layer  T=%d H=%d E=%d k=%d F=%d shared=%d  padded cf=%.2f  "
                "BLAS 1024^3: %.1f GFLOP/s\n",
                o.tokens, o.hidden, o.experts, o.topk, o.ffn, o.shared, o.capacity_factor,
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
  return os.str();
}

std::string moe_bench_json(const MoeBenchResult& r) {
  const MoeBenchOptions& o = r.opts;
  nlohmann::json j;
  j["bench"] = "moe-layer";
  j["options"] = {{"tokens", o.tokens},       {"hidden", o.hidden},
                  {"experts", o.experts},     {"topk", o.topk},
                  {"ffn", o.ffn},             {"capacity_factor", o.capacity_factor},
                  {"pft_capacity_factor", o.pft_capacity_factor},
                  {"shared", o.shared},       {"warmup", o.warmup},
                  {"iters", o.iters},         {"seed", o.seed}};
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
                         {"wrong_tokens", row.wrong_tokens}});
  }
  return j.dump(2);
}

}  // namespace moe::mixture
