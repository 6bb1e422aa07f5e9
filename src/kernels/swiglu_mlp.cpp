// SwiGLU feed-forward block, single and grouped over experts. See swiglu_mlp.h.
// Legend: N rows, H hidden, F ffn;
//   g_NF = x·gate^T, u_NF = x·up^T, h_NF = silu(g)·u, y_NH = h·down^T.
// Every product is one BLAS call on the caller's buffers (no copies, no padding): forward 3 GEMMs,
// backward 6, i.e. 18·N·H·F flops for forward + backward.
#include "kernels/swiglu_mlp.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "core/error.h"
#include "core/timer.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/field_timer.h"
#include "kernels/gemm_bf16_cpu.h"

namespace moe::kernels {
namespace {

// Adds the wall time of one part to a field of the current context's recorder (no-op without one).
struct PartTimer : FieldTimer<MlpStepTimes> {
  explicit PartTimer(double MlpStepTimes::*field)
      : FieldTimer(current_context().mlp_step_times(), field) {}
};

void check_sizes(const char* who, int N, int H, int F) {
  MOE_CHECK(N >= 0 && H > 0 && F > 0, who, ": bad sizes N=", N, " H=", H, " F=", F);
}

}  // namespace

void swiglu_mlp_forward_up(float* g, float* u, float* h, const float* x, const MlpWeights& w, int N,
                           int H, int F) {
  check_sizes("swiglu_mlp_forward", N, H, F);
  if (N == 0) return;
  {
    PartTimer t(&MlpStepTimes::gate_up);
    const Bf16InputScope x_once(x, static_cast<size_t>(N) * H);  // gate and up read x
    linear_forward(g, x, w.gate, N, H, F);
    linear_forward(u, x, w.up, N, H, F);
  }
  PartTimer t(&MlpStepTimes::swiglu);
  swiglu_forward(h, g, u, static_cast<size_t>(N) * F);
}

void swiglu_mlp_forward_down(float* y, const float* h, const MlpWeights& w, int N, int H, int F,
                             bool accumulate) {
  check_sizes("swiglu_mlp_forward", N, H, F);
  if (N == 0) return;
  PartTimer t(&MlpStepTimes::down);
  linear_forward(y, h, w.down, N, F, H, accumulate);
}

void swiglu_mlp_forward(float* y, float* g, float* u, float* h, const float* x, const MlpWeights& w,
                        int N, int H, int F, bool accumulate) {
  swiglu_mlp_forward_up(g, u, h, x, w, N, H, F);
  swiglu_mlp_forward_down(y, h, w, N, H, F, accumulate);
}

void swiglu_mlp_backward(float* dx, const MlpGrads& dw, const float* dy, const float* x,
                         const float* g, const float* u, const float* h, const MlpWeights& w, int N,
                         int H, int F, float* scratch, bool accumulate_dx) {
  check_sizes("swiglu_mlp_backward", N, H, F);
  if (N == 0) return;
  MOE_CHECK(scratch != nullptr, "swiglu_mlp_backward: scratch (2·N·F floats) is null");
  float* dg = scratch;                               // [N,F]
  float* du = scratch + static_cast<size_t>(N) * F;  // [N,F]
  {
    PartTimer t(&MlpStepTimes::down_bwd);
    const Bf16InputScope dy_once(dy, static_cast<size_t>(N) * H);
    // dh[N,F] = dy[N,H] · down[H,F], written where dg will be
    gemm(false, false, N, F, H, 1.0f, dy, 0, w.down, 0, 0.0f, dg, 0);
    // dW_down[H,F] += dy^T · h
    if (dw.down) gemm(true, false, H, F, N, 1.0f, dy, 0, h, 0, 1.0f, dw.down, 0);
  }
  {
    PartTimer t(&MlpStepTimes::swiglu_bwd);
    swiglu_backward_inplace(dg, du, g, u, static_cast<size_t>(N) * F);
  }
  PartTimer t(&MlpStepTimes::gate_up_bwd);
  // x, dg and du are each read by two of the four GEMMs below.
  const Bf16InputScope x_once(x, static_cast<size_t>(N) * H);
  const Bf16InputScope dgdu_once(scratch, 2 * static_cast<size_t>(N) * F);
  // dW_gate[F,H] += dg^T · x ; dW_up[F,H] += du^T · x
  if (dw.gate) gemm(true, false, F, H, N, 1.0f, dg, 0, x, 0, 1.0f, dw.gate, 0);
  if (dw.up) gemm(true, false, F, H, N, 1.0f, du, 0, x, 0, 1.0f, dw.up, 0);
  // dx[N,H] (+)= dg · gate + du · up
  if (dx) {
    gemm(false, false, N, H, F, 1.0f, dg, 0, w.gate, 0, accumulate_dx ? 1.0f : 0.0f, dx, 0);
    gemm(false, false, N, H, F, 1.0f, du, 0, w.up, 0, 1.0f, dx, 0);
  }
}

namespace {

void check_offsets(const char* who, const int32_t* offsets_E1, int E) {
  MOE_CHECK(E >= 0 && offsets_E1 != nullptr, who, ": E=", E, " offsets=", offsets_E1);
  MOE_CHECK(offsets_E1[0] == 0, who, ": offsets[0] must be 0, got ", offsets_E1[0]);
  for (int e = 0; e < E; ++e) {
    MOE_CHECK(offsets_E1[e + 1] >= offsets_E1[e], who, ": offsets decrease at expert ", e, " (",
              offsets_E1[e], " -> ", offsets_E1[e + 1], ")");
  }
}

MlpWeights expert_weights(const MlpWeights& w, int e, int H, int F) {
  size_t fh = static_cast<size_t>(F) * H;
  return {w.gate + e * fh, w.up + e * fh, w.down + e * fh};
}

MlpGrads expert_grads(const MlpGrads& dw, int e, int H, int F) {
  size_t fh = static_cast<size_t>(F) * H;
  return {dw.gate ? dw.gate + e * fh : nullptr, dw.up ? dw.up + e * fh : nullptr,
          dw.down ? dw.down + e * fh : nullptr};
}

}  // namespace

// On the GPU the experts go product by product: each of the three (six backward) products is one
// grouped GEMM over every expert's segment (cuBLAS's grouped call in fp32: many small expert GEMMs
// in one launch instead of E launches that each leave most of the GPU idle), and the SwiGLU runs
// once over all rows. The same products as expert by expert, so the same results. On the CPU the
// experts go one after another (each expert's rows and weights stay in cache across its products).
namespace {

void grouped_forward_by_product(float* y, float* g, float* u, float* h, const float* x,
                                const int32_t* offsets_E1, int E, const MlpWeights& w, int H, int F) {
  std::vector<GemmProblem> gate, up, down;
  for (int e = 0; e < E; ++e) {
    const int n = offsets_E1[e + 1] - offsets_E1[e];
    if (n == 0) continue;
    const size_t r = static_cast<size_t>(offsets_E1[e]);
    const MlpWeights we = expert_weights(w, e, H, F);
    gate.push_back({false, true, n, F, H, x + r * H, 0, we.gate, 0, 0.0f, g + r * F, 0});
    up.push_back({false, true, n, F, H, x + r * H, 0, we.up, 0, 0.0f, u + r * F, 0});
    down.push_back({false, true, n, H, F, h + r * F, 0, we.down, 0, 0.0f, y + r * H, 0});
  }
  if (gate.empty()) return;
  const size_t rows = static_cast<size_t>(offsets_E1[E]);
  {
    PartTimer t(&MlpStepTimes::gate_up);
    gemm_grouped(gate.data(), static_cast<int>(gate.size()));
    gemm_grouped(up.data(), static_cast<int>(up.size()));
  }
  {
    PartTimer t(&MlpStepTimes::swiglu);
    swiglu_forward(h, g, u, rows * F);
  }
  PartTimer t(&MlpStepTimes::down);
  gemm_grouped(down.data(), static_cast<int>(down.size()));
}

// scratch: dg for every row [rows,F], then du [rows,F].
void grouped_backward_by_product(float* dx, const MlpGrads& dw, const float* dy, const float* x,
                                 const float* g, const float* u, const float* h,
                                 const int32_t* offsets_E1, int E, const MlpWeights& w, int H,
                                 int F, float* scratch) {
  const size_t rows = static_cast<size_t>(offsets_E1[E]);
  float* dg = scratch;
  float* du = scratch + rows * F;
  std::vector<GemmProblem> dh, d_down, d_gate, d_up, dx_gate, dx_up;
  for (int e = 0; e < E; ++e) {
    const int n = offsets_E1[e + 1] - offsets_E1[e];
    if (n == 0) continue;
    const size_t r = static_cast<size_t>(offsets_E1[e]);
    const MlpWeights we = expert_weights(w, e, H, F);
    const MlpGrads ge = expert_grads(dw, e, H, F);
    // dh[n,F] = dy · down, written where dg goes; dW_down[H,F] += dy^T · h
    dh.push_back({false, false, n, F, H, dy + r * H, 0, we.down, 0, 0.0f, dg + r * F, 0});
    if (ge.down) d_down.push_back({true, false, H, F, n, dy + r * H, 0, h + r * F, 0, 1.0f, ge.down, 0});
    // dW_gate[F,H] += dg^T · x ; dW_up[F,H] += du^T · x
    if (ge.gate) d_gate.push_back({true, false, F, H, n, dg + r * F, 0, x + r * H, 0, 1.0f, ge.gate, 0});
    if (ge.up) d_up.push_back({true, false, F, H, n, du + r * F, 0, x + r * H, 0, 1.0f, ge.up, 0});
    // dx[n,H] = dg · gate + du · up (its rows belong to this expert alone: written, not added)
    if (dx) {
      dx_gate.push_back({false, false, n, H, F, dg + r * F, 0, we.gate, 0, 0.0f, dx + r * H, 0});
      dx_up.push_back({false, false, n, H, F, du + r * F, 0, we.up, 0, 1.0f, dx + r * H, 0});
    }
  }
  if (dh.empty()) return;
  auto run = [](const std::vector<GemmProblem>& p) {
    if (!p.empty()) gemm_grouped(p.data(), static_cast<int>(p.size()));
  };
  {
    PartTimer t(&MlpStepTimes::down_bwd);
    run(dh);
    run(d_down);
  }
  {
    PartTimer t(&MlpStepTimes::swiglu_bwd);
    swiglu_backward_inplace(dg, du, g, u, rows * F);
  }
  PartTimer t(&MlpStepTimes::gate_up_bwd);
  run(d_gate);
  run(d_up);
  run(dx_gate);
  run(dx_up);  // after dx_gate: both write dx
}

}  // namespace

void grouped_swiglu_forward(float* y, float* g, float* u, float* h, const float* x,
                            const int32_t* offsets_E1, int E, const MlpWeights& w, int H, int F) {
  check_offsets("grouped_swiglu_forward", offsets_E1, E);
  if (cuda_active()) {
    check_sizes("grouped_swiglu_forward", offsets_E1[E], H, F);
    return grouped_forward_by_product(y, g, u, h, x, offsets_E1, E, w, H, F);
  }
  for (int e = 0; e < E; ++e) {
    int n = offsets_E1[e + 1] - offsets_E1[e];
    if (n == 0) continue;
    size_t r = static_cast<size_t>(offsets_E1[e]);
    swiglu_mlp_forward(y + r * H, g + r * F, u + r * F, h + r * F, x + r * H,
                       expert_weights(w, e, H, F), n, H, F);
  }
}

void grouped_swiglu_backward(float* dx, const MlpGrads& dw, const float* dy, const float* x,
                             const float* g, const float* u, const float* h,
                             const int32_t* offsets_E1, int E, const MlpWeights& w, int H, int F,
                             float* scratch) {
  check_offsets("grouped_swiglu_backward", offsets_E1, E);
  if (cuda_active()) {
    check_sizes("grouped_swiglu_backward", offsets_E1[E], H, F);
    return grouped_backward_by_product(dx, dw, dy, x, g, u, h, offsets_E1, E, w, H, F, scratch);
  }
  for (int e = 0; e < E; ++e) {
    int n = offsets_E1[e + 1] - offsets_E1[e];
    if (n == 0) continue;
    size_t r = static_cast<size_t>(offsets_E1[e]);
    // Each expert reuses the start of scratch (2·n·F floats): a smaller, cache-warm footprint.
    // Its dx rows are written, not added to: every row belongs to exactly one expert's segment.
    swiglu_mlp_backward(dx ? dx + r * H : nullptr, expert_grads(dw, e, H, F), dy + r * H, x + r * H,
                        g + r * F, u + r * F, h + r * F, expert_weights(w, e, H, F), n, H, F,
                        scratch, /*accumulate_dx=*/false);
  }
}

}  // namespace moe::kernels
