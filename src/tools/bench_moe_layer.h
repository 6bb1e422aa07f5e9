// `moetrain bench moe-layer`: one MoE layer, forward + backward, padding-free (X-MoE PFT) and
// capacity-padded side by side on the same random weights and inputs, against the 1024³ BLAS
// GFLOP/s measured in the same run. FLOPs count useful work only (real, kept rows), so padding
// shows up as lower GFLOP/s and dropping as a non-zero dropped fraction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "kernels/swiglu_mlp.h"
#include "moe/step_times.h"

namespace moe::mixture {

struct MoeBenchOptions {
  int tokens = 4096;              // T
  int hidden = 1024;              // H
  int experts = 64;               // E
  int topk = 6;                   // k
  int ffn = 704;                  // F
  float capacity_factor = 1.25f;  // of the padded path (GShard/DeepSpeed default 1.25)
  int shared = 0;                 // shared experts (shared ffn = shared · ffn)
  int warmup = 1, iters = 3;
  uint64_t seed = 1;
  float pft_capacity_factor = 0;  // of the padding-free path; 0 = dropless
  // Where the layer runs. On CUDA only the padding-free path runs (the padded baseline is a CPU
  // comparison), and the roofline is the same run's cuBLAS n³ GEMM (bf16 inputs when bf16).
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;  // GEMM inputs (bf16: CUDA or oneDNN), fp32 accumulation
  bool run_padded = true;                  // also the capacity-padded baseline (CPU only)
  bool breakdown = false;                  // the table adds each step's forward/backward ms
};

struct MoeBenchRow {
  std::string path;                             // "padding-free" or "padded"
  double fwd_ms = 0, bwd_ms = 0, total_ms = 0;  // medians over iters
  double expert_gemm_ms = 0;                    // inside grouped_swiglu forward + backward (median)
  MoeStepTimes steps;                           // each step's seconds, mean over iters (the breakdown)
  double gflops_layer = 0;                      // useful layer FLOPs / total time
  double gflops_expert = 0;                     // useful expert FLOPs / expert_gemm time
  double frac_of_blas_layer = 0, frac_of_blas_expert = 0;
  size_t activation_bytes = 0;  // held by forward for backward (exact, MemTracker)
  double dropped_fraction = 0;  // dropped (token, slot) pairs / (T·k)
  size_t padding_rows = 0;      // rows of zeros that went through the experts
  int checked_tokens = 0;       // tokens whose output was recomputed naively (nccl-tests style)
  int wrong_tokens = 0;         // of those, how many differ by more than 1e-3 (relative)
};

struct MoeBenchResult {
  double blas_gflops_1024 = 0;  // best GEMM GFLOP/s of the run: 1024³ sgemm (CPU), or the
  int blas_n = 1024;            // cuBLAS blas_n³ GEMM in the layer's precision (CUDA)
  std::vector<MoeBenchRow> rows;
  MoeBenchOptions opts;  // what was run
};

// Useful FLOPs of one forward + backward: router 2·T·H·E·3, routed experts 18·rows·H·F (forward
// 6·rows·H·F, backward twice that) over real rows only, shared experts 18·T·H·Fs.
double moe_layer_useful_flops(const MoeBenchOptions& opts, size_t real_rows);

MoeBenchResult run_moe_layer_bench(const MoeBenchOptions& opts);
std::string format_moe_bench_table(const MoeBenchResult& result);
std::string moe_bench_json(const MoeBenchResult& result);

}  // namespace moe::mixture
