// The SwiGLU feed-forward block shared by dense layers, shared experts and routed experts:
//   g = x·gate^T, u = x·up^T  [N,F];  h = silu(g)·u  [N,F];  y = h·down^T  [N,H]
// Weights in Hugging Face layout: gate, up [F,H]; down [H,F]. g, u, h are kept for backward.
// The grouped form runs E experts over contiguous, uneven row segments (no padding rows):
// rows [offsets[e], offsets[e+1]) use expert e, whose weights sit at gate + e·F·H, up + e·F·H,
// down + e·H·F. An empty segment costs nothing.
#pragma once
#include <cstdint>

namespace moe::kernels {

struct MlpWeights {
  const float* gate = nullptr;  // [F,H] (stacked: [E,F,H])
  const float* up = nullptr;    // [F,H] (stacked: [E,F,H])
  const float* down = nullptr;  // [H,F] (stacked: [E,H,F])
};
struct MlpGrads {
  float* gate = nullptr;
  float* up = nullptr;
  float* down = nullptr;
};

// Wall seconds inside the SwiGLU blocks, by part, added up while a recorder is installed on the
// execution context (ExecContext::set_mlp_step_times; benchmarks and profiling only; on a GPU
// each part is closed by a device sync). Each GEMM part counts both its products: gate_up the two
// forward GEMMs; down_bwd dh = dy·down and dW_down; gate_up_bwd dW_gate, dW_up and dx.
struct MlpStepTimes {
  double gate_up = 0, swiglu = 0, down = 0;              // forward
  double down_bwd = 0, swiglu_bwd = 0, gate_up_bwd = 0;  // backward
  double gemm() const { return gate_up + down + down_bwd + gate_up_bwd; }
};

// y = mlp(x) (y += when accumulate): swiglu_mlp_forward_up, then swiglu_mlp_forward_down.
void swiglu_mlp_forward(float* y, float* g, float* u, float* h, const float* x, const MlpWeights& w,
                        int N, int H, int F, bool accumulate = false);
// Its two halves, for a caller that runs them apart (a MoE layer's shared experts beside its token
// exchange): g, u = x·gate^T, x·up^T and h = silu(g)·u; then y (+)= h·down^T.
void swiglu_mlp_forward_up(float* g, float* u, float* h, const float* x, const MlpWeights& w, int N,
                           int H, int F);
void swiglu_mlp_forward_down(float* y, const float* h, const MlpWeights& w, int N, int H, int F,
                             bool accumulate);
// dx += ... (dx = ... when !accumulate_dx: dx need not be initialised), dw += ... ; scratch holds
// 2·N·F floats.
void swiglu_mlp_backward(float* dx, const MlpGrads& dw, const float* dy, const float* x,
                         const float* g, const float* u, const float* h, const MlpWeights& w, int N,
                         int H, int F, float* scratch, bool accumulate_dx = true);

// offsets_E1 has E+1 entries (exclusive prefix sums; offsets[E] = total rows).
void grouped_swiglu_forward(float* y, float* g, float* u, float* h, const float* x,
                            const int32_t* offsets_E1, int E, const MlpWeights& w, int H, int F);
// dx rows are written (each row is in exactly one segment; dx need not be initialised), dw += ... ;
// scratch holds 2·(total rows)·F floats.
void grouped_swiglu_backward(float* dx, const MlpGrads& dw, const float* dy, const float* x,
                             const float* g, const float* u, const float* h,
                             const int32_t* offsets_E1, int E, const MlpWeights& w, int H, int F,
                             float* scratch);

}  // namespace moe::kernels
