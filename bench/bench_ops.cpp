// The op table (tests/ops/op_table.h) as Google Benchmarks: every entry of bench_ops() registers
// as Op/<name>/fwd and, where it has a backward, Op/<name>/bwd (the backward call as the table
// writes it, so where the kernel's backward needs forward's saved state the forward it reruns is
// timed and counted too), each with its FLOP count as a GFLOP/s counter (bytes as
// bytes_per_second for an op that moves data: a gather, a copy, the layout). The
// same entries at their test shapes are checked against naive references and finite differences
// by tests/test_kernels.cpp; a run here does not repeat that. The calls allocate their outputs
// and saved state (std::vector), as the table's entries do; at these sizes that is a few percent.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/gemm.h"
#include "ops/op_table.h"

namespace {

using moe::ops::Op;
using moe::ops::Tensors;
using moe::ops::Vec;

void set_rates(benchmark::State& state, double flops, double bytes) {
  if (flops > 0)
    state.counters["GFLOP/s"] =
        benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (bytes > 0) state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
  state.counters["blas_threads"] = moe::kernels::blas_threads();
}

void run_forward(benchmark::State& state, const Op& op) {
  moe::Rng rng(1);
  const Tensors in = op.make_inputs(rng);
  for (auto _ : state) {
    Vec out = op.forward(in);
    benchmark::DoNotOptimize(out.data());
  }
  set_rates(state, op.fwd_flops, op.fwd_bytes);
}

void run_backward(benchmark::State& state, const Op& op) {
  moe::Rng rng(1);
  const Tensors in = op.make_inputs(rng);
  const Vec dout = moe::ops::randn(rng, op.forward(in).size(), 1.0);
  Tensors grads;
  for (const Vec& t : in) grads.emplace_back(t.size(), 0.0f);
  for (auto _ : state) {
    op.backward(grads, in, dout);  // adds: the gradients grow, the work does not change
    benchmark::DoNotOptimize(grads.back().data());
  }
  set_rates(state, op.bwd_flops, 0.0);
}

// Names "Op/<name>/<fwd|bwd>/<shape>", the shape's spaces as commas (--benchmark_filter=Op/linear).
const bool registered = [] {
  static const std::vector<Op> table = moe::ops::bench_ops();
  for (const Op& op : table) {
    std::string shape = op.shape;
    for (char& c : shape)
      if (c == ' ') c = ',';
    benchmark::RegisterBenchmark(("Op/" + op.name + "/fwd/" + shape).c_str(),
                                 [&op](benchmark::State& s) { run_forward(s, op); })
        ->Unit(benchmark::kMillisecond)
        ->MeasureProcessCPUTime();
    if (!op.backward) continue;  // no backward kernel (gemm, copies, optimizer, layout)
    benchmark::RegisterBenchmark(("Op/" + op.name + "/bwd/" + shape).c_str(),
                                 [&op](benchmark::State& s) { run_backward(s, op); })
        ->Unit(benchmark::kMillisecond)
        ->MeasureProcessCPUTime();
  }
  return true;
}();

}  // namespace
