// Text and JSON output of the planner. See report.h.
#include "plan/report.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moe::plan {
namespace {

using nlohmann::json;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Bytes in GB (1e9) for GPU clusters, MB for small CPU runs.
struct Units {
  double div;
  const char* name;
};
Units units_for(const ReportContext& ctx, double typical) {
  if (ctx.cluster->kind == NodeKind::kCpu && typical < 5e9) return {1e6, "MB"};
  return {1e9, "GB"};
}

std::string human_count(double v) {
  if (v >= 1e12) return fmt("%.2fT", v / 1e12);
  if (v >= 1e9) return fmt("%.1fB", v / 1e9);
  if (v >= 1e6) return fmt("%.2fM", v / 1e6);
  if (v >= 1e4) return fmt("%.1fK", v / 1e3);
  return fmt("%.0f", v);
}

std::string human_rate(double v) {
  if (v >= 1e6) return fmt("%.2fM", v / 1e6);
  if (v >= 1e3) return fmt("%.1fk", v / 1e3);
  return fmt("%.0f", v);
}

std::string secs(double s) {
  if (s >= 10) return fmt("%.1f", s);
  if (s >= 0.1) return fmt("%.3f", s);
  return fmt("%.4f", s);
}

// Where a plan's routing imbalance came from, for format_evaluation.
const char* imbalance_source(const ReportContext& ctx, const Candidate& c) {
  if (c.layout.ep == 1) return " (ep=1: every rank holds every expert)";
  if (ctx.routing) return " (measured, --loads)";
  return c.imbalance_time > 1 ? " (--imbalance)" : " (assumed balanced: --loads or --imbalance to change)";
}

}  // namespace

std::string train_command(const ReportContext& ctx, const Layout& l) {
  const RankShape rs = rank_shape(l, ctx.shape);
  std::string model = ctx.model->train_model_flag.empty()
                          ? "--config <deepseek config.json with " + ctx.model->name + "'s shapes>"
                          : ctx.model->train_model_flag;
  std::string cmd = str_cat(l.world() > 1 ? str_cat("mpirun -np ", l.world(), " ") : "",
                            "moetrain train ", model, " --pp ", l.pp, " --dp ", l.dp, " --ep ", l.ep);
  if (l.tp > 1) cmd += str_cat(" --tp ", l.tp);
  cmd += str_cat(" --micro-batches ", l.micro_batches, " --recompute ", l.recompute, " --a2a ", l.a2a,
                 " --batch ", rs.batch_per_rank, " --seq-len ", ctx.shape.seq_len);
  if (l.schedule != Schedule::k1F1B) cmd += str_cat(" --pp.schedule ", l.schedule);
  if (l.zero1) cmd += " --zero1";
  return cmd;
}

std::string format_header(const ReportContext& ctx) {
  const PlanModel& m = *ctx.model;
  const ClusterProfile& c = *ctx.cluster;
  const ModelParams p = count_params(m);
  const int nodes = (ctx.gpus + c.ranks_per_node - 1) / c.ranks_per_node;
  std::string published;
  if (m.published_excludes_embeddings)  // the papers' L·(4H² + 2·E·H·F) in their units
    published = str_cat(" [paper: ", fmt("%.1f", count_params(m, {false, false, false}).total / m.published_unit), "B]");
  std::string s = str_cat("moetrain plan: ", m.name, " (", human_count(p.total), " params", published, ", ",
                          human_count(p.active), " active; L=", m.layers, " H=", m.hidden, " E=",
                          m.experts, " k=", m.top_k, ") on ", c.name, ": ", ctx.gpus, " ",
                          c.kind == NodeKind::kCpu ? "rank(s)" : "GPUs", " (", nodes, " node(s) x ",
                          std::min(ctx.gpus, c.ranks_per_node), "), seq ", ctx.shape.seq_len,
                          ", global batch ", ctx.shape.global_batch, " (",
                          human_count(static_cast<double>(ctx.shape.global_batch) * ctx.shape.seq_len),
                          " tokens), ", ctx.shape.precision, "\n");
  if (c.kind == NodeKind::kGpu) {
    // GEMM tables hold aligned shapes; on an H200, n or k not a multiple of 8 ran 3-7x slower.
    std::string odd;
    int n_odd = 0;
    // clang-format off
    const std::pair<const char*, long long> dims[] = {{"hidden_size", m.hidden}, {"expert width", m.moe_ffn},
                                                      {"dense FFN width", m.dense_ffn}, {"shared expert width", m.shared_ffn},
                                                      {"q/k/v width", static_cast<long long>(m.heads) * m.head_dim},
                                                      {"vocab_size", m.vocab_size}};
    // clang-format on
    for (const auto& [what, v] : dims)
      if (v > 0 && v % 8 != 0) {
        odd += str_cat(odd.empty() ? "" : ", ", what, " ", v);
        ++n_odd;
      }
    if (!odd.empty())
      s += str_cat("  note: ", odd, n_odd > 1 ? " are not multiples" : " is not a multiple",
                   " of 8: tensor-core GEMMs of such shapes can run several times "
                   "slower than the tables assume (3-7x measured on an H200); pad them (Megatron pads the vocabulary to a multiple of 128)\n");
  }
  if (ctx.routing && m.num_moe_layers() > 0)
    s += str_cat("  routing: measured expert loads of ", ctx.routing->source, " (", ctx.routing->steps.size(),
                 " steps, ", ctx.routing->steps.front().size(), " MoE layers, E=", ctx.routing->experts,
                 "), contiguous placement; imb = busiest EP rank's rows / mean, per step and layer, averaged\n");
  if (m.train_model_flag.empty())
    s += "  note: moetrain train runs model_type deepseek only; the flags below give the layout\n";
  return s;
}

std::string format_plans(const ReportContext& ctx, const SearchResult& r) {
  std::string s = format_header(ctx);
  s += str_cat("  evaluated ", r.evaluated, " layouts (", r.rejected.size(), " families rejected, ",
               r.feasible, " feasible plans) in ", fmt("%.1f", r.seconds * 1e3), " ms\n");
  if (r.best.empty()) {
    s += "  no feasible plan: every layout breaks a constraint (see --explain)\n";
    return s;
  }
  const Units u = units_for(ctx, r.best.front().memory.worst_stage().total);
  s += str_cat("\n  #  pp  dp  ep tp   mb recompute a2a       imb | worst stage ", u.name,
               ": total = params grads optim activ work comm rsv  of cap | step s = compute a2a p2p bubble allreduce optim |   tok/s    MFU\n");
  int i = 0;
  for (const Candidate& c : r.best) {
    const StageMemory& w = c.memory.worst_stage();
    const TimeBreakdown& t = c.time;
    char line[512];
    std::snprintf(line, sizeof line,
                  "%3d %3d %3d %3d %2d %4d %-9s %-8s %5.2f | %6.1f = %6.1f %5.1f %5.1f %5.1f %5.1f %4.1f %3.1f of %4.0f | %7s = %s %s %s %s %s %s | %7s %5.1f%%\n",
                  ++i, c.layout.pp, c.layout.dp, c.layout.ep, c.layout.tp, c.layout.micro_batches,
                  name(c.layout.recompute), name(c.layout.a2a), c.imbalance_time, w.total / u.div, w.params / u.div,
                  w.grads / u.div, w.optimizer / u.div, w.activations / u.div, w.workspace / u.div,
                  w.comm / u.div, w.reserved / u.div, c.capacity / u.div, secs(t.step).c_str(), secs(t.compute).c_str(),
                  secs(t.a2a).c_str(), secs(t.p2p).c_str(), secs(t.bubble).c_str(),
                  secs(t.allreduce).c_str(), secs(t.optimizer).c_str(), human_rate(t.tokens_per_s).c_str(),
                  100 * t.mfu);
    s += line;
  }
  s += "\n  best plan: " + train_command(ctx, r.best.front().layout) + "\n";
  return s;
}

std::string format_evaluation(const ReportContext& ctx, const Candidate& c) {
  std::string s = format_header(ctx);
  const Units u = units_for(ctx, c.memory.worst_stage().total);
  const TimeBreakdown& t = c.time;
  s += str_cat("  layout ", c.layout.describe(), (c.fits ? "" : "   ** does not fit **"), "\n");
  s += str_cat("  memory per rank (", u.name, "), capacity ", fmt("%.1f", c.capacity / u.div), ":\n");
  s += "    stage layers in-flight   params    grads    optim  activat workspace    comm reserved    total\n";
  for (const StageMemory& st : c.memory.stages) {
    char line[256];
    std::snprintf(line, sizeof line, "    %5d %6d %9d %8.2f %8.2f %8.2f %8.2f %9.2f %7.2f %8.2f %8.2f%s\n", st.stage,
                  st.num_layers, st.in_flight, st.params / u.div, st.grads / u.div, st.optimizer / u.div,
                  st.activations / u.div, st.workspace / u.div, st.comm / u.div, st.reserved / u.div, st.total / u.div,
                  st.stage == c.memory.worst ? "  <- worst" : "");
    s += line;
  }
  if (ctx.model->num_moe_layers() > 0)
    s += str_cat("  routing imbalance (busiest EP rank's rows / mean): ", fmt("%.3f", c.imbalance_time),
                 " per step and layer, averaged (expert compute and a2a); ", fmt("%.3f", c.imbalance_memory),
                 " worst step (memory)", imbalance_source(ctx, c), "\n");
  s += str_cat("  time per step: ", secs(t.step), " s = compute ", secs(t.compute), " + a2a ", secs(t.a2a),
               " + p2p ", secs(t.p2p), " + bubble ", secs(t.bubble), " + allreduce ", secs(t.allreduce),
               " + optimizer ", secs(t.optimizer), "\n");
  s += "    stage  fwd/mb s  bwd/mb s  a2a/mb s\n";
  for (size_t i = 0; i < t.stages.size(); ++i)
    s += str_cat("    ", fmt("%5.0f", static_cast<double>(i)), "  ", fmt("%8.4f", t.stages[i].fwd), "  ",
                 fmt("%8.4f", t.stages[i].bwd), "  ", fmt("%8.4f", t.stages[i].a2a), "\n");
  s += str_cat("  ", human_rate(t.tokens_per_s), " tokens/s, ", fmt("%.2f", t.tflops_per_rank),
               " TFLOP/s per rank, MFU ", fmt("%.1f", 100 * t.mfu), "%\n");
  s += "  train: " + train_command(ctx, c.layout) + "\n";
  return s;
}

namespace {
struct PaddedCompare {
  DispatchBuffers per_layer;
  long long tokens = 0;
  double padding_free_total = 0, padded_total = 0;  // worst stage, bytes
  int padded_worst_stage = 0;
};
PaddedCompare compare_padded(const ReportContext& ctx, const Candidate& c) {
  PaddedCompare pc;
  MemoryOptions mo = memory_options(*ctx.cluster, ctx.shape.precision, c.layout.zero1);
  const RankShape rs = rank_shape(c.layout, ctx.shape);
  pc.tokens = rs.tokens / c.layout.tp;
  pc.per_layer = dispatch_buffers(*ctx.model, pc.tokens, mo);
  pc.padding_free_total = c.memory.worst_stage().total;
  mo.padded = true;
  const MemoryEstimate pad = estimate_memory(*ctx.model, c.layout, ctx.shape, mo);
  pc.padded_total = pad.worst_stage().total;
  pc.padded_worst_stage = pad.worst;
  return pc;
}
}  // namespace

std::string format_explain(const ReportContext& ctx, const SearchResult& r, const Candidate* best) {
  std::string s = "\nrejected families (pp dp ep tp: constraint: why)\n";
  if (r.rejected.empty()) s += "  none\n";
  for (const Rejection& j : r.rejected) {
    char head[96];
    auto deg = [](int v) { return v > 0 ? std::to_string(v) : std::string("*"); };
    std::snprintf(head, sizeof head, "  pp=%-3s dp=%-4s ep=%-3d tp=%-2d ", deg(j.family.pp).c_str(),
                  deg(j.family.dp).c_str(), j.family.ep, j.family.tp);
    s += str_cat(head, j.constraint, ": ", j.reason, "\n");
  }
  if (best && ctx.model->num_moe_layers() > 0) {
    const PaddedCompare pc = compare_padded(ctx, *best);
    const Units u = units_for(ctx, best->memory.worst_stage().total);
    const DispatchBuffers& d = pc.per_layer;
    s += str_cat("\ndispatch memory of one MoE layer, plan #1 (", pc.tokens, " tokens per rank per micro-batch, E=",
                 ctx.model->experts, " k=", ctx.model->top_k, ", ", ctx.shape.precision, "):\n");
    s += str_cat("  padding-free (X-MoE PFT)          ", fmt("%10.0f", d.rows_padding_free),
                 " rows: rows in/out + expert intermediates ", fmt("%.3f", d.padding_free_bytes / u.div), " ", u.name, "\n");
    s += str_cat("  padded (DeepSpeed, cf 1.25, C=", d.capacity, ") ", fmt("%10.0f", d.rows_padded),
                 " rows: ", fmt("%.3f", d.padded_bytes / u.div), " ", u.name, " + [T,E,C] combine tensor and mask ",
                 fmt("%.3f", d.combine_tensor_bytes / u.div), " ", u.name, " = ",
                 fmt("%.3f", (d.padded_bytes + d.combine_tensor_bytes) / u.div), " ", u.name, " (",
                 fmt("%.2f", (d.padded_bytes + d.combine_tensor_bytes) / std::max(1.0, d.padding_free_bytes)),
                 "x)\n");
    s += str_cat("  worst stage with this layout: padding-free ", fmt("%.2f", pc.padding_free_total / u.div), " ",
                 u.name, ", padded ", fmt("%.2f", pc.padded_total / u.div), " ", u.name, " (stage ",
                 pc.padded_worst_stage, ") of ", fmt("%.1f", best->capacity / u.div), " ", u.name,
                 pc.padded_total > best->capacity ? ": the padded layout does not fit" : ": both fit", "\n");
  }
  return s;
}

json candidate_json(const ReportContext& ctx, const Candidate& c) {
  json stages = json::array();
  // clang-format off
  for (const StageMemory& st : c.memory.stages)
    stages.push_back({{"stage", st.stage}, {"first_layer", st.first_layer}, {"layers", st.num_layers},
                      {"in_flight", st.in_flight}, {"param_count", st.param_count}, {"params", st.params},
                      {"grads", st.grads}, {"optimizer", st.optimizer}, {"activations", st.activations},
                      {"workspace", st.workspace}, {"comm", st.comm}, {"reserved", st.reserved},
                      {"total", st.total}});
  // clang-format on
  json tstages = json::array();
  for (const StageTime& st : c.time.stages)
    tstages.push_back({{"fwd_s", st.fwd}, {"bwd_s", st.bwd}, {"a2a_s", st.a2a}});
  const TimeBreakdown& t = c.time;
  const Layout& l = c.layout;
  const RankShape rs = rank_shape(l, ctx.shape);
  // clang-format off
  return json{{"layout", {{"pp", l.pp}, {"dp", l.dp}, {"ep", l.ep}, {"tp", l.tp},
                          {"micro_batches", l.micro_batches}, {"recompute", name(l.recompute)},
                          {"a2a", name(l.a2a)}, {"zero1", l.zero1}, {"schedule", name(l.schedule)},
                          {"batch_per_rank", rs.batch_per_rank}, {"text", l.describe()}}},
              {"fits", c.fits},
              {"routing_imbalance", {{"time", c.imbalance_time}, {"memory", c.imbalance_memory}}},
              {"memory", {{"capacity_bytes", c.capacity}, {"worst_stage", c.memory.worst},
                          {"peak_bytes", c.memory.worst_stage().total}, {"stages", stages}}},
              {"time", {{"step_s", t.step}, {"compute_s", t.compute}, {"a2a_s", t.a2a},
                        {"p2p_s", t.p2p}, {"bubble_s", t.bubble}, {"allreduce_s", t.allreduce},
                        {"optimizer_s", t.optimizer}, {"tokens_per_s", t.tokens_per_s},
                        {"model_flops", t.model_flops}, {"tflops_per_rank", t.tflops_per_rank},
                        {"mfu", t.mfu}, {"stages", tstages}}},
              {"train_command", train_command(ctx, l)}};
  // clang-format on
}

json padded_json(const ReportContext& ctx, const Candidate& c) {
  const PaddedCompare pc = compare_padded(ctx, c);
  return json{{"tokens_per_micro_batch", pc.tokens},
              {"capacity", pc.per_layer.capacity},
              {"rows_padding_free", pc.per_layer.rows_padding_free},
              {"rows_padded", pc.per_layer.rows_padded},
              {"padding_free_layer_bytes", pc.per_layer.padding_free_bytes},
              {"padded_layer_bytes", pc.per_layer.padded_bytes},
              {"combine_tensor_bytes", pc.per_layer.combine_tensor_bytes},
              {"padding_free_stage_bytes", pc.padding_free_total},
              {"padded_stage_bytes", pc.padded_total}};
}

json loads_json(const RoutingStats& r) {
  return json{{"file", r.source}, {"steps", r.steps.size()}, {"experts", r.experts}};
}

json search_json(const ReportContext& ctx, const SearchResult& r, bool explain) {
  const ModelParams p = count_params(*ctx.model);
  json plans = json::array();
  for (const Candidate& c : r.best) plans.push_back(candidate_json(ctx, c));
  json j = {{"model", {{"name", ctx.model->name}, {"params", p.total}, {"active_params", p.active}}},
            {"cluster", ctx.cluster->name},
            {"gpus", ctx.gpus},
            {"seq_len", ctx.shape.seq_len},
            {"global_batch", ctx.shape.global_batch},
            {"precision", name(ctx.shape.precision)},
            {"evaluated", r.evaluated},
            {"feasible", r.feasible},
            {"search_seconds", r.seconds},
            {"plans", plans}};
  if (ctx.routing) j["loads"] = loads_json(*ctx.routing);
  if (explain) {
    json rej = json::array();
    for (const Rejection& x : r.rejected)
      rej.push_back({{"pp", x.family.pp},
                     {"dp", x.family.dp},
                     {"ep", x.family.ep},
                     {"tp", x.family.tp},
                     {"constraint", x.constraint},
                     {"reason", x.reason},
                     {"over_bytes", x.constraint == "memory" ? x.over_bytes : 0.0}});
    j["rejected"] = rej;
    if (!r.best.empty() && ctx.model->num_moe_layers() > 0) j["dispatch"] = padded_json(ctx, r.best.front());
  }
  return j;
}

}  // namespace moe::plan
