// The work of one micro-batch. See step_ops.h.
// Legend: N tokens per micro-batch per rank, Nm tokens in the MoE block (N / tp), R expert rows
// of the busiest rank, El local experts (E / ep), r = R / El rows per local expert.
#include "plan/step_ops.h"

#include <algorithm>

namespace moe::plan {

void PassOps::add(const PassOps& o) {
  gemms.insert(gemms.end(), o.gemms.begin(), o.gemms.end());
  attention.insert(attention.end(), o.attention.begin(), o.attention.end());
  elems += o.elems;
}

void add_linear(PassOps& fwd, PassOps& bwd, double M, double in, double out, double count) {
  if (M <= 0 || in <= 0 || out <= 0 || count <= 0) return;
  fwd.gemms.push_back({GemmForm::kNT, M, out, in, count});
  bwd.gemms.push_back({GemmForm::kNN, M, in, out, count});
  bwd.gemms.push_back({GemmForm::kTN, out, in, M, count});
}

namespace {
// The attention projections (in, out) per token; TP splits the heads.
void attention_linears(const PlanModel& m, int tp, double N, PassOps& fwd, PassOps& bwd) {
  const AttentionWidths w = attention_widths(m);
  const double H = m.hidden;
  if (m.has_mla()) {
    if (m.q_lora_rank > 0) {
      add_linear(fwd, bwd, N, H, m.q_lora_rank);
      add_linear(fwd, bwd, N, m.q_lora_rank, w.q / tp);
    } else {
      add_linear(fwd, bwd, N, H, w.q / tp);
    }
    add_linear(fwd, bwd, N, H, m.kv_lora_rank + m.qk_rope_head_dim);
    add_linear(fwd, bwd, N, m.kv_lora_rank, static_cast<double>(m.heads) * (m.qk_nope_head_dim + m.v_head_dim) / tp);
  } else {
    add_linear(fwd, bwd, N, H, w.q / tp);
    add_linear(fwd, bwd, N, H, w.k / tp);
    add_linear(fwd, bwd, N, H, w.v / tp);
  }
  add_linear(fwd, bwd, N, w.o / tp, H);
}
}  // namespace

LayerOps layer_ops(const PlanModel& m, int l, const Layout& lay, const RankShape& rs, int T,
                   const MemoryOptions& mo) {
  LayerOps o;
  const LayerActivation a = layer_activation(m, l, rs.micro_batch, T, lay, mo);
  const double N = static_cast<double>(rs.tokens), tp = lay.tp, Nm = N / tp, H = m.hidden;
  attention_linears(m, lay.tp, N, o.attn_fwd, o.attn_bwd);
  // MLA: the trainer pads Q, K and V to one head width, max(qk, v) (kernels/mla.h).
  const double head_width = m.has_mla() ? std::max(m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim)
                                        : m.head_dim;
  AttentionOp core{static_cast<double>(rs.micro_batch) * m.heads / tp, static_cast<double>(T), head_width,
                   false};
  o.attn_fwd.attention.push_back(core);
  core.backward = true;
  o.attn_bwd.attention.push_back(core);
  o.attn_fwd.elems = o.attn_bwd.elems = a.attention;
  o.moe = m.is_moe_layer(l);
  if (o.moe) {
    const double E = m.experts, El = E / lay.ep, F = m.moe_ffn;
    // Rows of the busiest rank (the others wait for it at the combine).
    o.rows = mo.padded || lay.ep == 1 ? a.rows : Nm * m.top_k * mo.time_imbalance;
    o.a2a_rows = mo.padded || lay.ep == 1 ? a.rows : Nm * m.top_k * mo.a2a_imbalance;
    const double r = o.rows / El;                                             // rows per local expert
    add_linear(o.ffn_fwd, o.ffn_bwd, Nm, H, E);                               // router
    add_linear(o.ffn_fwd, o.ffn_bwd, r, H, F, El * (m.expert_matrices - 1));  // gate (+ up)
    add_linear(o.ffn_fwd, o.ffn_bwd, r, F, H, El);                            // down
    if (mo.shared_experts && m.shared_ffn > 0) {
      add_linear(o.ffn_fwd, o.ffn_bwd, Nm, H, m.shared_ffn, 2);
      add_linear(o.ffn_fwd, o.ffn_bwd, Nm, m.shared_ffn, H);
    }
  } else {
    const double I = static_cast<double>(m.dense_ffn) / tp;
    add_linear(o.ffn_fwd, o.ffn_bwd, N, H, I, 2);
    add_linear(o.ffn_fwd, o.ffn_bwd, N, I, H);
  }
  o.ffn_fwd.elems = o.ffn_bwd.elems = a.ffn;
  o.dropped = a.full - a.kept;
  return o;
}

void head_ops(const PlanModel& m, const RankShape& rs, int tp, PassOps& fwd, PassOps& bwd) {
  // The whole vocabulary on the rank's sequence shard (the head is replicated over TP).
  const double n = static_cast<double>(rs.tokens) / tp, H = m.hidden, V = static_cast<double>(m.vocab_size);
  add_linear(fwd, bwd, n, H, V);
  const double elems = 2 * n * H + 2 * n + 2 * n * V;  // final in/norm, rstd, losses, logits, probs
  fwd.elems += elems;
  bwd.elems += elems;
}

double embedding_elems(const PlanModel& m, const RankShape& rs, int tp) {
  return static_cast<double>(rs.tokens) / tp * m.hidden;
}

}  // namespace moe::plan
