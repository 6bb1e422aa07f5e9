// The MoE block as a straight line of named steps. See moe_layer.h.
//   forward:  route -> layout -> dispatch (gather) -> experts -> combine -> + shared experts
//   backward: shared' -> combine' -> experts' -> dispatch' (scatter-add) -> route'
// Only dispatch and combine will communicate (expert parallelism inserts an exchange between the
// gather and the experts, and between the experts and the combine); every other step must stay
// local. On one rank nothing communicates yet. The padded baseline runs the same steps with the
// [E·C] padded layout and expert offsets e·C.
// Legend: T tokens, H hidden, F expert ffn, Fs shared ffn, E experts, k slots, N expert-buffer rows
// (R kept rows, or E·C when padded).
#include "moe/moe_layer.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/timer.h"
#include "moe/bench_moe_layer.h"
#include "moe/dispatch.h"
#include "kernels/device_select.h"
#include "kernels/elementwise.h"
#include "kernels/permute.h"

namespace moe::mixture {
namespace {

thread_local MoeStepTimes* g_step_times = nullptr;

// Adds the wall time of one step to a field of the installed recorder (no-op without one).
class StepTimer {
 public:
  // On a GPU the interval is closed by a device sync (only while a recorder is installed).
  explicit StepTimer(double MoeStepTimes::*field)
      : field_(field), start_(g_step_times ? synced_now() : 0.0) {}
  ~StepTimer() {
    if (g_step_times) g_step_times->*field_ += synced_now() - start_;
  }
  static double synced_now() {
    kernels::device_synchronize();
    return now_seconds();
  }
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

 private:
  double MoeStepTimes::*field_;
  double start_;
};

// Temporary buffers of backward and of the exchange steps are Buffers charged to
// cfg.scratch_tracker, so a rank's measured peak includes them.
struct Scratch : Buffer<float> {
  Scratch(size_t n, MemTracker* tracker) : Buffer<float>(n, tracker, kernels::active_device()) {}
};

// Reuses an activation buffer of the right size (every element is rewritten by forward, so a
// model that keeps its MoeActivations across steps pays no allocation or page faults after the
// first); reallocates, charged to tracker, otherwise. A reused buffer stays charged to the tracker
// it was first allocated with.
// On the active kernel device (kernels/device_select.h).
template <class B>
void ensure(B& buf, size_t n, MemTracker* tracker) {
  if (buf.size() != n || buf.device() != kernels::active_device())
    buf.resize(n, tracker, kernels::active_device());
}

RouterConfig router_config(const MoeConfig& cfg) {
  RouterConfig r{cfg.num_experts, cfg.top_k, cfg.norm_topk_prob, cfg.aux_loss_alpha, cfg.seq_aux,
                 {}};
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
    MOE_CHECK(!cfg.ep->exchange || !kernels::cuda_active(),
              "moe layer: expert parallelism on CUDA devices is not implemented yet "
              "(run EP on --device cpu, or one GPU rank without EP)");
  }
  MOE_CHECK(!cfg.padded || !kernels::cuda_active(),
            "moe layer: the capacity-padded baseline runs on the CPU only");
}

void local_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                   const MoeConfig& cfg, int T, MemTracker* tracker);
void local_backward(float* dx, float* dweight, const MoeGrads& grads, const float* dy,
                    const MoeActivations& act, const MoeWeights& w, const MoeConfig& cfg, int T);

// ---- Expert parallelism: steps 3-5 with the token exchange between them. ----
//
// Pairs leave in layout order (sorted by expert, so grouped by destination rank ascending) and
// arrive in canonical order (source rank, then the source's pair order). The experts need them
// grouped by local expert: local_row_of_recv maps a received pair to its row in that order
// (stable, so rows of one expert keep the canonical order).
void ep_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                const MoeConfig& cfg, int T, MemTracker* tracker) {
  const ExpertParallel& ep = *cfg.ep;
  const int H = cfg.hidden, F = cfg.ffn, E = cfg.num_experts, k = cfg.top_k;
  const int El = ep.num_local_experts(E), e0 = ep.expert_begin(E);
  const DispatchLayout& L = act.layout;
  {  // 3. dispatch: plan (counts + metadata), then the row exchange. Communicates.
    StepTimer st(&MoeStepTimes::dispatch);
    std::vector<int32_t> src_row(L.num_rows), dst_rank(L.num_rows), tag(L.num_rows);
    std::vector<float> value(L.num_rows);
    const float* wt = act.routing.topk_weight_TK.data();
    for (int e = 0; e < E; ++e) {
      for (int r = L.offsets_E1[e]; r < L.offsets_E1[e + 1]; ++r) {
        const int32_t slot = L.slot_of_row_R[r];
        src_row[r] = slot / k;
        dst_rank[r] = e / El;
        tag[r] = e - (e / El) * El;  // local expert id on the destination
        value[r] = wt[slot];
      }
    }
    act.plan = ep.exchange->plan(T, L.num_rows, src_row.data(), dst_rank.data(), tag.data(),
                                 value.data());
    const int R = act.plan.num_recv;
    // Regroup: counting sort of the received pairs by local expert.
    act.local_offsets.assign(El + 1, 0);
    for (int i = 0; i < R; ++i) act.local_offsets[act.plan.recv_tag[i] + 1]++;
    for (int e = 0; e < El; ++e) act.local_offsets[e + 1] += act.local_offsets[e];
    std::vector<int32_t> next(act.local_offsets.begin(), act.local_offsets.end() - 1);
    act.local_row_of_recv.resize(R);
    for (int i = 0; i < R; ++i) act.local_row_of_recv[i] = next[act.plan.recv_tag[i]]++;
    ensure(act.x_rows, static_cast<size_t>(R) * H, tracker);
    ensure(act.g, static_cast<size_t>(R) * F, tracker);
    ensure(act.u, static_cast<size_t>(R) * F, tracker);
    ensure(act.h, static_cast<size_t>(R) * F, tracker);
    ensure(act.y_rows, static_cast<size_t>(R) * H, tracker);
    Scratch recv(static_cast<size_t>(R) * H, cfg.scratch_tracker);
    ep.exchange->multicast(act.plan, x, recv.data(), H);
    kernels::scatter_rows(act.x_rows.data(), recv.data(), act.local_row_of_recv.data(), R, H);
  }
  (void)e0;
  {  // 4. experts on the local segments. Local.
    StepTimer st(&MoeStepTimes::experts);
    kernels::grouped_swiglu_forward(act.y_rows.data(), act.g.data(), act.u.data(), act.h.data(),
                                    act.x_rows.data(), act.local_offsets.data(), El, w.experts, H,
                                    F);
  }
  {  // 5. combine: weight each row on the expert side, reduce back to the token owners.
     //    Communicates.
    StepTimer st(&MoeStepTimes::combine);
    const int R = act.plan.num_recv;
    Scratch rows(static_cast<size_t>(R) * H, cfg.scratch_tracker);
    kernels::gather_scaled_rows(rows.data(), act.y_rows.data(), act.local_row_of_recv.data(),
                                act.plan.recv_value.data(), R, H);
    kernels::fill_zero(y, static_cast<size_t>(T) * H);
    ep.exchange->reduce(act.plan, rows.data(), y, H);
  }
}

// Backward of ep_forward: dy goes to the experts like x did (a dispatch), the experts' input
// gradients come back like y did (a combine), and the combine weights' gradients return as one
// float per pair. dtopk_weight [T,k] receives them (zeros for dropped pairs).
void ep_backward(float* dx, float* dtopk_weight, const MoeGrads& grads, const float* dy,
                 const MoeActivations& act, const MoeWeights& w, const MoeConfig& cfg, int T) {
  const ExpertParallel& ep = *cfg.ep;
  const int H = cfg.hidden, F = cfg.ffn, E = cfg.num_experts, k = cfg.top_k;
  const int El = ep.num_local_experts(E);
  const int R = act.plan.num_recv;
  Scratch dy_rows(static_cast<size_t>(R) * H, cfg.scratch_tracker);
  std::vector<float> dweight_recv(R);
  {  // 5'. combine': dy to the experts (communicates), then dy_row = w·dy, dweight = y_row·dy.
    StepTimer st(&MoeStepTimes::combine_bwd);
    Scratch recv(static_cast<size_t>(R) * H, cfg.scratch_tracker);
    ep.exchange->multicast(act.plan, dy, recv.data(), H);
    kernels::gather_scaled_rows_backward(dy_rows.data(), dweight_recv.data(), recv.data(),
                                         act.y_rows.data(), act.local_row_of_recv.data(),
                                         act.plan.recv_value.data(), R, H);
  }
  Scratch dx_rows(static_cast<size_t>(R) * H, cfg.scratch_tracker);
  {  // 4'. experts'. Local.
    StepTimer st(&MoeStepTimes::experts_bwd);
    Scratch scratch(2 * static_cast<size_t>(R) * F, cfg.scratch_tracker);
    kernels::grouped_swiglu_backward(dx_rows.data(), grads.experts, dy_rows.data(),
                                     act.x_rows.data(), act.g.data(), act.u.data(), act.h.data(),
                                     act.local_offsets.data(), El, w.experts, H, F, scratch.data());
  }
  {  // 3'. dispatch': input gradients back to the token owners (communicates), and the combine
     //     weights' gradients.
    StepTimer st(&MoeStepTimes::dispatch_bwd);
    Scratch rows(static_cast<size_t>(R) * H, cfg.scratch_tracker);
    kernels::gather_rows_by_index(rows.data(), dx_rows.data(), act.local_row_of_recv.data(), R, H);
    if (dx) ep.exchange->reduce(act.plan, rows.data(), dx, H);
    const DispatchLayout& L = act.layout;
    std::vector<float> dweight_src(L.num_rows);
    ep.exchange->return_values(act.plan, dweight_recv.data(), dweight_src.data());
    for (int r = 0; r < L.num_rows; ++r) dtopk_weight[L.slot_of_row_R[r]] = dweight_src[r];
  }
  (void)T;
  (void)k;
}

size_t expert_rows(const MoeActivations& act, const MoeConfig& cfg) {
  return cfg.padded ? act.padded_layout.num_rows() : static_cast<size_t>(act.layout.num_rows);
}
const int32_t* expert_offsets(const MoeActivations& act, const MoeConfig& cfg) {
  return cfg.padded ? act.padded_layout.offsets_E1.data() : act.layout.offsets_E1.data();
}

}  // namespace

MoeStepTimes* set_moe_step_times(MoeStepTimes* times) {
  MoeStepTimes* old = g_step_times;
  g_step_times = times;
  return old;
}

void moe_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                 const MoeConfig& cfg, int T, int num_seqs, MemTracker* tracker) {
  validate(cfg, T, num_seqs);
  const int H = cfg.hidden, E = cfg.num_experts, k = cfg.top_k, Fs = cfg.shared_ffn;
  const float cf = effective_capacity_factor(cfg);

  {  // 1. route: scores, top-k, combine weights, aux loss. Local (no communication).
    StepTimer st(&MoeStepTimes::route);
    router_forward(act.routing, x, w.gate_EH, T, H, router_config(cfg), num_seqs, tracker);
    act.aux_loss = act.routing.aux_loss;
  }
  {  // 2. layout: sort pairs by expert (and drop beyond capacity). Local: a pure function.
    StepTimer st(&MoeStepTimes::layout);
    const int32_t* idx = act.routing.topk_idx_TK.data();
    act.layout = build_dispatch_layout(idx, T, k, E, cf, kDefaultMinCapacity, tracker);
    if (cfg.padded) {
      act.padded_layout = build_padded_layout(idx, T, k, E, cf, kDefaultMinCapacity, tracker);
    } else {
      act.padded_layout = PaddedLayout{};
    }
  }
  if (cfg.ep && cfg.ep->exchange) {
    ep_forward(y, act, x, w, cfg, T, tracker);
  } else {
    local_forward(y, act, x, w, cfg, T, tracker);
  }
  // 6. shared experts on every token: y += shared(x). Local (replicated in the EP group).
  if (Fs > 0) {
    StepTimer st(&MoeStepTimes::shared);
    ensure(act.shared_g, static_cast<size_t>(T) * Fs, tracker);
    ensure(act.shared_u, static_cast<size_t>(T) * Fs, tracker);
    ensure(act.shared_h, static_cast<size_t>(T) * Fs, tracker);
    kernels::swiglu_mlp_forward(y, act.shared_g.data(), act.shared_u.data(), act.shared_h.data(),
                                x, w.shared, T, H, Fs, /*accumulate=*/true);
  } else {
    act.shared_g.release();
    act.shared_u.release();
    act.shared_h.release();
  }
}

namespace {
// Steps 3-5 when every expert is local: gather, grouped experts, weighted combine.
void local_forward(float* y, MoeActivations& act, const float* x, const MoeWeights& w,
                   const MoeConfig& cfg, int T, MemTracker* tracker) {
  const int H = cfg.hidden, F = cfg.ffn, E = cfg.num_experts;
  const size_t N = expert_rows(act, cfg);
  ensure(act.x_rows, N * H, tracker);
  ensure(act.g, N * F, tracker);
  ensure(act.u, N * F, tracker);
  ensure(act.h, N * F, tracker);
  ensure(act.y_rows, N * H, tracker);
  {  // 3. dispatch: gather token rows into expert order. Local copy now; under expert
     //    parallelism the row exchange (alltoallv) goes right after this gather.
    StepTimer st(&MoeStepTimes::dispatch);
    if (cfg.padded) {
      padded_dispatch_forward(act.x_rows.data(), x, act.padded_layout, H);
    } else {
      gather_rows_forward(act.x_rows.data(), x, act.layout, H);
    }
  }
  {  // 4. experts: grouped SwiGLU over the expert segments. Local (no communication).
    StepTimer st(&MoeStepTimes::experts);
    kernels::grouped_swiglu_forward(act.y_rows.data(), act.g.data(), act.u.data(), act.h.data(),
                                    act.x_rows.data(), expert_offsets(act, cfg), E, w.experts, H,
                                    F);
  }
  {  // 5. combine: y[t] = sum_j w_tj · y_row. Local now; under expert parallelism the rows'
     //    way back (the reverse exchange) goes right before this step.
    StepTimer st(&MoeStepTimes::combine);
    const float* wt = act.routing.topk_weight_TK.data();
    if (cfg.padded) {
      padded_combine_forward(y, act.y_rows.data(), wt, act.padded_layout, H, false);
    } else {
      combine_forward(y, act.y_rows.data(), wt, act.layout, H, false);
    }
  }
  (void)T;
}
}  // namespace

namespace {
// Steps 5'-3' when every expert is local: combine', experts', dispatch'.
void local_backward(float* dx, float* dweight, const MoeGrads& grads, const float* dy,
                    const MoeActivations& act, const MoeWeights& w, const MoeConfig& cfg, int T) {
  const int H = cfg.hidden, F = cfg.ffn, E = cfg.num_experts;
  const size_t N = expert_rows(act, cfg);
  // 5'. combine': dy_rows[row] = w · dy[t] (a dispatch of dy), dweight = dot(y_row, dy[t]).
  //     Under expert parallelism the exchange of dy_rows to the experts goes right after this.
  Scratch dy_rows(N * H, cfg.scratch_tracker);
  {
    StepTimer st(&MoeStepTimes::combine_bwd);
    const float* wt = act.routing.topk_weight_TK.data();
    if (cfg.padded) {
      padded_combine_backward(dy_rows.data(), dweight, dy, act.y_rows.data(), wt,
                              act.padded_layout, H);
    } else {
      combine_backward(dy_rows.data(), dweight, dy, act.y_rows.data(), wt, act.layout, H);
    }
  }

  // 4'. experts': dx_rows, expert weight gradients. Local.
  Scratch dx_rows(dx ? N * H : 0, cfg.scratch_tracker);
  {
    StepTimer st(&MoeStepTimes::experts_bwd);
    Scratch scratch(2 * N * F, cfg.scratch_tracker);
    kernels::grouped_swiglu_backward(dx_rows.data(), grads.experts, dy_rows.data(),
                                     act.x_rows.data(), act.g.data(), act.u.data(),
                                     act.h.data(), expert_offsets(act, cfg), E, w.experts, H, F,
                                     scratch.data());
  }

  // 3'. dispatch': dx[t] += sum_j dx_rows[row(t,j)] (a combine without weights). Under expert
  //     parallelism the exchange of dx_rows back to the token owners goes right before this.
  if (dx) {
    StepTimer st(&MoeStepTimes::dispatch_bwd);
    if (cfg.padded) {
      padded_gather_backward(dx, dx_rows.data(), act.padded_layout, H);
    } else {
      gather_rows_backward(dx, dx_rows.data(), act.layout, H);
    }
  }
  (void)T;
}
}  // namespace

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

  // 6'. shared experts: dx += shared'(dy). Local.
  if (Fs > 0) {
    StepTimer st(&MoeStepTimes::shared_bwd);
    Scratch scratch(2 * static_cast<size_t>(T) * Fs, cfg.scratch_tracker);
    kernels::swiglu_mlp_backward(dx, grads.shared, dy, x, act.shared_g.data(),
                                 act.shared_u.data(), act.shared_h.data(), w.shared, T, H, Fs,
                                 scratch.data());
  }

  Scratch dweight(static_cast<size_t>(T) * k, cfg.scratch_tracker);
  if (cfg.ep && cfg.ep->exchange) {
    ep_backward(dx, dweight.data(), grads, dy, act, w, cfg, T);
  } else {
    local_backward(dx, dweight.data(), grads, dy, act, w, cfg, T);
  }

  // 1'. route': through top-k weights, aux loss, softmax and the gate linear. Local.
  {
    StepTimer st(&MoeStepTimes::route_bwd);
    router_backward(dx, grads.gate_EH, dweight.data(), aux_grad, act.routing, x, w.gate_EH, H,
                    router_config(cfg));
  }
}

}  // namespace moe::mixture
