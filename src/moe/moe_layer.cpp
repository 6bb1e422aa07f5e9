// The MoE block as a straight line of named steps. See moe_layer.h.
//   forward:  route -> layout -> dispatch -> experts -> combine -> + shared experts
//   backward: shared' -> combine' -> experts' -> dispatch' -> route'
// Dispatch and combine (and their adjoints) are the token dispatcher's (token_dispatcher.h): the
// local one (padding-free, or the padded baseline with expert offsets e·C) or the one over the
// expert-parallel exchange, which alone communicates. Every other step must stay local.
// Legend: T tokens, H hidden, F expert ffn, Fs shared ffn, E experts, k slots, N expert-buffer rows
// (R kept rows, or E·C when padded).
#include "moe/moe_layer.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include "core/background.h"
#include "core/error.h"
#include "core/timer.h"
#include "moe/step_times.h"
#include "moe/token_dispatcher.h"
#include "kernels/device_select.h"
#include "kernels/gemm.h"
#include "kernels/permute.h"
#include "kernels/field_timer.h"
#include "kernels/router_ops.h"

namespace moe::mixture {
namespace {

// Adds the wall time of one step to a field of the layer's recorder (no-op without one).
struct StepTimer : kernels::FieldTimer<MoeStepTimes> {
  StepTimer(const MoeConfig& cfg, double MoeStepTimes::*field) : FieldTimer(cfg.step_times, field) {}
};

// Installs the routed experts' part recorder (MoeStepTimes::expert_parts) on the execution
// context for one scope, when the layer has a step recorder.
class ExpertPartsTimer {
 public:
  explicit ExpertPartsTimer(const MoeConfig& cfg)
      : installed_(cfg.step_times != nullptr),
        old_(installed_ ? kernels::current_context().set_mlp_step_times(&cfg.step_times->expert_parts)
                        : nullptr) {}
  ~ExpertPartsTimer() {
    if (installed_) kernels::current_context().set_mlp_step_times(old_);
  }
  ExpertPartsTimer(const ExpertPartsTimer&) = delete;
  ExpertPartsTimer& operator=(const ExpertPartsTimer&) = delete;

 private:
  bool installed_;
  kernels::MlpStepTimes* old_;
};

// Temporary buffers of backward and of the exchange steps are Buffers charged to
// cfg.scratch_tracker, so a rank's measured peak includes them.
struct Scratch : Buffer<float> {
  Scratch(size_t n, MemTracker* tracker) : Buffer<float>(n, tracker, kernels::active_device()) {}
};

using kernels::ensure_buffer;

RouterConfig router_config(const MoeConfig& cfg) {
  RouterConfig r;
  r.num_experts = cfg.num_experts;
  r.top_k = cfg.top_k;
  r.norm_topk_prob = cfg.norm_topk_prob;
  r.aux_loss_alpha = cfg.aux_loss_alpha;
  r.seq_aux = cfg.seq_aux;
  r.sigmoid = cfg.sigmoid;
  r.score_bias_E = cfg.score_bias_E;
  r.routed_scaling_factor = cfg.routed_scaling_factor;
  r.n_group = cfg.n_group;
  r.topk_group = cfg.topk_group;
  if (cfg.ep) r.reduce_stats = cfg.ep->reduce_aux_stats;
  return r;
}

// The capacity factor the layouts use: the padded path always has one (1.0 unless set).
float effective_capacity_factor(const MoeConfig& cfg) {
  if (cfg.padded && cfg.capacity_factor <= 0.0f) return 1.0f;
  return cfg.capacity_factor;
}

void validate(const MoeConfig& cfg, int T, int num_seqs) {
  MOE_CHECK(cfg.hidden > 0 && cfg.ffn > 0, "moe layer: hidden=", cfg.hidden, " ffn=", cfg.ffn,
            " must be > 0");
  MOE_CHECK(cfg.num_experts > 0, "moe layer: num_experts=", cfg.num_experts, " must be > 0");
  MOE_CHECK(cfg.top_k >= 1 && cfg.top_k <= cfg.num_experts, "moe layer: top_k=", cfg.top_k,
            " must be in [1, num_experts=", cfg.num_experts, "]");
  MOE_CHECK(cfg.shared_ffn >= 0, "moe layer: shared_ffn=", cfg.shared_ffn, " must be >= 0");
  MOE_CHECK(cfg.capacity_factor >= 0.0f, "moe layer: capacity_factor=", cfg.capacity_factor,
            " must be >= 0 (0 = dropless)");
  MOE_CHECK(T >= 0, "moe layer: T=", T);
  MOE_CHECK(num_seqs >= 1, "moe layer: num_seqs=", num_seqs, " must be >= 1");
  if (cfg.ep) {
    MOE_CHECK(cfg.ep->size >= 1 && cfg.num_experts % cfg.ep->size == 0 &&
                  (cfg.ep->exchange || cfg.ep->size == 1),
              "moe layer: expert parallelism over ", cfg.ep->size, " ranks needs an exchange and ",
              "E=", cfg.num_experts, " divisible by it");
    MOE_CHECK(!cfg.padded || !cfg.ep->exchange, "moe layer: the capacity-padded baseline is single-rank only; "
                                                "expert parallelism uses the padding-free layout");
  }
  MOE_CHECK(!cfg.padded || !kernels::cuda_active(),
            "moe layer: the capacity-padded baseline runs on the CPU only");
}

// --comm.overlap applies: an exchange to hide, shared experts to hide it with, and host compute
// (on a GPU the kernels are already asynchronous; the staged exchange would serialise behind them).
bool overlaps_shared(const MoeConfig& cfg) {
  return cfg.ep && cfg.ep->exchange && cfg.ep->overlap_shared && cfg.shared_ffn > 0 &&
         !kernels::cuda_active();
}

// One overlap window: the shared-expert work on a second thread while the caller exchanges, on
// the worker of the caller's execution context (same device and precision, workspaces of its
// own). close() waits for it and books the figures (when the layer has a recorder): the work's own
// time, the exchange time it hid, and the caller's wait for it in `wait_field` (shared or shared').
class OverlapWindow {
 public:
  OverlapWindow(const MoeConfig& cfg, std::function<void()> work, double MoeStepTimes::*wait_field)
      : times_(cfg.step_times),
        wait_field_(wait_field),
        t0_(now_seconds()),
        work_([&worker = kernels::current_context().worker(), f = std::move(work)] {
          kernels::ContextScope on(worker);
          f();
        }) {}
  void close() {
    const double a2a = now_seconds() - t0_;  // the caller's side: the exchange and its bookkeeping
    const double t1 = now_seconds();
    const double work = work_.join();
    if (times_) {
      times_->*wait_field_ += now_seconds() - t1;
      times_->overlap_work += work;
      times_->a2a_hidden += std::min(a2a, work);
    }
  }

 private:
  MoeStepTimes* times_;
  double MoeStepTimes::*wait_field_;
  double t0_;
  BackgroundWork work_;
};

// The shared experts' gate (Qwen2-MoE, MoeWeights::shared_gate_H) as the router's sigmoid scoring
// of one expert with k = 1: a = sigmoid(x · g) and its backward da -> dz = da · a · (1 - a).
kernels::math::RouterScoring gate_scoring() {
  kernels::math::RouterScoring s;
  s.sigmoid = true;
  return s;
}

// y[T,H] += a_t · shared(x)_t, shared(x) from the up half (act.shared_h) into act.shared_y.
void gated_shared_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w, int T,
                          int H, int Fs, MemTracker* tracker) {
  ensure_buffer(act.shared_y, static_cast<size_t>(T) * H, tracker);
  ensure_buffer(act.shared_gate, T, tracker);
  ensure_buffer(act.shared_gate_w, T, tracker);
  ensure_buffer(act.shared_gate_idx, T, tracker);
  if (act.shared_rows.size() != static_cast<size_t>(T) || act.shared_rows.device() != kernels::active_device()) {
    std::vector<int32_t> rows(T);
    for (int t = 0; t < T; ++t) rows[t] = t;
    ensure_buffer(act.shared_rows, T, tracker);
    device_copy(act.shared_rows.device(), act.shared_rows.data(), Device::kCpu, rows.data(),
                rows.size() * sizeof(int32_t));
  }
  kernels::swiglu_mlp_forward_down(act.shared_y.data(), act.shared_h.data(), w.shared, T, H, Fs,
                                   /*accumulate=*/false);
  kernels::linear_forward(act.shared_gate.data(), x, w.shared_gate_H, T, H, 1);
  kernels::router_topk(act.shared_gate.data(), act.shared_gate_idx.data(), act.shared_gate_w.data(), T,
                       1, 1, /*renorm=*/false, gate_scoring());
  kernels::combine_rows(y, act.shared_y.data(), act.shared_gate_w.data(), act.shared_rows.data(), T, 1,
                        H, /*accumulate=*/true);
}

// Its backward: ds = a · dy (the shared experts' d output), da = dot(s, dy), dz = da · a(1 - a);
// dg += dz^T · x, dx += dz · g, then the shared experts' own backward from ds. scratch holds
// gated_shared_scratch floats (allocated by the caller: this may run beside the exchange); each
// part is written whole before it is read.
size_t gated_shared_scratch(int T, int H, int Fs) {
  return 2 * static_cast<size_t>(T) * Fs + static_cast<size_t>(T) * H + 2 * static_cast<size_t>(T);
}
void gated_shared_backward(float* dx, const MoeGrads& grads, const float* dy, const MoeActivations& act,
                           const float* x, const MoeWeights& w, int T, int H, int Fs, float* scratch) {
  float* ds = scratch + 2 * static_cast<size_t>(T) * Fs;  // [T,H]
  float* da = ds + static_cast<size_t>(T) * H;            // [T]
  float* dz = da + T;                                     // [T]
  kernels::combine_rows_backward(ds, da, dy, act.shared_y.data(), act.shared_gate_w.data(),
                                 act.shared_rows.data(), T, 1, H);
  kernels::router_topk_backward(dz, act.shared_gate.data(), act.shared_gate_idx.data(), da, T, 1, 1,
                                /*renorm=*/false, nullptr, 1, 0.0f, gate_scoring());
  kernels::linear_backward(dx, grads.shared_gate_H, dz, x, w.shared_gate_H, T, H, 1);
  kernels::swiglu_mlp_backward(dx, grads.shared, ds, x, act.shared_g.data(), act.shared_u.data(),
                               act.shared_h.data(), w.shared, T, H, Fs, scratch);
}

}  // namespace

void moe_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                 const MoeConfig& cfg, int T, int num_seqs, MemTracker* tracker) {
  validate(cfg, T, num_seqs);
  const int H = cfg.hidden, E = cfg.num_experts, k = cfg.top_k, Fs = cfg.shared_ffn;
  const float cf = effective_capacity_factor(cfg);

  {  // 1. route: scores, top-k, combine weights, aux loss. Local (no communication).
    StepTimer st(cfg, &MoeStepTimes::route);
    router_forward(act.routing, x, w.gate_EH, T, H, router_config(cfg), num_seqs, tracker);
    act.aux_loss = act.routing.aux_loss;
  }
  {  // 2. layout: sort pairs by expert (and drop beyond capacity). Local: a pure function.
    StepTimer st(cfg, &MoeStepTimes::layout);
    const int32_t* idx = act.routing.topk_idx_TK.data();
    act.layout = build_dispatch_layout(idx, T, k, E, cf, kDefaultMinCapacity, tracker);
    if (cfg.padded) {
      act.padded_layout = build_padded_layout(idx, T, k, E, cf, kDefaultMinCapacity, tracker);
    } else {
      act.padded_layout = PaddedLayout{};
    }
  }
  const std::unique_ptr<TokenDispatcher> dispatcher = make_token_dispatcher(cfg);
  const int F = cfg.ffn;
  auto shared_buffers = [&] {
    ensure_buffer(act.shared_g, static_cast<size_t>(T) * Fs, tracker);
    ensure_buffer(act.shared_u, static_cast<size_t>(T) * Fs, tracker);
    ensure_buffer(act.shared_h, static_cast<size_t>(T) * Fs, tracker);
  };
  // --comm.overlap: 6a (the shared experts' gate, up and SwiGLU) beside step 3 (the exchange). Its
  // buffers are allocated first: the work beside the exchange must not allocate.
  std::optional<OverlapWindow> overlap;
  if (overlaps_shared(cfg)) {
    {
      StepTimer st(cfg, &MoeStepTimes::buffers);
      shared_buffers();
    }
    overlap.emplace(
        cfg, [&] { kernels::swiglu_mlp_forward_up(act.shared_g.data(), act.shared_u.data(),
                                                  act.shared_h.data(), x, w.shared, T, H, Fs); },
        &MoeStepTimes::shared);
  }
  {  // 3. dispatch: token rows to their experts' segments (expert parallelism: the counts, then
     //    the row exchange). Communicates only under expert parallelism.
    StepTimer st(cfg, &MoeStepTimes::dispatch);
    dispatcher->plan(act, T);
  }
  {  // The expert rows' buffers, kept for backward: reused when the row count is unchanged.
    StepTimer st(cfg, &MoeStepTimes::buffers);
    const size_t N = dispatcher->num_rows(act);
    ensure_buffer(act.x_rows, N * H, tracker);
    ensure_buffer(act.g, N * F, tracker);
    ensure_buffer(act.u, N * F, tracker);
    ensure_buffer(act.h, N * F, tracker);
    ensure_buffer(act.y_rows, N * H, tracker);
  }
  {
    StepTimer st(cfg, &MoeStepTimes::dispatch);
    dispatcher->dispatch(act.x_rows.data(), x, act);
  }
  if (overlap) overlap->close();
  {  // 4. experts: grouped SwiGLU over the (local) expert segments. Local (no communication).
    StepTimer st(cfg, &MoeStepTimes::experts);
    ExpertPartsTimer parts(cfg);
    kernels::grouped_swiglu_forward(act.y_rows.data(), act.g.data(), act.u.data(), act.h.data(),
                                    act.x_rows.data(), dispatcher->expert_offsets(act),
                                    dispatcher->num_local_experts(), w.experts, H, F);
  }
  {  // 5. combine: y[t] = sum_j w_tj · y_row (expert parallelism: weighted on the expert side,
     //    reduced back to the token owners). Communicates only under expert parallelism.
    StepTimer st(cfg, &MoeStepTimes::combine);
    dispatcher->combine(y, act.y_rows.data(), act);
  }
  // 6. shared experts on every token: y += shared(x). Local (replicated in the EP group). After
  //    combine, whether or not 6a ran beside the exchange: y's sums keep their order.
  if (Fs > 0) {
    StepTimer st(cfg, &MoeStepTimes::shared);
    if (!overlap) shared_buffers();
    if (!overlap)
      kernels::swiglu_mlp_forward_up(act.shared_g.data(), act.shared_u.data(), act.shared_h.data(),
                                     x, w.shared, T, H, Fs);
    if (w.shared_gate_H)
      gated_shared_forward(y, act, x, w, T, H, Fs, tracker);
    else
      kernels::swiglu_mlp_forward_down(y, act.shared_h.data(), w.shared, T, H, Fs, /*accumulate=*/true);
  } else {
    act.shared_g.release();
    act.shared_u.release();
    act.shared_h.release();
  }
}

void moe_backward(float* dx, const MoeGrads& grads, const float* dy, float aux_grad,
                  const MoeActivations& act, const float* x, const MoeWeights& w,
                  const MoeConfig& cfg, int T, int num_seqs) {
  validate(cfg, T, num_seqs);
  const int H = cfg.hidden, E = cfg.num_experts, k = cfg.top_k, Fs = cfg.shared_ffn;
  MOE_CHECK(act.routing.T == T && act.routing.E == E && act.routing.k == k,
            "moe_backward: activations were made for T=", act.routing.T, " E=", act.routing.E,
            " k=", act.routing.k, ", called with T=", T, " E=", E, " k=", k);
  MOE_CHECK(cfg.padded == (act.padded_layout.E == E), "moe_backward: cfg.padded=", cfg.padded,
            " does not match the layout the forward built");

  // 6'. shared experts: dx += shared'(dy). Local. With --comm.overlap it runs beside 5' (combine''s
  //     exchange), which writes neither dx nor the shared experts' gradients: the same bits.
  std::optional<Scratch> shared_scratch;
  std::optional<OverlapWindow> overlap;
  if (Fs > 0) {
    StepTimer st(cfg, &MoeStepTimes::shared_bwd);
    shared_scratch.emplace(w.shared_gate_H ? gated_shared_scratch(T, H, Fs) : 2 * static_cast<size_t>(T) * Fs,
                           cfg.scratch_tracker);
    auto shared_bwd = [&, scratch = shared_scratch->data()] {
      if (w.shared_gate_H)
        gated_shared_backward(dx, grads, dy, act, x, w, T, H, Fs, scratch);
      else
        kernels::swiglu_mlp_backward(dx, grads.shared, dy, x, act.shared_g.data(), act.shared_u.data(),
                                     act.shared_h.data(), w.shared, T, H, Fs, scratch);
    };
    if (overlaps_shared(cfg))
      overlap.emplace(cfg, shared_bwd, &MoeStepTimes::shared_bwd);
    else
      shared_bwd();
  }

  const std::unique_ptr<TokenDispatcher> dispatcher = make_token_dispatcher(cfg);
  const int F = cfg.ffn;
  const size_t N = dispatcher->num_rows(act);
  const int32_t* offsets = dispatcher->expert_offsets(act);
  const int El = dispatcher->num_local_experts();
  // Backward's temporaries, sized as the planner's memory model counts them
  // (plan/memory_model.h: n·k + 2·R·H + 2·R·F): the caller's workspace, or fresh ones for this call.
  // combine' writes dweight and every row a pair owns, so dy is zeroed only for the padded layout
  // (for its padding rows); the experts write their dx rows and SwiGLU scratch before reading them.
  MoeBackwardWorkspace own;
  MoeBackwardWorkspace& ws = cfg.workspace ? *cfg.workspace : own;
  float *dweight, *dy_rows, *dx_rows, *scratch;
  {
    StepTimer st(cfg, &MoeStepTimes::buffers_bwd);
    auto take = [&](Buffer<float>& b, size_t n, bool zeroed) -> float* {
      if (n == 0) return nullptr;
      const Device dev = kernels::active_device();
      if (b.size() < n || b.device() != dev) {
        b.resize(n, cfg.scratch_tracker, dev);  // fresh: already zero
      } else if (zeroed) {
        device_memset_zero(dev, b.data(), n * sizeof(float));
      }
      return b.data();
    };
    dweight = take(ws.dweight, static_cast<size_t>(T) * k, false);
    dy_rows = take(ws.dy_rows, N * H, cfg.padded);
    dx_rows = take(ws.dx_rows, dx ? N * H : 0, false);
    scratch = take(ws.scratch, 2 * N * F, false);
  }
  // 5'. combine': dy_rows = w · dy[t] (a dispatch of dy), dweight = dot(y_row, dy[t]).
  {
    StepTimer st(cfg, &MoeStepTimes::combine_bwd);
    dispatcher->combine_backward(dy_rows, dweight, dy, act);
  }
  if (overlap) overlap->close();
  shared_scratch.reset();
  // 4'. experts': dx_rows, expert weight gradients. Local.
  {
    StepTimer st(cfg, &MoeStepTimes::experts_bwd);
    ExpertPartsTimer parts(cfg);
    kernels::grouped_swiglu_backward(dx_rows, grads.experts, dy_rows, act.x_rows.data(), act.g.data(),
                                     act.u.data(), act.h.data(), offsets, El, w.experts, H, F, scratch);
  }
  // 3'. dispatch': dx[t] += sum_j dx_rows[row(t,j)] (a combine without weights).
  if (dx) {
    StepTimer st(cfg, &MoeStepTimes::dispatch_bwd);
    dispatcher->dispatch_backward(dx, dx_rows, act);
  }

  // 1'. route': through top-k weights, aux loss, softmax and the gate linear. Local.
  {
    StepTimer st(cfg, &MoeStepTimes::route_bwd);
    router_backward(dx, grads.gate_EH, dweight, aux_grad, act.routing, x, w.gate_EH, H,
                    router_config(cfg));
  }
}

}  // namespace moe::mixture
