// The simulated step's work from the planner. See step_spec.h.
#include "tools/smpi/step_spec.h"

#include <algorithm>

#include "core/error.h"
#include "plan/search.h"
#include "plan/step_ops.h"

namespace moe::smpi {
namespace {

plan::TrainShape train_shape(const StepRequest& r, const plan::PlanModel& m, const plan::ClusterProfile& c) {
  MOE_CHECK(r.world >= 1, "moetrain_smpi_step: world size ", r.world, " must be >= 1");
  MOE_CHECK(r.tokens_per_rank >= 1, "--tokens-per-rank must be >= 1, got ", r.tokens_per_rank);
  MOE_CHECK(r.seq_len >= 0, "--seq-len must be >= 1, got ", r.seq_len);
  plan::TrainShape s;
  s.seq_len = r.seq_len > 0 ? r.seq_len : m.default_seq_len;
  s.precision = c.precision;
  const long long tokens = r.tokens_per_rank * r.world;
  MOE_CHECK(tokens % s.seq_len == 0, "--tokens-per-rank ", r.tokens_per_rank, " x ", r.world,
            " ranks = ", tokens, " tokens is not a whole number of sequences of ", s.seq_len);
  s.global_batch = tokens / s.seq_len;
  return s;
}

// The given layout, or the fastest the planner's search finds for this world (tp = 1).
plan::Layout choose_layout(const StepRequest& r, const plan::PlanModel& m, const plan::ClusterProfile& c,
                           const plan::TrainShape& shape, bool* searched) {
  *searched = r.layout.empty();
  if (!r.layout.empty()) {
    plan::Layout l = plan::parse_layout(r.layout);
    MOE_CHECK(l.world() == r.world, "--layout ", l.describe(), " has ", l.world(), " ranks, the run ",
              r.world);
    return l;
  }
  plan::SearchOptions o;
  o.gpus = r.world;
  o.shape = shape;
  o.top = 1;
  plan::SearchResult res = plan::search_plans(m, c, o);
  MOE_CHECK(!res.best.empty(), "the planner found no layout of ", m.name, " on ", r.world, " ranks of ",
            c.name, " that fits (", res.rejected.size(), " families rejected; see moetrain plan --explain)");
  return res.best.front().layout;
}

// The gradient all-reduces of stage s (layers [first, first + n)), tp = 1: the planner's
// gradient_sync (plan/time_model.cpp) and parallel::sync_gradients issue the same spans.
void gradient_calls(const StepSpec& sp, const plan::MemoryOptions& mo, int s, int first, int n, StageSpec& st) {
  const plan::PlanModel& m = sp.model;
  const plan::Layout& lay = sp.layout;
  const double H = m.hidden, V = static_cast<double>(m.vocab_size);
  const double embedding = mo.embeddings && s == 0 ? V * H : 0;
  const double head = mo.embeddings && s == lay.pp - 1 ? V * H + H : 0;
  double replicated = embedding, local = embedding + head;
  auto flush = [&]() {
    if (replicated > 0 && lay.data_ranks() > 1) st.grads.push_back({false, replicated * mo.grad_bytes});
    replicated = 0;
  };
  for (int l = first; l < first + n; ++l) {
    const plan::LayerParams p = plan::layer_params(m, l);
    replicated += p.attention + p.norms + p.dense_ffn + p.router;
    local += p.attention + p.norms + p.dense_ffn + p.router + p.shared;
    if (p.experts > 0) {
      flush();
      const double experts = p.per_expert * p.experts / lay.ep;
      if (lay.dp > 1) st.grads.push_back({true, experts * mo.grad_bytes});
      local += experts;
    }
    replicated += p.shared;
  }
  replicated += head;
  flush();
  const int world = lay.world();
  for (const GradCall& g : st.grads)
    st.grad_predicted_s += g.experts ? plan::gradient_allreduce_seconds(sp.cluster, world, lay.dp, lay.ep, g.bytes)
                                     : plan::gradient_allreduce_seconds(sp.cluster, world, lay.data_ranks(), 1, g.bytes);
  st.optimizer_s = sp.cluster.optimizer_s_per_param * local;
}

// Stage s's layers, each with its share of the planner's stage compute: weights are each layer's
// own passes at the profile's rates; the stage's embedding, head and recomputation are spread
// over them in the same proportion, so the layers sum to estimate_time's stage compute exactly.
void stage_layers(const StepSpec& sp, const plan::MemoryOptions& mo, int s, int first, int n, StageSpec& st) {
  const plan::ClusterProfile& c = sp.cluster;
  const double act = static_cast<double>(sp.rank.tokens) * sp.model.hidden * mo.act_bytes;
  const double scale = mo.act_bytes / (c.precision == Precision::kFp32 ? 4.0 : 2.0);
  const double ef = c.elem_fwd.at(act) * scale, eb = c.elem_bwd.at(act) * scale;
  double sum_f = 0, sum_b = 0;
  for (int l = first; l < first + n; ++l) {
    const plan::LayerOps o = plan::layer_ops(sp.model, l, sp.layout, sp.rank, sp.shape.seq_len, mo);
    LayerWork w;
    w.moe = o.moe;
    w.attn_fwd = plan::pass_seconds(o.attn_fwd, c, ef);
    w.ffn_fwd = plan::pass_seconds(o.ffn_fwd, c, ef);
    w.attn_bwd = plan::pass_seconds(o.attn_bwd, c, eb);
    w.ffn_bwd = plan::pass_seconds(o.ffn_bwd, c, eb);
    sum_f += w.attn_fwd + w.ffn_fwd;
    sum_b += w.attn_bwd + w.ffn_bwd;
    st.layers.push_back(w);
  }
  const plan::StageTime& t = sp.predicted.stages[s];
  const double kf = sum_f > 0 ? t.fwd_compute / sum_f : 0, kb = sum_b > 0 ? t.bwd_compute / sum_b : 0;
  for (LayerWork& w : st.layers) {
    w.attn_fwd *= kf;
    w.ffn_fwd *= kf;
    w.attn_bwd *= kb;
    w.ffn_bwd *= kb;
  }
}

}  // namespace

StepSpec make_step_spec(const StepRequest& r) {
  StepSpec sp;
  sp.model = plan::resolve_model(r.model);
  sp.cluster = plan::resolve_cluster(r.cluster);
  if (r.per_message_s >= 0)
    sp.cluster.intra_node.latency = sp.cluster.inter_node.latency = sp.cluster.inter_group.latency = r.per_message_s;
  sp.shape = train_shape(r, sp.model, sp.cluster);
  sp.layout = choose_layout(r, sp.model, sp.cluster, sp.shape, &sp.searched);
  MOE_CHECK(sp.layout.tp == 1, "moetrain_smpi_step: layout ", sp.layout.describe(),
            ": tensor parallelism is not simulated (tp must be 1)");
  const plan::Candidate cand = plan::evaluate_layout(sp.model, sp.cluster, sp.layout, sp.shape);
  sp.predicted = cand.time;
  sp.rank = plan::rank_shape(sp.layout, sp.shape);
  const plan::MemoryOptions mo = plan::layout_options(sp.cluster, sp.layout, sp.shape, nullptr, 1.0);
  // Exchanged rows and pipeline messages carry activations (mo.act_bytes each), moved as floats.
  const double row_bytes = sp.model.hidden * mo.act_bytes;
  MOE_CHECK(static_cast<long long>(row_bytes) % 4 == 0, "model hidden ", sp.model.hidden,
            " x ", mo.act_bytes, " bytes is not a whole number of floats");
  sp.row_floats = static_cast<int>(row_bytes / 4);
  sp.p2p_floats = static_cast<double>(sp.rank.tokens) * row_bytes / 4;
  const std::vector<int> split = plan::split_stages(sp.model.layers, sp.layout.pp);
  int first = 0;
  for (int s = 0; s < sp.layout.pp; ++s) {
    StageSpec st;
    st.first_layer = first;
    stage_layers(sp, mo, s, first, split[s], st);
    gradient_calls(sp, mo, s, first, split[s], st);
    sp.stages.push_back(std::move(st));
    first += split[s];
  }
  return sp;
}

}  // namespace moe::smpi
