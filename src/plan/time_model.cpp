// The time model. See time_model.h for the terms.
// Legend: N tokens per micro-batch per rank, Nm tokens in the MoE block (N / tp), R expert rows
// per rank (Nm · k), El local experts (E / ep), r = R / El rows per local expert.
#include "plan/time_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/two_level.h"
#include "plan/step_ops.h"

namespace moe::plan {
namespace {

// Nodes spanned by `g` ranks at rank stride `stride` with rpn ranks per node.
int nodes_spanned(int g, int stride, int rpn) {
  if (g <= 1) return 1;
  const long long span = static_cast<long long>(stride) * (g - 1) + 1;
  return static_cast<int>(std::min<long long>(g, (span + rpn - 1) / rpn));
}

// The link between nodes: inter-group beyond one switch group; its bandwidth per rank is capped
// by the node's NICs shared by its ranks (every rank of a node injects at once in an exchange).
LinkClass link_between_nodes(const ClusterProfile& c, int nodes) {
  LinkClass l = c.nodes_per_group > 0 && nodes > c.nodes_per_group ? c.inter_group : c.inter_node;
  l.bandwidth = std::min(l.bandwidth, c.nics_per_node * c.nic_bandwidth / c.ranks_per_node);
  return l;
}

}  // namespace

double pass_seconds(const PassOps& ops, const ClusterProfile& c, double elem_s) {
  double t = elem_s * ops.elems;
  for (const GemmOp& g : ops.gemms) {
    const GemmTable& table = g.form == GemmForm::kNT ? c.gemm_nt : (g.form == GemmForm::kNN ? c.gemm_nn : c.gemm_tn);
    t += g.count * table.seconds(g.m, g.n, g.k);
  }
  for (const AttentionOp& a : ops.attention)
    t += a.seq_heads * (a.backward ? c.attention.bwd(a.seq_len, a.head_dim) : c.attention.fwd(a.seq_len, a.head_dim));
  return t;
}

namespace {
// The FFN pass of a layer. Under routing imbalance the busiest EP rank holds more rows than the
// mean, so its expert GEMMs take no less time than the balanced rank's: that time is the floor.
// A measured GEMM table can say otherwise where the time is flat in m (launch-bound shapes: the
// H200's is ~14 µs ± 1 µs from m = 16 to 65536), and a busier rank would come out faster.
double ffn_seconds(const LayerOps& o, const PlanModel& m, int l, const Layout& lay, const RankShape& rs, int T,
                   const MemoryOptions& mo, const ClusterProfile& c, double elem_s, bool backward) {
  const double t = pass_seconds(backward ? o.ffn_bwd : o.ffn_fwd, c, elem_s);
  if (!o.moe || mo.time_imbalance <= 1) return t;
  MemoryOptions balanced = mo;
  balanced.time_imbalance = 1;
  const LayerOps b = layer_ops(m, l, lay, rs, T, balanced);
  return std::max(t, pass_seconds(backward ? b.ffn_bwd : b.ffn_fwd, c, elem_s));
}
}  // namespace

namespace {

// Expected share of `dests` destinations that get at least one of `items` items, each item going
// to one of them uniformly (1 where the items are not known, pairs < 0).
double nonempty_share(double dests, double items) {
  if (items < 0 || dests <= 0) return 1;
  return 1 - std::pow(1 - 1 / dests, items);
}

}  // namespace

double a2a_seconds(const ClusterProfile& c, A2a algo, int world, int ep, int tp,
                   double bytes, int k, double pairs) {
  if (ep <= 1 || bytes <= 0) return 0;
  const int rpn = std::min(world, c.ranks_per_node);
  if (const CommCurve* cc = c.find_comm("a2a", algo, world, ep, rpn)) return cc->seconds.time_at(bytes);
  // Link model. Ranks of the group per node, nodes spanned.
  const int r_n = std::max(1, std::min(ep, c.ranks_per_node / std::max(1, tp)));
  const int n_g = (ep + r_n - 1) / r_n;
  const LinkClass inter = link_between_nodes(c, n_g);
  const double intra_bytes = bytes * (r_n - 1) / ep;
  const double inter_bytes = bytes * (ep - r_n) / ep;
  // Each dependent phase also waits one wire latency (the per-message cost is CPU time, this is
  // the signal's flight): flat has one phase, rbd and halo two (inter-node, then the forward
  // inside the destination node).
  const LinkClass& intra = c.intra_node;
  // flat and rbd send a message only to a rank that gets rows: with few pairs per rank over a
  // wide group many get none (256 ranks, 252 pairs: 37% of them).
  const double pair_share = nonempty_share(ep, pairs);
  if (n_g == 1 || algo == A2a::kFlat) {
    return std::max(fan_out_seconds(intra, intra_bytes, r_n - 1), inter_bytes / inter.bandwidth) +
           pair_share * ((r_n - 1) * c.intra_node.latency + (ep - r_n) * inter.latency) +
           (n_g == 1 ? c.intra_node.wire_latency : inter.wire_latency);
  }
  // rbd and rbd-halo: one pilot per (token, remote node), (n_g − 1)(1 − (1 − 1/n_g)^k) rows
  // instead of k (n_g − 1)/n_g.
  const double pilots = (n_g - 1) * (1 - std::pow(1 - 1.0 / n_g, k));
  const double rows = k * static_cast<double>(n_g - 1) / n_g;
  const double inter_rbd = inter_bytes * pilots / rows;
  if (algo == A2a::kRbd) {
    // The replicas are copied inside the destination node. A token's pilot goes to one rank of
    // each remote node it has experts on: pairs / k · pilots over the ep − r_n remote ranks.
    const double copies = inter_bytes - inter_rbd;
    const double pilot_share = nonempty_share(ep - r_n, pairs < 0 ? -1 : pairs / k * pilots);
    return std::max(fan_out_seconds(intra, intra_bytes + copies, r_n - 1), inter_rbd / inter.bandwidth) +
           pair_share * (r_n - 1) * c.intra_node.latency + pilot_share * (ep - r_n) * inter.latency +
           inter.wire_latency + c.intra_node.wire_latency;
  }
  // halo: phase I (intra) overlaps phase II (one message per remote node, rail to rail, all
  // rows; rbd-halo: the pilots) and phase III (forward inside the destination node: the rows
  // whose rank is not the rail peer, (r_n − 1)/r_n of them; rbd-halo copies each pilot to its
  // ranks there, about as many rows when a token's experts on a node sit on distinct ranks).
  const double intra_phase = (r_n - 1) * c.intra_node.latency + c.intra_node.wire_latency;
  const double phase1 = fan_out_seconds(intra, intra_bytes, r_n - 1) + intra_phase;
  const double phase2 = (algo == A2a::kRbdHalo ? inter_rbd : inter_bytes) / inter.bandwidth +
                        (n_g - 1) * inter.latency + inter.wire_latency;
  const double phase3 = fan_out_seconds(intra, inter_bytes * (r_n - 1) / r_n, r_n - 1) + intra_phase;
  return std::max(phase1, phase2 + phase3);
}

double a2a_plan_seconds(const ClusterProfile& c, A2a algo, int world, int ep, int tp,
                        double pairs) {
  if (ep <= 1) return 0;
  const int rpn = std::min(world, c.ranks_per_node);
  if (c.find_comm("a2a", algo, world, ep, rpn)) return 0;
  const int r_n = std::max(1, std::min(ep, c.ranks_per_node / std::max(1, tp)));
  const int n_g = (ep + r_n - 1) / r_n;
  const LinkClass inter = link_between_nodes(c, n_g);
  const LinkClass& intra = c.intra_node;
  const bool rbd = algo == A2a::kRbd || algo == A2a::kRbdHalo;
  const double meta = pairs * (rbd ? 16 : 8);
  const double intra_meta = meta * (r_n - 1) / ep, inter_meta = meta * (ep - r_n) / ep;
  // A class's per-message time is the whole of one message (both ends, as the exchange's).
  const double intra_msgs = (r_n - 1) * intra.latency;
  if (algo == A2a::kHalo || algo == A2a::kRbdHalo) {
    // Phase I (each rank of my node) and II (each remote node's rail peer) posted together, then
    // phase III: the rail peer forwards to its node's ranks what is theirs.
    const double phase12 = intra_msgs + (n_g - 1) * inter.latency +
                           std::max(fan_out_seconds(intra, intra_meta, r_n - 1), inter_meta / inter.bandwidth) +
                           (n_g > 1 ? inter.wire_latency : intra.wire_latency);
    if (n_g == 1) return phase12;
    return phase12 + intra_msgs + fan_out_seconds(intra, inter_meta * (r_n - 1) / r_n, r_n - 1) + intra.wire_latency;
  }
  // The counts, then the metadata, each a block to and from every rank of the group: (ep − 1)
  // messages' time. MPI's alltoall of 12-byte blocks over more than 12 ranks is Bruck's
  // (OpenMPI's tuned decision, as SMPI's): ceil(log2 ep) dependent rounds, each a wire latency.
  const double wire = n_g > 1 ? inter.wire_latency : intra.wire_latency;
  const double msgs = intra_msgs + (ep - r_n) * inter.latency;
  const double counts = msgs + (ep > 12 ? std::ceil(std::log2(ep)) : 1) * wire;
  return counts + msgs + wire + std::max(fan_out_seconds(intra, intra_meta, r_n - 1), inter_meta / inter.bandwidth);
}

namespace {

// A hop between nodes is one flow through one NIC; the node's NICs are shared by the `flows`
// leaving it at once; beyond a switch group the global links' taper applies.
double hop_between_nodes(const ClusterProfile& c, int nodes, int flows) {
  const bool beyond_group = c.nodes_per_group > 0 && nodes > c.nodes_per_group;
  const double taper = beyond_group && c.inter_node.bandwidth > 0 ? c.inter_group.bandwidth / c.inter_node.bandwidth : 1.0;
  return std::min(c.nic_bandwidth, c.nics_per_node * c.nic_bandwidth / flows) * taper;
}

}  // namespace

// A measured all-reduce curve (calibrate: groups of adjacent ranks) prices a group that spans as
// many nodes as those did; a group strided across nodes that the measured ones stayed inside (data
// parallelism over EP groups that fill a node) takes the link model, with the measured links.
static const CommCurve* allreduce_curve(const ClusterProfile& c, int world, int group, int stride) {
  const int rpn = std::min(world, c.ranks_per_node);
  if (nodes_spanned(group, stride, rpn) != nodes_spanned(group, 1, rpn)) return nullptr;
  return c.find_comm("allreduce", std::nullopt, world, group, 0);
}

double allreduce_seconds(const ClusterProfile& c, int world, int group, int stride, double bytes) {
  if (group <= 1 || bytes <= 0) return 0;
  if (const CommCurve* cc = allreduce_curve(c, world, group, stride)) return cc->seconds.time_at(bytes);
  const int rpn = std::min(world, c.ranks_per_node);
  const int nodes = nodes_spanned(group, stride, rpn);
  // Ring over the group's ranks in rank order, every group of this kind at once: 2(g−1) steps,
  // each moving 1/g of the buffer one hop, as fast as the slowest hop, and each paying the
  // slowest link's per-message latency.
  if (nodes == 1)
    return 2.0 * (group - 1) / group * bytes / c.intra_node.bandwidth + 2.0 * (group - 1) * c.intra_node.latency;
  // The hops that leave a node at once: one per group of this kind that crosses it (stride of
  // them while the stride is inside a node), every rank's when the stride spans nodes.
  double hop = hop_between_nodes(c, nodes, std::min(stride, rpn));
  if (stride < rpn) hop = std::min(hop, c.intra_node.bandwidth);  // the hops inside a node
  return 2.0 * (group - 1) / group * bytes / hop + 2.0 * (group - 1) * link_between_nodes(c, nodes).latency;
}

double gradient_allreduce_seconds(const ClusterProfile& c, int world, int group, int stride, double bytes) {
  if (group <= 1 || bytes <= 0) return 0;
  if (allreduce_curve(c, world, group, stride)) return allreduce_seconds(c, world, group, stride, bytes);
  const int rpn = std::min(world, c.ranks_per_node);
  // Two levels (comm/two_level.h) where the group has the same members on each node, several:
  // ring reduce-scatter and all-gather inside the node, and between them a ring all-reduce of
  // each member's 1/r share across the n nodes, every member of every such group of the node
  // sending at once (min(stride·r, ranks per node) flows). The rule counts floats (the trainer's
  // fp32 gradients).
  const int r = stride < rpn && rpn % stride == 0 ? std::min(group, rpn / stride) : 1;
  if (group % r != 0 || !two_level_allreduce_applies(r, group / r, static_cast<int64_t>(bytes / 4)))
    return allreduce_seconds(c, world, group, stride, bytes);
  const int n = group / r;
  const double in_node = (r - 1.0) / r * bytes / c.intra_node.bandwidth + (r - 1) * c.intra_node.latency;
  const double across = 2.0 * (n - 1) / n * (bytes / r) / hop_between_nodes(c, n, std::min(stride * r, rpn)) +
                        2.0 * (n - 1) * link_between_nodes(c, n).latency;
  return 2 * in_node + across;
}

double p2p_seconds(const ClusterProfile& c, int world, int stride, double bytes) {
  if (bytes <= 0) return 0;
  const int rpn = std::min(world, c.ranks_per_node);
  const bool across_nodes = stride >= rpn;
  // A measured curve describes the placement it was measured under. `moetrain calibrate` times
  // neighbouring ranks (0-1, 2-3, ...), a pair inside one node, and records ranks_per_node 0 or
  // >= 2 for it; only a curve measured one rank per node (1) describes a transfer between nodes.
  // Otherwise the profile's links, so a slow inter-node link slows the pipeline's transfers.
  if (const CommCurve* cc = c.find_comm("p2p", std::nullopt, world, 2, 0);
      cc && (cc->ranks_per_node == 1) == across_nodes)
    return cc->seconds.time_at(bytes);
  const LinkClass l = across_nodes ? link_between_nodes(c, 2) : c.intra_node;
  return l.latency + bytes / l.bandwidth;
}

namespace {

// One stage's work per micro-batch: compute in solo-rank seconds (GEMM + attention +
// memory-bound, recomputation included) and communication in wall seconds (all-to-all).
struct StageWork {
  double fwd_compute = 0, bwd_compute = 0, fwd_comm = 0, bwd_comm = 0;
};

// The pipeline of one step on ranks that share a node's cores (CPU profiles): an event simulation
// of every stage's schedule. A forward needs the previous stage's forward of that micro-batch, a
// backward the next stage's backward, each plus one p2p transfer; an op computes, then
// communicates (its all-to-alls). Compute advances at the per-rank share of the node's cores for
// the ranks computing at that moment (stages computing x `replicas` ranks each): a rank waiting
// for a neighbour yields its core (OpenMPI yields when oversubscribed; measured: 1 of 8 ranks
// computing runs at the speed of one rank alone). Returns the wall time of the last op.
double shared_pipeline(const std::vector<StageWork>& w, Schedule schedule, int M, int replicas,
                       double p2p, const ClusterProfile& c) {
  const int P = static_cast<int>(w.size());
  std::vector<std::vector<PipeOpSpec>> ops(P);
  for (int s = 0; s < P; ++s) ops[s] = schedule_ops(schedule, P, s, M);
  const double kNever = 1e300;
  std::vector<std::vector<double>> fwd_done(P, std::vector<double>(M, kNever)), bwd_done = fwd_done;
  std::vector<size_t> next(P, 0);
  std::vector<int> phase(P, 0);      // 0 waiting, 1 computing, 2 communicating
  std::vector<double> left(P, 0.0);  // remaining compute (solo s) or comm (wall s)
  double now = 0;
  auto ready_at = [&](int s) {
    const PipeOpSpec& op = ops[s][next[s]];
    if (op.forward) return s == 0 ? 0.0 : fwd_done[s - 1][op.micro_batch] + p2p;
    return s == P - 1 ? 0.0 : bwd_done[s + 1][op.micro_batch] + p2p;
  };
  int remaining = 0;
  for (int s = 0; s < P; ++s) remaining += static_cast<int>(ops[s].size());
  while (remaining > 0) {
    // Start every op whose input has arrived.
    for (int s = 0; s < P; ++s)
      if (phase[s] == 0 && next[s] < ops[s].size() && ready_at(s) <= now) {
        phase[s] = 1;
        left[s] = ops[s][next[s]].forward ? w[s].fwd_compute : w[s].bwd_compute;
      }
    int active = 0;
    for (int s = 0; s < P; ++s) active += phase[s] == 1 ? 1 : 0;
    const double rate = active > 0 ? c.compute_share_at(active * replicas) : 1.0;
    // Next event: a phase ends or an input arrives.
    double dt = kNever;
    for (int s = 0; s < P; ++s) {
      if (phase[s] == 1) dt = std::min(dt, left[s] / rate);
      else if (phase[s] == 2) dt = std::min(dt, left[s]);
      else if (next[s] < ops[s].size()) dt = std::min(dt, std::max(0.0, ready_at(s) - now));
    }
    MOE_CHECK(dt < kNever, "internal: pipeline simulation stalled");
    now += dt;
    for (int s = 0; s < P; ++s) {
      if (phase[s] == 0) continue;
      left[s] -= phase[s] == 1 ? dt * rate : dt;
      if (left[s] > 1e-15) continue;
      const PipeOpSpec& op = ops[s][next[s]];
      if (phase[s] == 1) {
        phase[s] = 2;
        left[s] = op.forward ? w[s].fwd_comm : w[s].bwd_comm;
        if (left[s] > 1e-15) continue;
      }
      (op.forward ? fwd_done : bwd_done)[s][op.micro_batch] = now;
      phase[s] = 0;
      ++next[s];
      --remaining;
    }
  }
  return now;
}

}  // namespace

namespace {

// Gradient synchronisation of stage s (layers [first, first + n)) after its backward, in the
// gradients' precision; `local_params` gets the parameters the rank holds (its optimizer's work).
//   TP (parallel::sync_tensor_parallel): the tensors every TP rank holds whole (embedding, norms,
//     router, experts, shared experts, head) saw only the rank's tokens: one all-reduce over the
//     tp group per run of them in layout order (q/k/v/o and a dense FFN, split, end a run);
//   then (parallel/grid.cpp) contiguous spans of replicated tensors over the data ranks, routed
//     experts over dp.
double gradient_sync_seconds(const PlanModel& m, const Layout& lay, const ClusterProfile& c,
                             const MemoryOptions& mo, int s, int first, int n, double& local_params) {
  const int world = lay.world(), tp = lay.tp, data = lay.data_ranks();
  const double H = m.hidden, V = static_cast<double>(m.vocab_size);
  double sync = 0, replicated = 0, tp_run = 0;
  auto flush = [&]() {
    sync += gradient_allreduce_seconds(c, world, data, tp, replicated * mo.grad_bytes);
    replicated = 0;
  };
  auto flush_tp = [&]() {
    sync += allreduce_seconds(c, world, tp, 1, tp_run * mo.grad_bytes);
    tp_run = 0;
  };
  const double embedding = mo.embeddings && s == 0 ? V * H : 0;
  const double head = mo.embeddings && s == lay.pp - 1 ? V * H + H : 0;
  replicated += embedding;
  tp_run += embedding;
  local_params = embedding + head;
  for (int l = first; l < first + n; ++l) {
    const LayerParams p = layer_params(m, l);
    replicated += p.attention / tp + p.norms + p.dense_ffn / tp + p.router;
    local_params += p.attention / tp + p.norms + p.dense_ffn / tp + p.router + p.shared;
    tp_run += p.norms / 2;  // input norm, then the split q, k, v, o
    flush_tp();
    tp_run += p.norms / 2;  // post-attention norm
    if (p.dense_ffn > 0) flush_tp();
    tp_run += p.router + p.shared;
    if (p.experts > 0) {
      flush();
      const double experts = p.per_expert * p.experts / lay.ep;
      sync += gradient_allreduce_seconds(c, world, lay.dp, lay.ep * tp, experts * mo.grad_bytes);
      local_params += experts;
      tp_run += experts;
    }
    replicated += p.shared;
  }
  replicated += head;
  tp_run += head;
  flush();
  flush_tp();
  return sync;
}

}  // namespace

TimeBreakdown estimate_time(const PlanModel& m, const Layout& lay, const TrainShape& shape,
                            const ClusterProfile& c, const MemoryOptions& mo) {
  const RankShape rs = rank_shape(lay, shape);
  const int world = lay.world(), T = shape.seq_len, tp = lay.tp;
  const int ranks_on_node = std::min(world, c.ranks_per_node);
  const double N = static_cast<double>(rs.tokens), H = m.hidden;
  const double elem_scale = mo.act_bytes / (c.precision == Precision::kFp32 ? 4.0 : 2.0);
  // Memory-bound costs at this micro-batch's activation size.
  const double act_size = N * H * mo.act_bytes;
  const double ef = c.elem_fwd.at(act_size) * elem_scale, eb = c.elem_bwd.at(act_size) * elem_scale;
  const double rf = c.recompute_fwd.at(act_size) * elem_scale, rb = c.recompute_bwd.at(act_size) * elem_scale;
  // Megatron TP with sequence parallelism: an all-gather of the [N, H] norm output before the
  // column-parallel GEMMs and a reduce-scatter after the row-parallel ones, each way (backward:
  // their adjoints). Together they move what one ring all-reduce of N·H moves, once for the
  // attention and once more for a dense FFN; SSMB's MoE block needs none (it runs on the shard).
  const double tp_comm = tp > 1 ? allreduce_seconds(c, world, tp, 1, N * H * mo.act_bytes) : 0;

  TimeBreakdown tb;
  const std::vector<int> split = split_stages(m.layers, lay.pp);
  std::vector<StageWork> work;
  int first = 0;
  double worst_sync = 0, worst_opt_params = 0;
  for (int s = 0; s < lay.pp; ++s) {
    StageWork w;
    for (int l = first; l < first + split[s]; ++l) {
      const LayerOps o = layer_ops(m, l, lay, rs, T, mo);
      const double attn_f = pass_seconds(o.attn_fwd, c, ef) + tp_comm, attn_b = pass_seconds(o.attn_bwd, c, eb) + tp_comm;
      const double ffn_tp = o.moe ? 0 : tp_comm;
      const double ffn_f = ffn_seconds(o, m, l, lay, rs, T, mo, c, ef, false) + ffn_tp;
      const double ffn_b = ffn_seconds(o, m, l, lay, rs, T, mo, c, eb, true) + ffn_tp;
      const double a2a = o.moe ? a2a_seconds(c, lay.a2a, world, lay.ep, tp, o.a2a_rows * H * mo.act_bytes, m.top_k, o.a2a_rows) : 0;
      w.fwd_compute += attn_f + ffn_f + rf * o.dropped;
      w.bwd_compute += attn_b + ffn_b + rb * o.dropped;
      // The plan, then dispatch + combine; backward reuses the plan, a recomputed forward plans
      // again (model.cpp reruns moe_forward).
      const double plan = o.moe ? a2a_plan_seconds(c, lay.a2a, world, lay.ep, tp, o.a2a_rows) : 0;
      w.fwd_comm += 2 * a2a + plan;
      w.bwd_comm += 2 * a2a;
      if (lay.recompute == Recompute::kFull) {
        w.bwd_compute += attn_f + ffn_f;
        w.bwd_comm += 2 * a2a + plan;
      } else if (lay.recompute == Recompute::kMoe && o.moe) {
        w.bwd_compute += ffn_f;
        w.bwd_comm += 2 * a2a + plan;
      }
    }
    if (s == 0) w.fwd_compute += ef * embedding_elems(m, rs, tp);
    if (s == lay.pp - 1) {
      PassOps hf, hb;
      head_ops(m, rs, tp, hf, hb);
      w.fwd_compute += pass_seconds(hf, c, ef);
      w.bwd_compute += pass_seconds(hb, c, eb);
    }
    work.push_back(w);

    double local_params = 0;
    const double sync = gradient_sync_seconds(m, lay, c, mo, s, first, split[s], local_params);
    worst_sync = std::max(worst_sync, sync);
    worst_opt_params = std::max(worst_opt_params, local_params);
    first += split[s];
  }

  // Per-rank speed when every rank computes (1 on GPUs), and the pipeline.
  const double share_all = c.compute_share_at(ranks_on_node);
  // Each TP rank sends its sequence shard to the next stage.
  const double p2p_one = lay.pp > 1 ? p2p_seconds(c, world, world / lay.pp, N / tp * H * mo.act_bytes) : 0;
  const int M = lay.micro_batches;
  double max_stage = 0, sum_stage = 0;
  int slowest = 0;
  for (int s = 0; s < lay.pp; ++s) {
    StageTime st;
    st.fwd_compute = work[s].fwd_compute / share_all;
    st.bwd_compute = work[s].bwd_compute / share_all;
    st.a2a = work[s].fwd_comm + work[s].bwd_comm;
    st.fwd = st.fwd_compute + work[s].fwd_comm;
    st.bwd = st.bwd_compute + work[s].bwd_comm;
    if (st.fwd + st.bwd > max_stage) {
      max_stage = st.fwd + st.bwd;
      slowest = s;
    }
    sum_stage += st.fwd + st.bwd;
    tb.stages.push_back(st);
  }
  double pipeline;
  if (c.kind == NodeKind::kCpu && lay.pp > 1) {
    pipeline = shared_pipeline(work, lay.schedule, M, world / lay.pp, p2p_one, c);
  } else if (c.kind == NodeKind::kCpu) {
    pipeline = M * max_stage;
  } else {
    // Each micro-batch passes every stage once; the slowest stage paces the rest.
    pipeline = sum_stage + (M - 1) * max_stage + 2 * (lay.pp - 1) * p2p_one;
  }
  const StageTime& sl = tb.stages[slowest];
  tb.compute = M * (sl.fwd_compute + sl.bwd_compute);
  tb.a2a = M * sl.a2a;
  tb.p2p = 2 * (lay.pp - 1) * p2p_one;
  tb.bubble = pipeline - tb.compute - tb.a2a - tb.p2p;
  if (tb.bubble < 0) {
    // Shared cores: fill and drain ran faster than the fully shared steady state (and unequal
    // stages overlap); the parts are scaled to what the pipeline took.
    const double f = std::max(0.0, pipeline - tb.p2p) / (tb.compute + tb.a2a);
    tb.compute *= f;
    tb.a2a *= f;
    tb.bubble = 0;
  }
  tb.allreduce = worst_sync;
  tb.optimizer = c.optimizer_s_per_param * worst_opt_params / share_all;
  tb.step = pipeline + tb.allreduce + tb.optimizer;
  const double tokens = static_cast<double>(shape.global_batch) * T;
  tb.tokens_per_s = tokens / tb.step;
  tb.model_flops = model_flops_per_token(m, T) * tokens;
  tb.tflops_per_rank = tb.model_flops / tb.step / world * 1e-12;
  tb.mfu = tb.model_flops / (tb.step * world * c.peak_flops);
  return tb;
}

}  // namespace moe::plan
