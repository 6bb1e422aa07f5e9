// Throughput of the CPU kernels (Google Benchmark) beyond the op table's entries (bench_ops.cpp):
// the sgemm roofline and the grouped experts at DeepSeek-MoE scale. Every case reports GFLOP/s;
// the grouped SwiGLU case also reports its fraction of the 1024³ sgemm rate (the roofline
// `bench moe-layer` and MFU use). Inputs come from a fixed-seed moe::Rng, so runs are repeatable. Run with
// OPENBLAS_NUM_THREADS=1 (one BLAS thread per rank, the project default).
// Rates are per process CPU second, not wall second: on a shared machine wall time also counts the
// other tenants, CPU time counts only our work (with one BLAS thread and an idle machine the two
// agree; the table still shows both times).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <vector>

#include "core/rng.h"
#include "kernels/gemm.h"
#include "kernels/swiglu_mlp.h"

namespace {

using namespace moe;
using namespace moe::kernels;

// Uniform with standard deviation `scale` (uniform, not normal: the grouped case fills ~190M
// floats and Box-Muller would dominate the start-up time).
std::vector<float> rand_uniform(Rng& rng, size_t n, double scale) {
  std::vector<float> v(n);
  const double half_width = std::sqrt(3.0) * scale;
  for (auto& x : v) x = static_cast<float>((2.0 * rng.uniform() - 1.0) * half_width);
  return v;
}

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// flops per iteration -> a GFLOP/s counter
void set_gflops(benchmark::State& state, double flops_per_iter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iter * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["blas_threads"] = blas_threads();
}

// --- sgemm n×n×n: the roofline --------------------------------------------------------------
void BM_Sgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  Rng rng(1);
  auto a = rand_uniform(rng, size_t(n) * n, 1.0), b = rand_uniform(rng, size_t(n) * n, 1.0);
  std::vector<float> c(size_t(n) * n);
  for (auto _ : state) {
    gemm(false, false, n, n, n, 1.0f, a.data(), 0, b.data(), 0, 0.0f, c.data(), 0);
    benchmark::DoNotOptimize(c.data());
  }
  set_gflops(state, 2.0 * n * n * double(n));
}
BENCHMARK(BM_Sgemm)->Arg(1024)->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();

// --- the table's ops (linear, rmsnorm, rope, attention, swiglu, embedding, cross_entropy, the
// SwiGLU MLP, grouped experts) at the model's sizes: bench/bench_ops.cpp.

// --- grouped SwiGLU experts, forward + backward ------------------------------------------------
// T tokens, top-k routing over E experts: T·k rows in uneven segments (expert popularity drawn
// log-normal, rows assigned at random), hidden H, expert ffn F. 18·R·H·F flops (9 GEMMs).
struct GroupedProblem {
  int H, F, E, R;
  std::vector<int32_t> offsets_E1;
  std::vector<float> x, dy, gate, up, down, y, g, u, h, dx, dgate, dup, ddown, scratch;

  GroupedProblem(int T, int H_, int E_, int k, int F_) : H(H_), F(F_), E(E_), R(T * k) {
    Rng rng(4);
    std::vector<double> cum(E);
    double total = 0.0;
    for (int e = 0; e < E; ++e) cum[e] = total += std::exp(0.5 * rng.normal());
    std::vector<int32_t> count(E, 0);
    for (int r = 0; r < R; ++r) {
      double z = rng.uniform() * total;
      int e = 0;
      while (e < E - 1 && cum[e] <= z) ++e;
      ++count[e];
    }
    offsets_E1.assign(E + 1, 0);
    for (int e = 0; e < E; ++e) offsets_E1[e + 1] = offsets_E1[e] + count[e];
    size_t fh = size_t(F) * H;
    x = rand_uniform(rng, size_t(R) * H, 1.0);
    dy = rand_uniform(rng, size_t(R) * H, 1.0);
    gate = rand_uniform(rng, E * fh, 1.0 / std::sqrt(H));
    up = rand_uniform(rng, E * fh, 1.0 / std::sqrt(H));
    down = rand_uniform(rng, E * fh, 1.0 / std::sqrt(F));
    y.resize(size_t(R) * H);
    dx.resize(size_t(R) * H);
    g.resize(size_t(R) * F);
    u.resize(g.size());
    h.resize(g.size());
    scratch.resize(2 * g.size());
    dgate.resize(E * fh);
    dup.resize(E * fh);
    ddown.resize(E * fh);
  }
  void forward() {
    grouped_swiglu_forward(y.data(), g.data(), u.data(), h.data(), x.data(), offsets_E1.data(), E,
                           {gate.data(), up.data(), down.data()}, H, F);
  }
  void backward() {
    grouped_swiglu_backward(dx.data(), {dgate.data(), dup.data(), ddown.data()}, dy.data(),
                            x.data(), g.data(), u.data(), h.data(), offsets_E1.data(), E,
                            {gate.data(), up.data(), down.data()}, H, F, scratch.data());
  }
  double flops_fwd() const { return 6.0 * R * double(H) * F; }

  // A benchmark that does not verify is not trusted: recompute output row r naively (double) and
  // return its relative error.
  double check_row(int r) const {
    int e = 0;
    while (offsets_E1[e + 1] <= r) ++e;
    size_t fh = size_t(F) * H;
    const float *xr = x.data() + size_t(r) * H, *ge = gate.data() + e * fh,
                *ue = up.data() + e * fh, *de = down.data() + e * fh;
    std::vector<double> hr(F);
    for (int f = 0; f < F; ++f) {
      double gs = 0.0, us = 0.0;
      for (int j = 0; j < H; ++j) {
        gs += double(xr[j]) * ge[size_t(f) * H + j];
        us += double(xr[j]) * ue[size_t(f) * H + j];
      }
      hr[f] = gs / (1.0 + std::exp(-gs)) * us;
    }
    double num = 0.0, den = 0.0;
    for (int j = 0; j < H; ++j) {
      double yj = 0.0;
      for (int f = 0; f < F; ++f) yj += hr[f] * de[size_t(j) * F + f];
      num += (y[size_t(r) * H + j] - yj) * (y[size_t(r) * H + j] - yj);
      den += yj * yj;
    }
    return std::sqrt(num / den);
  }
};

// The roofline in the same clock as the rates: best of 3 1024³ sgemms in process CPU time.
// (kernels::measure_peak_gflops is the version the trainer uses.)
double sgemm_1024_gflops() {
  static const double rate = [] {
    const int n = 1024;
    Rng rng(6);
    auto a = rand_uniform(rng, size_t(n) * n, 1.0), b = rand_uniform(rng, size_t(n) * n, 1.0);
    std::vector<float> c(size_t(n) * n);
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {  // the first one warms up
      double t0 = cpu_seconds();
      gemm(false, false, n, n, n, 1.0f, a.data(), 0, b.data(), 0, 0.0f, c.data(), 0);
      if (r > 0) best = std::min(best, cpu_seconds() - t0);
    }
    return 2.0 * n * n * double(n) / best * 1e-9;
  }();
  return rate;
}

void BM_GroupedSwigluFwdBwd(benchmark::State& state) {
  GroupedProblem p(int(state.range(0)), int(state.range(1)), int(state.range(2)),
                   int(state.range(3)), int(state.range(4)));
  double roof = sgemm_1024_gflops();
  p.forward();  // warm: first touch of every buffer
  p.backward();
  double fwd_s = 0.0, bwd_s = 0.0;
  for (auto _ : state) {
    double t0 = cpu_seconds();
    p.forward();
    double t1 = cpu_seconds();
    p.backward();
    fwd_s += t1 - t0;
    bwd_s += cpu_seconds() - t1;
    benchmark::DoNotOptimize(p.dx.data());
  }
  double iters = double(state.iterations());
  double err = std::max(p.check_row(0), p.check_row(p.R - 1));
  if (!(err < 1e-4)) state.SkipWithError("grouped_swiglu_forward disagrees with the naive row");
  int min_rows = p.R, max_rows = 0;
  for (int e = 0; e < p.E; ++e) {
    min_rows = std::min(min_rows, p.offsets_E1[e + 1] - p.offsets_E1[e]);
    max_rows = std::max(max_rows, p.offsets_E1[e + 1] - p.offsets_E1[e]);
  }
  state.counters["rows_min"] = min_rows;
  state.counters["rows_max"] = max_rows;
  set_gflops(state, 3.0 * p.flops_fwd());
  state.counters["fwd_GFLOP/s"] = p.flops_fwd() * iters / fwd_s * 1e-9;
  state.counters["bwd_GFLOP/s"] = 2.0 * p.flops_fwd() * iters / bwd_s * 1e-9;
  state.counters["sgemm1024_GFLOP/s"] = roof;
  // target >= 0.7: the grouped GEMMs run near the square-GEMM rate despite uneven segments
  state.counters["frac_of_sgemm"] = 3.0 * p.flops_fwd() * iters / (fwd_s + bwd_s) * 1e-9 / roof;
}
BENCHMARK(BM_GroupedSwigluFwdBwd)
    ->Args({4096, 1024, 64, 6, 704})
    ->ArgNames({"T", "H", "E", "k", "F"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->MinTime(2.0);

// Causal attention (fused, against the unfused baseline it replaced): bench/bench_attention.cpp.

}  // namespace
