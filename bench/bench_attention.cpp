// Causal attention, forward + backward (Google Benchmark, part of moetrain_bench_kernels): the
// flash-style kernel the model uses (kernels/attention.cpp) against the unfused kernel it
// replaced, kept here as the baseline only: full T×T score GEMMs with the upper triangle masked,
// the [B, nh, T, T] probabilities stored, and a T×T scratch in backward. Same inputs, same shapes
// (the tiny model's T 128, head_dim 32, 4 heads, and long sequences). Both report GFLOP/s counted
// as the unfused kernel's full products, 12·B·nh·T²·hd per iteration, so the ratio of the two
// rates is the ratio of their times. Run with OPENBLAS_CORETYPE=SkylakeX OPENBLAS_NUM_THREADS=1
// (see bench_kernels.cpp); rates are per process CPU second.
#include <benchmark/benchmark.h>

#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"

namespace {

using namespace moe;
using namespace moe::kernels;

std::vector<float> rand_uniform(Rng& rng, size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(2.0 * rng.uniform() - 1.0);
  return v;
}

// The unfused baseline, one (b, h) at a time on strided views (row stride C = nh·hd).
void unfused_forward(float* out, float* att, const float* q, const float* k, const float* v, int B,
                     int T, int nh, int hd) {
  const int C = nh * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < nh; ++h) {
      const size_t off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hd;
      float* a = att + (static_cast<size_t>(b) * nh + h) * T * T;
      gemm(false, true, T, T, hd, scale, q + off, C, k + off, C, 0.0f, a, T);
      for (int t = 0; t < T; ++t) {
        float* row = a + static_cast<size_t>(t) * T;
        float mx = row[0];
        for (int s = 1; s <= t; ++s) mx = row[s] > mx ? row[s] : mx;
        double sum = 0.0;
        for (int s = 0; s <= t; ++s) sum += row[s] = std::exp(row[s] - mx);
        const float inv = static_cast<float>(1.0 / sum);
        for (int s = 0; s <= t; ++s) row[s] *= inv;
        for (int s = t + 1; s < T; ++s) row[s] = 0.0f;
      }
      gemm(false, false, T, hd, T, 1.0f, a, T, v + off, C, 0.0f, out + off, C);
    }
}

void unfused_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                      const float* k, const float* v, const float* att, int B, int T, int nh, int hd,
                      float* ds) {
  const int C = nh * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < nh; ++h) {
      const size_t off = static_cast<size_t>(b) * T * C + static_cast<size_t>(h) * hd;
      const float* a = att + (static_cast<size_t>(b) * nh + h) * T * T;
      gemm(true, false, T, hd, T, 1.0f, a, T, dout + off, C, 1.0f, dv + off, C);
      gemm(false, true, T, T, hd, 1.0f, dout + off, C, v + off, C, 0.0f, ds, T);
      for (int t = 0; t < T; ++t) {
        const float* ar = a + static_cast<size_t>(t) * T;
        float* dr = ds + static_cast<size_t>(t) * T;
        double dot = 0.0;
        for (int s = 0; s <= t; ++s) dot += static_cast<double>(ar[s]) * dr[s];
        const float d = static_cast<float>(dot);
        for (int s = 0; s <= t; ++s) dr[s] = scale * ar[s] * (dr[s] - d);
        for (int s = t + 1; s < T; ++s) dr[s] = 0.0f;
      }
      gemm(false, false, T, hd, T, 1.0f, ds, T, k + off, C, 1.0f, dq + off, C);
      gemm(true, false, T, hd, T, 1.0f, ds, T, q + off, C, 1.0f, dk + off, C);
    }
}

struct Inputs {
  int B, T, nh, hd;
  std::vector<float> q, k, v, dout, out, dq, dk, dv;
  explicit Inputs(const benchmark::State& state)
      : B(int(state.range(0))), T(int(state.range(1))), nh(int(state.range(2))),
        hd(int(state.range(3))) {
    const size_t n = size_t(B) * T * nh * hd;
    Rng rng(5);
    q = rand_uniform(rng, n);
    k = rand_uniform(rng, n);
    v = rand_uniform(rng, n);
    dout = rand_uniform(rng, n);
    out.resize(n);
    dq.resize(n);
    dk.resize(n);
    dv.resize(n);
  }
  double flops() const { return 12.0 * B * nh * double(T) * T * hd; }
};

void set_counters(benchmark::State& state, const Inputs& in, size_t saved_floats) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(in.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["saved_MiB"] = saved_floats * 4.0 / (1 << 20);
}

void BM_AttentionFused(benchmark::State& state) {
  Inputs in(state);
  std::vector<float> att(attention_saved_floats(in.B, in.T, in.nh, in.hd)),
      scratch(attention_scratch_floats(in.T));
  for (auto _ : state) {
    attention_forward(in.out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), in.B, in.T,
                      in.nh, in.hd);
    attention_backward(in.dq.data(), in.dk.data(), in.dv.data(), in.dout.data(), in.q.data(),
                       in.k.data(), in.v.data(), att.data(), in.B, in.T, in.nh, in.hd,
                       scratch.data());
    benchmark::DoNotOptimize(in.dq.data());
  }
  set_counters(state, in, att.size());
}

void BM_AttentionUnfused(benchmark::State& state) {
  Inputs in(state);
  std::vector<float> att(size_t(in.B) * in.nh * in.T * in.T), scratch(size_t(in.T) * in.T);
  for (auto _ : state) {
    unfused_forward(in.out.data(), att.data(), in.q.data(), in.k.data(), in.v.data(), in.B, in.T,
                    in.nh, in.hd);
    unfused_backward(in.dq.data(), in.dk.data(), in.dv.data(), in.dout.data(), in.q.data(),
                     in.k.data(), in.v.data(), att.data(), in.B, in.T, in.nh, in.hd, scratch.data());
    benchmark::DoNotOptimize(in.dq.data());
  }
  set_counters(state, in, att.size());
}

// B, T, nh, hd: the tiny model's micro-batch of 8 sequences, long sequences at its head shape,
// and wider heads.
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({8, 128, 4, 32})
      ->Args({1, 1024, 4, 32})
      ->Args({1, 2048, 4, 32})
      ->Args({2, 256, 8, 64})
      ->Args({1, 2048, 2, 128});
  b->ArgNames({"B", "T", "nh", "hd"})->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime();
}
BENCHMARK(BM_AttentionFused)->Apply(shapes);
BENCHMARK(BM_AttentionUnfused)->Apply(shapes);

}  // namespace
