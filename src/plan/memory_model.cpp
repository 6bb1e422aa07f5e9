// The memory model. See memory_model.h for the terms.
// Legend: N tokens per micro-batch of a TP group, Nm = N / tp the rank's sequence shard (the
// residual stream, the head and the whole MoE block run on it), R expert rows held, H hidden,
// F expert width, Fs shared width, I dense width, V vocabulary, T sequence length.
#include "plan/memory_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/memory_sizes.h"
#include "moe/layout.h"

namespace moe::plan {

MemoryOptions memory_options(const ClusterProfile& c, Precision precision, bool zero1) {
  MemoryOptions o;
  if (precision == Precision::kFp32) {
    // The CPU trainer: fp32 weights and gradients, Adam m and v (no separate master copy).
    o.weight_bytes = 4;
    o.grad_bytes = 4;
    o.optimizer_bytes = 8;
    o.act_bytes = 4;
  }
  o.zero1 = zero1;
  o.attention_s2 = !c.fused_attention;
  o.a2a_buffers = c.kind == NodeKind::kGpu;
  o.reserved_bytes = c.reserved_bytes;
  return o;
}

MemoryOptions piper_paper_options() {
  MemoryOptions o;
  o.accounting = MemoryOptions::Accounting::kPiperPaper;
  o.embeddings = o.norms = o.router = o.shared_experts = false;
  o.workspace = o.pipeline_buffers = o.a2a_buffers = false;
  o.weight_bytes = 2;
  o.grad_bytes = 2;
  o.optimizer_bytes = 12;
  return o;
}

AttentionWidths attention_widths(const PlanModel& m) {
  AttentionWidths w;
  w.q = w.o = static_cast<double>(m.heads) * m.head_dim;
  w.k = w.v = m.kv_dim();
  if (m.has_mla()) {
    w.q = w.k = static_cast<double>(m.heads) * (m.qk_nope_head_dim + m.qk_rope_head_dim);
    w.v = w.o = static_cast<double>(m.heads) * m.v_head_dim;
    w.latent = m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim;
  }
  return w;
}

namespace {

double expert_rows(const PlanModel& m, double moe_tokens, const MemoryOptions& o) {
  if (o.padded) {
    const int C = mixture::expert_capacity(static_cast<int>(moe_tokens), m.top_k, m.experts,
                                           static_cast<float>(o.capacity_factor));
    return static_cast<double>(m.experts) * C;
  }
  return moe_tokens * m.top_k * o.routing_imbalance;
}

}  // namespace

LayerActivation layer_activation(const PlanModel& m, int l, long long Bm, int T, const Layout& lay,
                                 const MemoryOptions& o) {
  const model::ModelConfig shadow = shadow_config(m);
  const double N = static_cast<double>(Bm) * T, H = m.hidden, tp = lay.tp;
  const double Nm = N / tp;  // the sequence shard: SSMB routes it, the residual stream lives on it
  const bool moe = m.is_moe_layer(l);
  LayerActivation a;
  a.rows = moe ? expert_rows(m, Nm, o) : 0;
  // The trainer's size function for this shape (its moe part on the MoE block's tokens).
  const model::LayerActivationSizes s = model::layer_activation_elems(shadow, static_cast<int>(Bm), T, 0);
  const double s2 = static_cast<double>(Bm) * m.heads * T * T;
  // Attention: 8·N·H + 2·N + the flash kernel's state (row lse B·nh·T + a copy of out N·H) in
  // the trainer. Widths other than H (GQA k/v, MLA's q/k/v/out and latents, explicit head_dim)
  // add their difference. TP (Megatron with sequence parallelism) splits q, k, v, attn_out and
  // the state by heads, and keeps x, h, both rstd and an MoE layer's ln2 on the sequence shard;
  // ln1 and a dense layer's ln2 stay gathered [N, H] (the column-parallel GEMMs' inputs, kept
  // for their weight gradients). attention_s2 models an unfused kernel instead: the B·nh·T²
  // probabilities in place of that state.
  AttentionWidths w = attention_widths(m);
  // A model the trainer runs (its other families included, model/family.h): the size function
  // already has its widths, k and v repeated to every query head under GQA (attention_proj.h).
  double A_trainer = H;
  if (m.trainer_config) {
    w.k = w.v = w.q;
    A_trainer = static_cast<double>(shadow.num_attention_heads) * shadow.head_dim();
  }
  const double lse = static_cast<double>(Bm) * m.heads * T;
  const double state = lse + N * w.o;
  a.attention = static_cast<double>(s.attention) + N * (w.sum() - 4 * A_trainer) + N * w.latent +
                (state - static_cast<double>(s.attention_state));
  double sharded = N * (w.sum() + 2 * H + (moe ? H : 0)) + 2 * N + state;
  if (shadow.qk_norm())  // QK-norm's kept q, k and rstd split by heads as well
    sharded += N * (A_trainer + static_cast<double>(shadow.kv_heads()) * shadow.head_dim()) +
               N * (shadow.num_attention_heads + shadow.kv_heads());
  a.attention -= (1 - 1 / tp) * sharded;
  if (o.attention_s2) a.attention += (s2 - state) / tp;
  if (moe) {
    const double R = a.rows;
    const double Fs_trainer = static_cast<double>(shadow.shared_ffn());
    size_t R_int = static_cast<size_t>(std::llround(R));
    // The MoE part on the shard's Nm tokens as the trainer calls it (Model::moe_sequences): its
    // Bm/tp whole sequences, else one run of Nm tokens (only the per-sequence aux statistics,
    // B·E floats with seq_aux, count sequences).
    const long long seqs = Bm % lay.tp == 0 ? Bm / lay.tp : 1;
    const model::LayerActivationSizes sm = model::layer_activation_elems(
        shadow, static_cast<int>(seqs), static_cast<int>(std::llround(Nm / seqs)), R_int);
    a.ffn = static_cast<double>(sm.moe_ffn);
    if (m.expert_matrices == 2) a.ffn -= R * m.moe_ffn;  // keeps pre- and post-activation only
    a.ffn += 3 * Nm * (m.shared_ffn - Fs_trainer);       // shared width not a multiple of F
    if (!o.shared_experts) a.ffn -= 3 * Nm * m.shared_ffn;
    if (o.padded) {
      // [T, E, C] combine weights (activation precision) + dispatch mask (1 byte).
      const double C = R / m.experts;
      a.ffn += Nm * m.experts * C * (1 + 1 / o.act_bytes);
    }
  } else {
    a.ffn = static_cast<double>(s.dense_ffn) / tp;
  }
  a.input = static_cast<double>(s.input) / tp;  // x, on the shard
  a.full = a.attention + a.ffn;
  if (lay.recompute == Recompute::kFull) a.kept = a.input;
  else if (lay.recompute == Recompute::kMoe && moe) a.kept = a.attention;
  else a.kept = a.full;
  return a;
}

namespace {

// Parameters a rank of stage [first, first + n) holds: replicated ones and its routed experts.
struct StageParams {
  double replicated = 0, experts = 0;
};
StageParams stage_params(const PlanModel& m, int first, int n, bool first_stage, bool last_stage,
                         const Layout& lay, const MemoryOptions& o) {
  StageParams p;
  for (int l = first; l < first + n; ++l) {
    LayerParams lp = layer_params(m, l);
    p.replicated += lp.attention / lay.tp + lp.dense_ffn / lay.tp + (o.norms ? lp.norms : 0) +
                    (o.router ? lp.router : 0) + (o.shared_experts ? lp.shared : 0);
    if (lp.experts > 0) p.experts += lp.per_expert * (static_cast<double>(lp.experts) / lay.ep);
  }
  if (o.embeddings) {
    // Replicated over TP (not vocab-parallel): the lookup and the head run on the shard's rows.
    const double VH = static_cast<double>(m.vocab_size) * m.hidden;
    if (first_stage) p.replicated += VH;
    if (last_stage) p.replicated += (m.tied_embeddings && first_stage ? 0 : VH) + (o.norms ? m.hidden : 0);
  }
  return p;
}

void fill_state(StageMemory& st, const StageParams& p, const Layout& lay, const MemoryOptions& o) {
  st.param_count = p.replicated + p.experts;
  st.params = st.param_count * o.weight_bytes;
  st.grads = st.param_count * o.grad_bytes;
  // ZeRO-1: replicated tensors are shared by every data rank (dp · ep) of the stage, experts by dp.
  st.optimizer = o.zero1 ? o.optimizer_bytes * (p.replicated / lay.data_ranks() + p.experts / lay.dp)
                         : o.optimizer_bytes * st.param_count;
}

// REFERENCE §3: M(i) = (L/PP)·(16·(4d² + (E/EP)·3dF) + (PP − i)·((12b/M)·s·d + (4b/M)·H·s²
//                      + (2bsk/(M·EP))·(3F + d)))
MemoryEstimate piper_paper(const PlanModel& m, const Layout& lay, const TrainShape& shape,
                           const MemoryOptions& o) {
  const RankShape rs = rank_shape(lay, shape);
  const double d = m.hidden, s = shape.seq_len, bm = static_cast<double>(rs.micro_batch);
  const double per_layer_params_bytes = [&] {
    StageParams p = stage_params(m, 0, 1, false, false, lay, o);
    return (p.replicated + p.experts) * (o.weight_bytes + o.grad_bytes + o.optimizer_bytes);
  }();
  const double act = 12 * bm * s * d + (o.attention_s2 ? 4 * bm * m.heads * s * s : 0) +
                     2 * bm * s * m.top_k / lay.ep * (m.expert_matrices * m.moe_ffn + d);
  const double lps = static_cast<double>(m.layers) / lay.pp;
  MemoryEstimate e;
  for (int i = 0; i < lay.pp; ++i) {
    StageMemory st;
    st.stage = i;
    st.num_layers = static_cast<int>(lps);
    st.first_layer = i * st.num_layers;
    st.in_flight = lay.pp - i;
    st.params = lps * per_layer_params_bytes;  // weights + grads + optimizer (the paper's 16 B)
    st.activations = lps * st.in_flight * act;
    st.kept_per_micro_batch = lps * act;
    st.total = st.params + st.activations;
    e.stages.push_back(st);
  }
  e.worst = 0;
  return e;
}

}  // namespace

namespace {

// The largest allocation of one micro-batch's forward and backward on a stage, in elements: what
// its layers and head keep plus the peak of the temporaries (the workspace terms of
// memory_model.h). N tokens of the TP group, n = N / tp of them on this rank's shard.
double micro_batch_peak(const PlanModel& m, const Layout& lay, const MemoryOptions& o, int first,
                        const std::vector<LayerActivation>& acts, double head, double N, int T) {
  const double H = m.hidden, V = static_cast<double>(m.vocab_size), n = N / lay.tp;
  const double Fs = o.shared_experts ? m.shared_ffn : 0, F = m.moe_ffn;
  const bool exchange = lay.ep > 1;  // the trainer's EP path (dispatch scratch, return rows)
  // TP: a row-parallel GEMM's [N, H] partial sums before their reduce-scatter (forward), and
  // d(out) gathered for its backward.
  const double partial = lay.tp > 1 ? N * H : 0, dy_gathered = partial;
  const double att_scratch = o.attention_s2 ? static_cast<double>(T) * T : 0;
  double kept = head;
  for (const LayerActivation& a : acts) kept += a.kept;
  // moe_backward's temporaries (d(combine weights) n·k, dy and dx rows, the SwiGLU scratch) live in
  // one workspace per model (mixture::MoeBackwardWorkspace), held from the first MoE backward on:
  // from the second step every moment below has it on top, sized for the stage's largest layer.
  double workspace = 0;
  for (size_t i = 0; i < acts.size(); ++i)
    if (m.is_moe_layer(first + static_cast<int>(i)))
      workspace = std::max(workspace, n * m.top_k + 2 * acts[i].rows * H + 2 * acts[i].rows * F);
  double peak = kept, prefix = 0;
  if (head > 0) peak = std::max(peak, kept + n * H + n * V + n * H);  // dx, dlogits, dln
  for (size_t i = 0; i < acts.size(); ++i) {
    const LayerActivation& a = acts[i];
    const bool moe = m.is_moe_layer(first + static_cast<int>(i));
    const double R = a.rows;
    const double scratch = exchange && moe ? std::max(0.0, R * H - 3 * n * Fs) : 0;
    // A forward of the layer on top of `base`: its tensors and dispatch scratch, with TP the
    // partial sums of a dense down, and of o_proj when the attention is (re)computed: then the
    // attention's tensors but ln2 and rstd2 are allocated.
    auto forward = [&](double base, bool attention) {
      double p = base + a.full + scratch + (moe ? 0 : partial);
      if (attention && partial > 0) p = std::max(p, base + a.attention - (moe ? n : N) * H - n + partial);
      return p;
    };
    peak = std::max(peak, forward(prefix + n * H, true));  // + its output
    // + dx, out
    if (a.kept < a.full) peak = std::max(peak, forward(prefix + 2 * n * H, lay.recompute == Recompute::kFull));
    double ffn_scratch;
    if (moe) {
      // On top of the workspace: the shared experts' scratch, then (EP) the exchange's received or
      // returned rows.
      ffn_scratch = std::max(2 * n * Fs, exchange ? R * H : 0);
    } else {
      ffn_scratch = 2 * N * m.dense_ffn / lay.tp;
    }
    const double dln_ffn = moe ? n * H : N * H;
    const double attn_grads = N * attention_widths(m).sum() / lay.tp + att_scratch;  // dattn dq dk dv
    peak = std::max(peak, prefix + a.full + n * H + dy_gathered +
                              std::max(dln_ffn + ffn_scratch, N * H + attn_grads));
    prefix += a.kept;
  }
  return peak + workspace;
}

}  // namespace

MemoryEstimate estimate_memory(const PlanModel& m, const Layout& lay, const TrainShape& shape,
                               const MemoryOptions& o) {
  MOE_CHECK(lay.pp >= 1 && lay.dp >= 1 && lay.ep >= 1 && lay.tp >= 1 && lay.micro_batches >= 1,
            "layout ", lay.describe(), ": every degree must be >= 1");
  if (o.accounting == MemoryOptions::Accounting::kPiperPaper) return piper_paper(m, lay, shape, o);
  const RankShape rs = rank_shape(lay, shape);
  const model::ModelConfig shadow = shadow_config(m);
  const int T = shape.seq_len;
  const long long Bm = rs.micro_batch;
  const double N = static_cast<double>(rs.tokens), H = m.hidden, Nm = N / lay.tp;
  const double B = o.act_bytes;
  const std::vector<int> split = split_stages(m.layers, lay.pp);

  MemoryEstimate e;
  int first = 0;
  for (int s = 0; s < lay.pp; ++s) {
    StageMemory st;
    st.stage = s;
    st.first_layer = first;
    st.num_layers = split[s];
    const bool is_first = s == 0, is_last = s == lay.pp - 1;
    fill_state(st, stage_params(m, first, split[s], is_first, is_last, lay, o), lay, o);

    std::vector<LayerActivation> acts;
    for (int l = first; l < first + split[s]; ++l) acts.push_back(layer_activation(m, l, Bm, T, lay, o));
    double head = 0;
    // The head keeps its rows of the shard only (T % tp == 0: exact).
    if (is_last && o.embeddings)
      head = static_cast<double>(model::head_kept_elems(shadow, static_cast<int>(Bm), T)) / lay.tp;
    double kept = head;
    for (const LayerActivation& a : acts) kept += a.kept;
    // One micro-batch's forward and backward peak, on top of the other in-flight ones.
    const double mb_peak = o.workspace ? micro_batch_peak(m, lay, o, first, acts, head, N, T) : kept;
    st.in_flight = max_in_flight(schedule_ops(lay.schedule, lay.pp, s, lay.micro_batches));
    st.kept_per_micro_batch = kept * B;
    st.activations = st.in_flight * kept * B;
    st.workspace = std::max(0.0, mb_peak - kept) * B;
    if (o.pipeline_buffers)
      st.comm += pipeline_buffer_slots(lay.schedule, lay.pp, s, lay.micro_batches) * Nm * H * B;
    if (o.a2a_buffers && lay.ep > 1 && m.num_moe_layers() > 0)
      st.comm += 2 * expert_rows(m, Nm, o) * H * B;
    st.reserved = o.reserved_bytes;
    st.total = st.params + st.grads + st.optimizer + st.activations + st.workspace + st.comm + st.reserved;
    e.stages.push_back(st);
    first += split[s];
  }
  for (size_t s = 1; s < e.stages.size(); ++s)
    if (e.stages[s].total > e.stages[e.worst].total) e.worst = static_cast<int>(s);
  return e;
}

DispatchBuffers dispatch_buffers(const PlanModel& m, long long tokens, const MemoryOptions& o) {
  DispatchBuffers d;
  if (m.num_moe_layers() == 0) return d;
  MemoryOptions pf = o, pd = o;
  pf.padded = false;
  pf.routing_imbalance = 1.0;
  pd.padded = true;
  d.rows_padding_free = expert_rows(m, static_cast<double>(tokens), pf);
  d.rows_padded = expert_rows(m, static_cast<double>(tokens), pd);
  d.capacity = static_cast<int>(d.rows_padded / m.experts);
  const double per_row = 2.0 * m.hidden + (m.expert_matrices == 2 ? 2.0 : 3.0) * m.moe_ffn;
  d.padding_free_bytes = d.rows_padding_free * per_row * o.act_bytes;
  d.padded_bytes = d.rows_padded * per_row * o.act_bytes;
  d.combine_tensor_bytes = static_cast<double>(tokens) * m.experts * d.capacity * (o.act_bytes + 1);
  return d;
}

}  // namespace moe::plan
