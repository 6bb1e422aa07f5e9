// The planner's terms one by one (issue 15, class 8): each memory and time term of plan/ at a small
// shape where it is non-zero, against a value derived by hand in the test (the arithmetic is
// written out in the comments, not recomputed with the planner's own functions).
// The toy model: V 10, H 4, 2 heads of 2 (q = k = v = o = 4 wide), dense width I 6, expert width
// F 3, E 4 routed experts, top-k 2, SwiGLU experts, no shared experts, no aux statistics.
// Per layer: attention 4·H² = 64, norms 2H = 8; MoE: router E·H = 16, one expert 3·H·F = 36;
// dense FFN 3·H·I = 72. Embedding V·H = 40; head V·H = 40 + final norm H = 4.
// A micro-batch of one sequence of T = 4 tokens: N = 4. Times: GEMM and attention tables at a
// constant 1 GFLOP/s, so one FLOP is 1 ns.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/schedule.h"
#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/plan_model.h"
#include "plan/step_ops.h"
#include "plan/time_model.h"

using namespace moe;

namespace {

constexpr double kNs = 1e-9;

// moe[l]: whether layer l is an MoE layer.
plan::PlanModel toy(const std::vector<bool>& moe, int F = 3, int shared = 0) {
  plan::PlanModel m;
  m.name = "toy";
  m.model_type = "deepseek";
  m.vocab_size = 10;
  m.hidden = 4;
  m.layers = static_cast<int>(moe.size());
  m.heads = m.kv_heads = 2;
  m.head_dim = 2;
  m.dense_ffn = 6;
  m.moe_ffn = F;
  m.shared_ffn = shared;
  m.experts = 4;
  m.top_k = 2;
  m.moe_layer = moe;
  m.max_position_embeddings = 64;
  m.validate("toy");
  return m;
}

// bf16 mixed precision (2 + 2 + 12 bytes per parameter, 2-byte activations), every extra term off;
// each test turns on the one it pins.
plan::MemoryOptions bare() {
  plan::MemoryOptions o;
  o.attention_s2 = true;
  o.workspace = false;
  o.pipeline_buffers = false;
  o.a2a_buffers = false;
  o.embeddings = false;
  return o;
}

plan::Layout layout(int pp, int dp, int ep, int M, Recompute recompute = Recompute::kNone) {
  plan::Layout l;
  l.pp = pp;
  l.dp = dp;
  l.ep = ep;
  l.micro_batches = M;
  l.recompute = recompute;
  return l;
}

plan::Table1D constant(double y) { return plan::Table1D{{1.0}, {y}}; }
plan::GemmTable gemm_at(double gflops) { return plan::GemmTable{{1.0}, {1.0}, {1.0}, {gflops}}; }

// A GPU profile: GEMMs and attention at 1 GFLOP/s, no memory-bound or recompute cost, optimizer
// 1 ns per parameter, 2 ranks per node linked at 32 GB/s + 1 ns, between nodes 16 GB/s + 2 ns.
plan::ClusterProfile unit_profile() {
  plan::ClusterProfile c;
  c.name = "unit";
  c.kind = NodeKind::kGpu;
  c.precision = Precision::kBf16;
  c.ranks_per_node = 2;
  c.nics_per_node = 2;
  c.nic_bandwidth = 16e9;
  c.hbm_bytes = 1e12;
  c.peak_flops = 1e9;
  c.intra_node = {32e9, 1 * kNs};
  c.inter_node = {16e9, 2 * kNs};
  c.inter_group = c.inter_node;
  c.gemm_nt = c.gemm_nn = c.gemm_tn = gemm_at(1);
  c.attention = plan::AttentionTable{{1.0}, {1.0}, {1.0}, {1.0}};
  c.elem_fwd = c.elem_bwd = c.recompute_fwd = c.recompute_bwd = constant(0);
  c.optimizer_s_per_param = 1 * kNs;
  return c;
}

// A measured flat a2a curve of 4 ranks (2 per node): 100 bytes in 1 s, bandwidth-bound beyond.
plan::CommCurve flat_a2a_curve_4_ranks() {
  plan::CommCurve cc;
  cc.op = "a2a";
  cc.algo = A2a::kFlat;
  cc.world = 4;
  cc.group = 4;
  cc.ranks_per_node = 2;
  cc.seconds = plan::Table1D{{100}, {1}};
  return cc;
}

// Relative comparison for sums of nanoseconds.
void expect_ns(double got_s, double want_ns, const char* what) {
  EXPECT_NEAR(got_s / kNs, want_ns, 1e-9 * std::max(1.0, want_ns)) << what;
}

}  // namespace

// ---------------------------------------------------------------- memory: parameter state

// pp 2, ep 2, two MoE layers. Stage 0: embedding 40 + attention 64 + norms 8 + router 16 + its
// 4/2 = 2 experts x 36 = 72 -> 200. Stage 1: 88 + 72 + head 40 + final norm 4 -> 204.
// Bytes: weights 2, gradients 2, AdamW 12 per parameter.
TEST(PlanTerms, ParamsGradsOptimizerPerStage) {
  const plan::PlanModel m = toy({true, true});
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::MemoryEstimate e = plan::estimate_memory(m, layout(2, 1, 2, 1), {4, 2, Precision::kBf16}, o);
  ASSERT_EQ(e.stages.size(), 2u);
  const double want[2] = {200, 204};
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(e.stages[s].param_count, want[s]) << s;
    EXPECT_EQ(e.stages[s].params, 2 * want[s]) << s;
    EXPECT_EQ(e.stages[s].grads, 2 * want[s]) << s;
    EXPECT_EQ(e.stages[s].optimizer, 12 * want[s]) << s;
  }
  // Tied embeddings on one stage: the head is the embedding, 40 + 2 x 88 + 2 x 72 + 4 = 364.
  plan::PlanModel t = toy({true, true});
  t.tied_embeddings = true;
  EXPECT_EQ(plan::estimate_memory(t, layout(1, 1, 2, 1), {4, 2, Precision::kBf16}, o).stages[0].param_count, 364);
}

// ZeRO-1, pp 1, dp 2, ep 2 (4 data ranks). Replicated: 40 + 2 x 88 + 44 = 260, shared by all 4
// data ranks; experts 2 layers x 2 local x 36 = 144, shared by the dp = 2 replicas of each expert.
// Optimizer = 12 x (260/4 + 144/2) = 12 x 137 = 1644 (without ZeRO: 12 x 404 = 4848).
TEST(PlanTerms, ZeroOneShardsReplicatedOverDataRanksExpertsOverDp) {
  const plan::PlanModel m = toy({true, true});
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  plan::Layout l = layout(1, 2, 2, 1);
  EXPECT_EQ(plan::estimate_memory(m, l, {4, 4, Precision::kBf16}, o).stages[0].optimizer, 4848);
  o.zero1 = true;
  l.zero1 = true;
  const plan::StageMemory st = plan::estimate_memory(m, l, {4, 4, Precision::kBf16}, o).stages[0];
  EXPECT_EQ(st.optimizer, 1644);
  EXPECT_EQ(st.params, 2 * 404);  // weights and gradients stay whole
  EXPECT_EQ(st.grads, 2 * 404);
}

// ---------------------------------------------------------------- memory: activations

// One sequence of T = 4 (N = 4), in elements.
//   attention (unfused): 8·N·H + 2·N + B·heads·T² = 128 + 8 + 1·2·16 = 168; fused (the trainer's
//   kernel): the row lse B·heads·T = 8 and a copy of out N·H = 16 in place of the 32 probabilities
//   = 160
//   dense FFN: 3·N·I = 72
//   MoE FFN (R = N·k = 8 rows): N·E 16 + 2·N·k 16 + (2E + 1) 9 + R 8 + N·k 8 + 2·R·H 64
//     + 3·R·F 72 = 193
TEST(PlanTerms, LayerActivationsByRecomputeMode) {
  const plan::PlanModel m = toy({false, true});
  const plan::MemoryOptions o = bare();
  struct Want {
    Recompute mode;
    double dense_kept, moe_kept;
  } wants[] = {{Recompute::kNone, 168 + 72, 168 + 193}, {Recompute::kMoe, 168 + 72, 168}, {Recompute::kFull, 16, 16}};
  for (const Want& w : wants) {
    const plan::Layout l = layout(1, 1, 1, 1, w.mode);
    const plan::LayerActivation d = plan::layer_activation(m, 0, 1, 4, l, o);
    const plan::LayerActivation e = plan::layer_activation(m, 1, 1, 4, l, o);
    EXPECT_EQ(d.attention, 168) << w.mode;
    EXPECT_EQ(d.ffn, 72) << w.mode;
    EXPECT_EQ(d.full, 240) << w.mode;
    EXPECT_EQ(d.input, 16) << w.mode;  // N·H
    EXPECT_EQ(d.rows, 0) << w.mode;
    EXPECT_EQ(e.ffn, 193) << w.mode;
    EXPECT_EQ(e.full, 361) << w.mode;
    EXPECT_EQ(e.rows, 8) << w.mode;
    EXPECT_EQ(d.kept, w.dense_kept) << w.mode;
    EXPECT_EQ(e.kept, w.moe_kept) << w.mode;
  }
  // Fused attention keeps no B·heads·T² = 32 probabilities, but the lse (8) and out (16).
  plan::MemoryOptions fused = o;
  fused.attention_s2 = false;
  EXPECT_EQ(plan::layer_activation(m, 0, 1, 4, layout(1, 1, 1, 1), fused).attention, 160);
}

// Shared experts 3·N·Fs, also when Fs (5) is not a multiple of F (3): 3·4·5 = 60 on top of 193;
// two-matrix experts keep R·F = 24 fewer (193 - 24 = 169).
TEST(PlanTerms, SharedExpertsAndTwoMatrixExperts) {
  const plan::Layout l = layout(1, 1, 1, 1);
  const plan::MemoryOptions o = bare();
  EXPECT_EQ(plan::layer_activation(toy({true}, 3, 5), 0, 1, 4, l, o).ffn, 193 + 60);
  EXPECT_EQ(plan::layer_activation(toy({true}, 3, 3), 0, 1, 4, l, o).ffn, 193 + 36);
  plan::MemoryOptions no_shared = o;
  no_shared.shared_experts = false;
  EXPECT_EQ(plan::layer_activation(toy({true}, 3, 5), 0, 1, 4, l, no_shared).ffn, 193);
  plan::PlanModel two = toy({true});
  two.expert_matrices = 2;
  EXPECT_EQ(plan::layer_activation(two, 0, 1, 4, l, o).ffn, 169);
}

// Tensor parallelism 2 (Megatron + sequence parallelism, SSMB for the MoE block), N = 4 tokens,
// n = 2 on each rank's shard. Kept by a dense layer: x n·H 8, ln1 gathered N·H 16, rstd1 n 2,
// q, k, v 3·N·(4/2) 24, the probabilities of 1 of 2 heads 16, attn_out N·2 8, h n·H 8, rstd2 n 2,
// ln2 gathered N·H 16 = 100 (168 - (64 + 32 + 8 + 16 + 32)/2); an MoE layer keeps ln2 on the
// shard, n·H 8: 92. Fused attention splits its lse and out copy (8 + 16) instead of the
// probabilities: dense 8 + 16 + 2 + 24 + 12 + 8 + 8 + 2 + 16 = 96. The dense FFN g, u, h keep
// N·I/2 each: 36. The MoE block routes n = 2 tokens, R = 4 rows: 8 + 8 + 9 + 4 + 4 + 32 + 36 = 101.
TEST(PlanTerms, TensorParallelActivations) {
  plan::Layout l = layout(1, 1, 1, 1);
  l.tp = 2;
  const plan::PlanModel m = toy({false, true});
  const plan::LayerActivation d = plan::layer_activation(m, 0, 1, 4, l, bare());
  const plan::LayerActivation e = plan::layer_activation(m, 1, 1, 4, l, bare());
  EXPECT_EQ(d.attention, 100);
  EXPECT_EQ(e.attention, 92);
  plan::MemoryOptions fused = bare();
  fused.attention_s2 = false;
  EXPECT_EQ(plan::layer_activation(m, 0, 1, 4, l, fused).attention, 96);
  EXPECT_EQ(d.ffn, 36);
  EXPECT_EQ(e.rows, 4);
  EXPECT_EQ(e.ffn, 101);
}

// The head under TP 2 keeps its shard's rows: (2·N·H 32 + 2·N 8 + 2·N·V 80) / 2 = 60. One MoE
// layer (92 + 101 = 193) + the head: kept 253. Peaks (elements):
//   forward 193 + its output n·H 8 = 201 < kept;
//   head backward 253 + dx n·H 8 + dlogits n·V 20 + dln n·H 8 = 289;
//   layer backward 193 + dx n·H 8 + gathered d(out) N·H 16 + max(dln n·H 8, dln N·H 16 +
//     attention grads N·(q+k+v+o)/2 + T² = 16 + 32 + 16) = 281;
//   every moment + the MoE backward workspace n·k + 2·R·H + 2·R·F = 4 + 32 + 24 = 60: 289 + 60 = 349.
//   workspace 349 - 253 = 96 elements = 192 bytes.
// A dense layer (100 + 36 = 136), no head: forward 136 + out 8 + down's partial sums N·H 16 = 160
// (o_proj's, with the attention's 100 - ln2 16 - rstd2 2 allocated: 8 + 82 + 16 = 106); backward
// 136 + 8 + 16 + max(dln N·H 16 + 2·N·I/2 24, 16 + 48) = 224 -> workspace 88 elements. Full
// recomputation keeps x on the shard, n·H = 8: the recompute 16 + 136 + 16 = 168, backward 224
// -> 216 elements.
// Pipeline slots carry the shard, n·H = 8 elements = 16 bytes (stage 0 of pp 2, M 2: 4 slots).
TEST(PlanTerms, TensorParallelHeadAndWorkspaceOnTheShard) {
  plan::MemoryOptions o = bare();
  o.workspace = true;
  o.embeddings = true;
  plan::Layout l = layout(1, 1, 1, 1);
  l.tp = 2;
  const plan::StageMemory st = plan::estimate_memory(toy({true}), l, {4, 1, Precision::kBf16}, o).stages[0];
  EXPECT_EQ(st.kept_per_micro_batch, 2 * 253.0);
  EXPECT_EQ(st.workspace, 2 * 96.0);
  o.embeddings = false;
  EXPECT_EQ(plan::estimate_memory(toy({false}), l, {4, 1, Precision::kBf16}, o).stages[0].workspace, 2 * 88.0);
  l.recompute = Recompute::kFull;
  const plan::StageMemory full = plan::estimate_memory(toy({false}), l, {4, 1, Precision::kBf16}, o).stages[0];
  EXPECT_EQ(full.kept_per_micro_batch, 2 * 8.0);
  EXPECT_EQ(full.workspace, 2 * 216.0);
  plan::MemoryOptions buffers = bare();
  buffers.pipeline_buffers = true;
  plan::Layout p = layout(2, 1, 1, 2);
  p.tp = 2;
  EXPECT_EQ(plan::estimate_memory(toy({false, false}), p, {4, 2, Precision::kBf16}, buffers).stages[0].comm, 4 * 16.0);
}

// Capacity-padded dispatch, one sequence of T = 16 (N = 16): C = max(ceil(16·2·1.25/4), 4) = 10,
// E·C = 40 rows instead of N·k = 32. FFN elements: padding-free 64 + 64 + 9 + 32 + 32 + 256 + 288
// = 745; padded 64 + 64 + 9 + 40 + 32 + 320 + 360 = 889, plus the [T, E, C] combine weights and
// 1-byte mask at 2-byte activations: 16·4·10·(1 + 1/2) = 960 -> 1849.
TEST(PlanTerms, PaddedAgainstPaddingFreeRows) {
  const plan::PlanModel m = toy({true});
  const plan::Layout l = layout(1, 1, 1, 1);
  plan::MemoryOptions o = bare();
  const plan::LayerActivation pf = plan::layer_activation(m, 0, 1, 16, l, o);
  EXPECT_EQ(pf.rows, 32);
  EXPECT_EQ(pf.ffn, 745);
  o.padded = true;
  const plan::LayerActivation pd = plan::layer_activation(m, 0, 1, 16, l, o);
  EXPECT_EQ(pd.rows, 40);
  EXPECT_EQ(pd.ffn, 1849);
  // At T = 4 the minimum capacity of 4 rules: ceil(4·2·1.25/4) = 3 -> 4, E·C = 16 rows.
  EXPECT_EQ(plan::layer_activation(m, 0, 1, 4, l, o).rows, 16);
  // dispatch_buffers: per row 2H + 3F = 17 elements x 2 bytes; combine [16, 4, 10] x (2 + 1) bytes.
  const plan::DispatchBuffers b = plan::dispatch_buffers(m, 16, bare());
  EXPECT_EQ(b.capacity, 10);
  EXPECT_EQ(b.rows_padding_free, 32);
  EXPECT_EQ(b.rows_padded, 40);
  EXPECT_EQ(b.padding_free_bytes, 32 * 17 * 2);
  EXPECT_EQ(b.padded_bytes, 40 * 17 * 2);
  EXPECT_EQ(b.combine_tensor_bytes, 16 * 4 * 10 * 3);
}

// ---------------------------------------------------------------- memory: in flight

// Four dense layers (kept 240 elements = 480 bytes each), one per stage, no head.
// 1F1B over pp 4 with M = 2 < PP: stage s runs min(PP - s - 1, M) warm-up forwards, so stages
// 0..2 hold 2 micro-batches (M caps them) and stage 3 holds 1.
TEST(PlanTerms, InFlightOneFOneBWithFewerMicroBatchesThanStages) {
  const plan::PlanModel m = toy({false, false, false, false});
  const plan::MemoryEstimate e = plan::estimate_memory(m, layout(4, 1, 1, 2), {4, 2, Precision::kBf16}, bare());
  const int want[4] = {2, 2, 2, 1};
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(e.stages[s].in_flight, want[s]) << s;
    EXPECT_EQ(e.stages[s].kept_per_micro_batch, 480) << s;
    EXPECT_EQ(e.stages[s].activations, want[s] * 480.0) << s;
  }
  // M = 1: every stage holds its one micro-batch.
  for (const plan::StageMemory& st : plan::estimate_memory(m, layout(4, 1, 1, 1), {4, 1, Precision::kBf16}, bare()).stages)
    EXPECT_EQ(st.in_flight, 1) << st.stage;
  // M = 8 > PP: min(PP - s, M) = 4, 3, 2, 1.
  const plan::MemoryEstimate big = plan::estimate_memory(m, layout(4, 1, 1, 8), {4, 8, Precision::kBf16}, bare());
  for (int s = 0; s < 4; ++s) EXPECT_EQ(big.stages[s].in_flight, 4 - s) << s;
  // The schedule itself: stage 0 of 4 with M = 2 is F0 F1 B0 B1.
  const auto ops = parallel::make_schedule(Schedule::k1F1B, 4, 0, 2);
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_TRUE(ops[0].forward && ops[1].forward && !ops[2].forward && !ops[3].forward);
}

// GPipe runs every forward before any backward: all M = 3 micro-batches in flight on every stage.
TEST(PlanTerms, InFlightGPipeHoldsEveryMicroBatch) {
  const plan::PlanModel m = toy({false, false});
  plan::Layout l = layout(2, 1, 1, 3);
  l.schedule = Schedule::kGPipe;
  const plan::MemoryEstimate e = plan::estimate_memory(m, l, {4, 3, Precision::kBf16}, bare());
  for (const plan::StageMemory& st : e.stages) {
    EXPECT_EQ(st.in_flight, 3) << st.stage;
    EXPECT_EQ(st.activations, 3 * 480.0) << st.stage;
  }
}

// ---------------------------------------------------------------- memory: workspace

// Workspace = max over the micro-batch's forward and backward peaks - kept, x 2 bytes.
// One MoE layer (full 361, kept 361), no head, ep 1:
//   forward  = full + N·H = 361 + 16 = 377
//   backward = full + dx N·H + max(dln N·H 16 (no shared experts' scratch), N·H 16 + attention
//              grads N·(q+k+v+o) + T² = 64 + 16 = 80) = 361 + 16 + 96 = 473
//   + the MoE backward workspace, held from the first backward on: d(combine weights) N·k +
//     dy, dx rows 2·R·H + SwiGLU scratch 2·R·F = 8 + 64 + 48 = 120 -> 593
//   workspace = 593 - 361 = 232 elements = 464 bytes.
// Recompute moe: kept 168 -> 425 elements; full: kept 16 -> 577 (backward rebuilds the layer).
TEST(PlanTerms, WorkspaceMoeLayerBackwardPeak) {
  const plan::PlanModel m = toy({true});
  plan::MemoryOptions o = bare();
  o.workspace = true;
  auto ws = [&](Recompute rc) {
    return plan::estimate_memory(m, layout(1, 1, 1, 1, rc), {4, 1, Precision::kBf16}, o).stages[0].workspace;
  };
  EXPECT_EQ(ws(Recompute::kNone), 2 * 232.0);
  EXPECT_EQ(ws(Recompute::kMoe), 2 * 425.0);
  EXPECT_EQ(ws(Recompute::kFull), 2 * 577.0);
  o.workspace = false;
  EXPECT_EQ(ws(Recompute::kNone), 0);
}

// A dense layer (full 240): backward = 240 + 32 + max(2·N·I = 48, 64 + T² = 80) = 352 -> 112
// elements = 224 bytes; with fused attention (no T² scratch, full 232): 232 + 32 + max(48, 64) =
// 328 -> 96 elements = 192 bytes. Two dense layers: the second layer's backward sits on the first
// one's kept 240: 240 + 352 = 592 over kept 480 -> still 112.
TEST(PlanTerms, WorkspaceAttentionScratchAndPrefix) {
  plan::MemoryOptions o = bare();
  o.workspace = true;
  const plan::Layout l = layout(1, 1, 1, 1);
  EXPECT_EQ(plan::estimate_memory(toy({false}), l, {4, 1, Precision::kBf16}, o).stages[0].workspace, 224);
  EXPECT_EQ(plan::estimate_memory(toy({false, false}), l, {4, 1, Precision::kBf16}, o).stages[0].workspace, 224);
  o.attention_s2 = false;
  EXPECT_EQ(plan::estimate_memory(toy({false}), l, {4, 1, Precision::kBf16}, o).stages[0].workspace, 192);
}

// Head backward on the last stage: kept 361 + head (2·N·H + 2·N + 2·N·V = 32 + 8 + 80 = 120) =
// 481; head backward = 481 + dx N·H 16 + dlogits N·V 40 + dln N·H 16 = 553 > the layer's 473;
// + the MoE backward workspace 120 (held from the previous step's backward) = 673 -> 192 elements
// = 384 bytes.
TEST(PlanTerms, WorkspaceHeadBackward) {
  plan::MemoryOptions o = bare();
  o.workspace = true;
  o.embeddings = true;
  const plan::StageMemory st = plan::estimate_memory(toy({true}), layout(1, 1, 1, 1), {4, 1, Precision::kBf16}, o).stages[0];
  EXPECT_EQ(st.kept_per_micro_batch, 2 * 481.0);
  EXPECT_EQ(st.workspace, 2 * 192.0);
}

// Expert parallelism adds the exchange's rows on top of the MoE backward workspace (here
// 8 + 2·8·4 + 2·8·1 = 88 with F = 1: MoE FFN 145, full 313, R = 8): the dispatch scratch R·H = 32
// in forward (313 + 16 + 32 = 361) and the received / returned rows R·H in backward (313 + 16 +
// max(16 + 32, 16 + attention grads 80) = 425). The attention grads are larger here, so both
// layouts peak at 425 + 88 = 513 -> 200 elements; the exchange's rows show in tp_plan.sh's
// measured EP runs.
TEST(PlanTerms, WorkspaceExpertParallelReturnRows) {
  plan::MemoryOptions o = bare();
  o.workspace = true;
  const plan::PlanModel m = toy({true}, 1);
  EXPECT_EQ(plan::estimate_memory(m, layout(1, 1, 1, 1), {4, 1, Precision::kBf16}, o).stages[0].workspace, 2 * 200.0);
  EXPECT_EQ(plan::estimate_memory(m, layout(1, 1, 2, 1), {4, 2, Precision::kBf16}, o).stages[0].workspace, 2 * 200.0);
}

// ---------------------------------------------------------------- memory: buffers, reserved

// Pipeline slots of pp 2, M = 2, 1F1B (the executor's dry pass, traced by hand):
//   stage 0 (F0 F1 B0 B1): x_out and dy for F0 and F1 before the first backward frees any: 4.
//   stage 1 (F0 B0 F1 B1): x_in 0 and 1 are open at F0; B0's dx reuses x_in 0; B1's x_in 1: 2.
// M = 1: 2 and 1. Each slot is one N·H activation = 16 elements = 32 bytes.
TEST(PlanTerms, PipelineBufferSlots) {
  EXPECT_EQ(plan::pipeline_buffer_slots(Schedule::k1F1B, 2, 0, 2), 4);
  EXPECT_EQ(plan::pipeline_buffer_slots(Schedule::k1F1B, 2, 1, 2), 2);
  EXPECT_EQ(plan::pipeline_buffer_slots(Schedule::k1F1B, 2, 0, 1), 2);
  EXPECT_EQ(plan::pipeline_buffer_slots(Schedule::k1F1B, 2, 1, 1), 1);
  plan::MemoryOptions o = bare();
  o.pipeline_buffers = true;
  const plan::MemoryEstimate e = plan::estimate_memory(toy({false, false}), layout(2, 1, 1, 2), {4, 2, Precision::kBf16}, o);
  EXPECT_EQ(e.stages[0].comm, 4 * 32.0);
  EXPECT_EQ(e.stages[1].comm, 2 * 32.0);
  EXPECT_EQ(plan::estimate_memory(toy({false}), layout(1, 1, 1, 2), {4, 2, Precision::kBf16}, o).stages[0].comm, 0);
}

// A communication library's send + receive buffers under EP: 2 · R · H · 2 bytes with R = N·k = 8:
// 128 bytes; routing imbalance 1.5 -> R = 12: 192; padded -> E·C = 16 rows: 256; none without EP.
TEST(PlanTerms, AllToAllBuffers) {
  const plan::PlanModel m = toy({true});
  plan::MemoryOptions o = bare();
  o.a2a_buffers = true;
  auto comm = [&](int ep) {
    return plan::estimate_memory(m, layout(1, 1, ep, 1), {4, ep, Precision::kBf16}, o).stages[0].comm;
  };
  EXPECT_EQ(comm(2), 128);
  EXPECT_EQ(comm(1), 0);
  o.routing_imbalance = 1.5;
  EXPECT_EQ(comm(2), 192);
  o.routing_imbalance = 1;
  o.padded = true;
  EXPECT_EQ(comm(2), 256);
}

// Reserved bytes are added once per rank, and the total is the sum of the terms. Two dense layers,
// pp 2, M = 2, every term on: stage 0 holds params 2 x 184 x 16 bytes (attention 64 + norms 8 +
// FFN 72 + embedding 40), activations 2 x 480, workspace 224 (above), 4 pipeline slots x 32,
// reserved 1000: 2944 + 960 + 224 + 128 + 1000 = 5256.
TEST(PlanTerms, ReservedAndTotal) {
  plan::MemoryOptions o = bare();
  o.embeddings = o.workspace = o.pipeline_buffers = true;
  o.reserved_bytes = 1000;
  const plan::MemoryEstimate e = plan::estimate_memory(toy({false, false}), layout(2, 1, 1, 2), {4, 2, Precision::kBf16}, o);
  const plan::StageMemory& s0 = e.stages[0];
  EXPECT_EQ(s0.reserved, 1000);
  EXPECT_EQ(s0.param_count, 184);
  EXPECT_EQ(s0.activations, 960);
  EXPECT_EQ(s0.workspace, 224);
  EXPECT_EQ(s0.comm, 128);
  EXPECT_EQ(s0.total, 184 * 16 + 960 + 224 + 128 + 1000);
}

// ---------------------------------------------------------------- time: per-pass pricing

// Each GEMM form reads its own table (nt 1, nn 2, tn 4 GFLOP/s); attention by (T, head_dim) at
// 4·T²·hd forward, 8·T²·hd backward FLOPs per (sequence, head); memory-bound work per element.
//   3 x nt(4, 4, 4): 3 x 128 FLOPs / 1 = 384 ns; nn(4, 4, 4): 128 / 2 = 64; tn: 128 / 4 = 32
//   attention fwd, 2 (sequence, head) pairs, T 4, hd 2: 2 x 4·16·2 = 256 FLOPs -> 256 ns
//   attention bwd at 2 GFLOP/s: 2 x 8·16·2 / 2 = 256 ns;  100 elements x 1 ns
//   total 384 + 64 + 32 + 256 + 256 + 100 = 1092 ns.
TEST(PlanTerms, PassSecondsGemmFormsAttentionElements) {
  plan::ClusterProfile c = unit_profile();
  c.gemm_nn = gemm_at(2);
  c.gemm_tn = gemm_at(4);
  c.attention = plan::AttentionTable{{1.0}, {1.0}, {1.0}, {2.0}};
  plan::PassOps ops;
  ops.gemms.push_back({plan::GemmForm::kNT, 4, 4, 4, 3});
  ops.gemms.push_back({plan::GemmForm::kNN, 4, 4, 4, 1});
  ops.gemms.push_back({plan::GemmForm::kTN, 4, 4, 4, 1});
  ops.attention.push_back({2, 4, 2, false});
  ops.attention.push_back({2, 4, 2, true});
  ops.elems = 100;
  expect_ns(plan::pass_seconds(ops, c, 1 * kNs), 1092, "pass");
}

// One dense layer, pp 1, M 1, memory-bound 1 ns/element forward, 2 backward.
//   forward GEMMs: q, k, v, o 4 x 2·N·H·4 = 512; FFN gate, up, down 3 x 2·N·4·6 = 576; head
//     2·N·H·V = 320 -> 1408; attention 256 (above); elements: layer 168 + 72, head 2·N·H + 2·N +
//     2·N·V = 120, embedding N·H = 16 -> 376. Forward 1408 + 256 + 376 = 2040 ns.
//   backward: GEMMs twice (dx and dw) 2816, attention 512, elements (240 + 120) x 2 = 720 -> 4048.
//   optimizer: 64 + 8 + 72 + 40 + 40 + 4 = 228 parameters x 1 ns. Step 2040 + 4048 + 228 = 6316.
// Full recomputation (recompute 3 ns / 5 ns per dropped element, 240 - 16 = 224 dropped):
//   forward + 224 x 3 = 2712; backward + 224 x 5 + the layer's forward again (attention 512 + 256
//   + 168 = 936, FFN 576 + 72 = 648) = 4048 + 1120 + 1584 = 6752. Step 2712 + 6752 + 228 = 9692.
TEST(PlanTerms, StepDenseLayerGemmAttentionElementsOptimizerRecompute) {
  plan::ClusterProfile c = unit_profile();
  c.elem_fwd = constant(1 * kNs);
  c.elem_bwd = constant(2 * kNs);
  c.recompute_fwd = constant(3 * kNs);
  c.recompute_bwd = constant(5 * kNs);
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::PlanModel m = toy({false});
  plan::TimeBreakdown t = plan::estimate_time(m, layout(1, 1, 1, 1), {4, 1, Precision::kBf16}, c, o);
  expect_ns(t.stages[0].fwd, 2040, "fwd");
  expect_ns(t.stages[0].bwd, 4048, "bwd");
  expect_ns(t.optimizer, 228, "optimizer");
  expect_ns(t.step, 6316, "step");
  EXPECT_EQ(t.bubble, 0);
  EXPECT_EQ(t.allreduce, 0);
  EXPECT_EQ(t.p2p, 0);
  // M = 2 on one stage: twice the micro-batch, the optimizer once: 2 x 6088 + 228.
  expect_ns(plan::estimate_time(m, layout(1, 1, 1, 2), {4, 2, Precision::kBf16}, c, o).step, 2 * 6088 + 228, "M=2");
  t = plan::estimate_time(m, layout(1, 1, 1, 1, Recompute::kFull), {4, 1, Precision::kBf16}, c, o);
  expect_ns(t.stages[0].fwd, 2712, "full fwd");
  expect_ns(t.stages[0].bwd, 6752, "full bwd");
  expect_ns(t.step, 9692, "full step");
}

// One MoE layer on ep 2 (2 ranks on one node, 32 GB/s + 1 ns), M 1, no memory-bound cost.
//   forward GEMMs: attention 512, router nt(4, E 4, H 4) 128, 2 local experts on r = R/El = 8/2 =
//   4 rows: gate + up 4 x 2·4·3·4 = 384, down 2 x 96 = 192, head 320; attention 256 -> 1792 ns.
//   all-to-all of R·H·2 = 64 bytes over 2 ranks: 32 bytes cross, 1 ns + 1 ns latency = 2 ns
//   (less 2^-8 ns: see below); dispatch + combine both ways: backward 3584 + 4 = 3588. The forward also plans (flat: the
//   counts, then the metadata, 1 message of 1 ns each, + R = 8 pairs of 8 bytes, half of them to
//   the peer: 32 bytes at 32 GB/s): 2 + 1 = 3 ns: 1792 + 4 + 3 = 1799.
//   gradient all-reduce over dp·ep = 2 ranks (ring: 2·(g-1)/g·bytes/bw + 2·(g-1)·latency), one call
//   per contiguous span of replicated tensors: embedding + attention + norms + router = 128
//   parameters = 256 bytes: 8 + 2 = 10 ns; head + final norm 44 -> 88 bytes: 2.75 + 2 = 4.75 ns;
//   experts over dp = 1: none. 14.75 ns.
//   optimizer: 40 + 88 + 72 (2 local experts) + 44 = 244 ns. Step 1796 + 3588 + 14.75 + 244.
// Recompute moe: backward + the MoE forward again (router and experts 704) + its plan and 2
// all-to-alls.
// Time imbalance 1.5: the busiest rank's 12 rows, 6 per expert: experts 864 (+ router 128), 96
// bytes -> 48 cross: 2.5 ns each; the plan's 48 metadata bytes to the peer: 2 + 1.5 ns.
TEST(PlanTerms, StepMoeLayerExpertGemmsAllToAllAllReduce) {
  const plan::ClusterProfile c = unit_profile();
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::PlanModel m = toy({true});
  const plan::TrainShape s{4, 2, Precision::kBf16};
  // flat messages only a rank that gets rows: R pairs over 2 ranks miss the peer with 2^-R, so
  // an all-to-all's 1 ns latency counts (1 − 2^-R) ns.
  const double a2a8 = 1 + (1 - std::ldexp(1.0, -8)), a2a12 = 1.5 + (1 - std::ldexp(1.0, -12));
  plan::TimeBreakdown t = plan::estimate_time(m, layout(1, 1, 2, 1), s, c, o);
  expect_ns(t.stages[0].fwd, 1792 + 2 * a2a8 + 3, "fwd");
  expect_ns(t.stages[0].bwd, 3584 + 2 * a2a8, "bwd");
  expect_ns(t.stages[0].a2a, 4 * a2a8 + 3, "a2a");
  expect_ns(t.allreduce, 14.75, "allreduce");
  expect_ns(t.optimizer, 244, "optimizer");
  expect_ns(t.step, 1792 + 3584 + 4 * a2a8 + 3 + 14.75 + 244, "step");
  t = plan::estimate_time(m, layout(1, 1, 2, 1, Recompute::kMoe), s, c, o);
  expect_ns(t.stages[0].bwd, 3584 + 704 + 3 + 4 * a2a8, "moe recompute bwd");
  // The busiest rank holds 1.5x the mean rows; inside one node it also paces the exchange.
  o.time_imbalance = o.a2a_imbalance = 1.5;
  t = plan::estimate_time(m, layout(1, 1, 2, 1), s, c, o);
  expect_ns(t.stages[0].fwd, 512 + 256 + 128 + 864 + 320 + 2 * a2a12 + 3.5, "imbalanced fwd");
  expect_ns(t.stages[0].bwd, 2 * (512 + 256 + 128 + 864 + 320) + 2 * a2a12, "imbalanced bwd");
}

// ---------------------------------------------------------------- time: pipeline and bubble

// pp 2, M 2, two dense layers, no memory-bound cost (GPU formula).
//   stage 0: forward 1088 (GEMMs) + 256 (attention) = 1344, backward 2176 + 512 = 2688 -> 4032
//   stage 1: + head 320 / 640: 1664 + 3328 = 4992 (the slowest)
//   p2p: N·H·2 = 32 bytes between the 2 ranks of one node: 1 + 1 = 2 ns, 2·(PP - 1) on the path.
//   pipeline = Σ stages + (M - 1)·slowest + 2·(PP - 1)·p2p = 9024 + 4992 + 4 = 14020
//   compute = M·slowest = 9984; bubble = 14020 - 9984 - 4 = 4032 (the fill and drain of stage 0)
//   optimizer: the larger stage, 64 + 8 + 72 + 44 = 188. Step 14208.
TEST(PlanTerms, PipelineBubbleAndP2p) {
  const plan::ClusterProfile c = unit_profile();
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::TimeBreakdown t = plan::estimate_time(toy({false, false}), layout(2, 1, 1, 2), {4, 2, Precision::kBf16}, c, o);
  expect_ns(t.stages[0].fwd + t.stages[0].bwd, 4032, "stage 0");
  expect_ns(t.stages[1].fwd + t.stages[1].bwd, 4992, "stage 1");
  expect_ns(t.p2p, 4, "p2p");
  expect_ns(t.compute, 9984, "compute");
  expect_ns(t.bubble, 4032, "bubble");
  expect_ns(t.optimizer, 188, "optimizer");
  expect_ns(t.step, 14208, "step");
}

// The same pipeline on a CPU profile (simulated op by op). With no core sharing it is the GPU
// formula's 14020 ns: s0 F0 0-1344, F1 -2688; s1 F0 1346-3010, B0 -6338, F1 -8002; s0 B0
// 6340-9028; s1 B1 -11330; s0 B1 11332-14020.
// One core per node (two busy ranks run at 1/2 each), traced by hand:
//   s0 F0 0-1344 alone; s0 F1 alone 1344-1346 (2 done), both from 1346: s0 F1 ends 4030; s1 F0
//   has 322 left, alone: 4352; s1 B0 alone 4352-7680; s1 F1 alone 7680-7682 (2 done), both from
//   7682: s1 F1 ends 11006 (s0 B0 has 1026 left), s0 B0 ends 13058 (s1 B1 has 2302 left), s1 B1
//   alone -15360; s0 B1 15362-18050. The optimizer at the shared speed: 188 / (1/2) = 376.
TEST(PlanTerms, CpuPipelineSimulationWithSharedCores) {
  plan::ClusterProfile c = unit_profile();
  c.kind = NodeKind::kCpu;
  c.precision = Precision::kBf16;
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::PlanModel m = toy({false, false});
  plan::TimeBreakdown t = plan::estimate_time(m, layout(2, 1, 1, 2), {4, 2, Precision::kBf16}, c, o);
  expect_ns(t.step - t.optimizer, 14020, "no sharing");
  c.cores_per_node = 1;
  t = plan::estimate_time(m, layout(2, 1, 1, 2), {4, 2, Precision::kBf16}, c, o);
  expect_ns(t.step - t.optimizer, 18050, "one core");
  expect_ns(t.optimizer, 376, "optimizer");
}

// ---------------------------------------------------------------- time: communication models

// Link model, 4 ranks on nodes of 2: intra 100 B/s + 1 s, inter 10 B/s + 2 s, but one 10 B/s NIC
// per node shared by its 2 ranks caps inter to 5 B/s. 400 bytes per rank over ep 4: 1/4 stays,
// 100 bytes go to the other rank of the node, 200 bytes to the other node.
//   flat: max(100/100, 200/5) + 1·1 + 2·2 = 45
//   rbd, k 2, 2 nodes: pilots (2-1)(1 - (1/2)²) = 0.75 of k(n-1)/n = 1 rows cross: 150 bytes,
//     50 copied inside the node: max((100 + 50)/100, 150/5) + 5 = 35; k 1: the same as flat (45);
//     k 8: pilots 1 - 1/256 of 4 rows: 49.8046875 cross: max(2.501953125, 9.9609375) + 5
//   halo: max(phase I 100/100 + 1, phase II 200/5 + 1·2 + phase III 100/100 + 1) = 44
//   rbd-halo, k 2: halo with rbd's 150 pilot bytes in phase II: max(2, 150/5 + 2 + 2) = 34
//   ep 2 inside one node: 200 bytes cross at 100 B/s + 1 = 3, for every algorithm
//   nodes beyond a switch group (inter-group 2 B/s + 3 s): flat max(1, 100) + 1 + 2·3 = 107
//   tp 2, ep 2 (stride 2): one EP rank per node, 200 bytes cross at 5 B/s + 2 = 42
//   a measured curve (100 bytes in 1 s, bandwidth-bound beyond): 400 bytes in 4 s.
//   pairs known, 2 per rank: a rank gets rows with 1 − (3/4)² = 0.4375, so flat pays that share
//     of its 1 + 2·2 latency: 40 + 0.4375·5; rbd (k 2: 1 token, 0.75 pilots over the 2 remote
//     ranks, each reached with 1 − 2^-0.75): 30 + 0.4375·1 + (1 − 2^-0.75)·2·2. Many pairs: 45.
TEST(PlanTerms, AllToAllByAlgorithmAndLinkClass) {
  plan::ClusterProfile c = unit_profile();
  c.intra_node = {100, 1};
  c.inter_node = {10, 2};
  c.inter_group = {2, 3};
  c.nics_per_node = 1;
  c.nic_bandwidth = 10;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 45);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbd, 4, 4, 1, 400, 2), 35);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbd, 4, 4, 1, 400, 1), 45);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbd, 4, 4, 1, 400, 8), 9.9609375 + 5);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2, 2), 40 + 0.4375 * 5);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbd, 4, 4, 1, 400, 2, 2), 30 + 0.4375 + (1 - std::pow(2.0, -0.75)) * 4);
  EXPECT_NEAR(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2, 1000), 45, 1e-9);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kHalo, 4, 4, 1, 400, 2), 44);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbdHalo, 4, 4, 1, 400, 2), 34);
  for (A2a algo : {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo}) EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, algo, 4, 2, 1, 400, 2), 3) << algo;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 2, 2, 400, 2), 42);
  EXPECT_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 1, 1, 400, 2), 0);
  plan::ClusterProfile g = c;
  g.nodes_per_group = 1;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(g, A2a::kFlat, 4, 4, 1, 400, 2), 107);
  c.comm.push_back(flat_a2a_curve_4_ranks());
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 4);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kHalo, 4, 4, 1, 400, 2), 44);  // no curve for halo
}

// A fan-out over peers with paths of their own: each peer's share at the link's bandwidth, the whole
// under the injection limit (0: the bandwidth, one path shared). 600 bytes to 3 peers at 100 B/s:
// shared 6 s; injection 300: max(2, 2) = 2; injection 1000: max(2, 0.6) = 2; injection 150: 4.
// In a 4-rank node (one node, flat, 400 bytes: 300 to the 3 peers, latency 1 each): shared
// 3 + 3 = 6, injection 300: 1 + 3 = 4, injection 150: 2 + 3 = 5.
TEST(PlanTerms, IntraNodeFanOutInjection) {
  EXPECT_DOUBLE_EQ(plan::fan_out_seconds({100, 1}, 600, 3), 6);
  EXPECT_DOUBLE_EQ(plan::fan_out_seconds({100, 1, 0, 300}, 600, 3), 2);
  EXPECT_DOUBLE_EQ(plan::fan_out_seconds({100, 1, 0, 1000}, 600, 3), 2);
  EXPECT_DOUBLE_EQ(plan::fan_out_seconds({100, 1, 0, 150}, 600, 3), 4);
  EXPECT_EQ(plan::fan_out_seconds({100, 1, 0, 300}, 600, 0), 0);
  plan::ClusterProfile c = unit_profile();
  c.ranks_per_node = 4;
  c.intra_node = {100, 1};
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 6);
  c.intra_node.injection = 300;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 4);
  c.intra_node.injection = 150;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 5);
}

// Wire latency, paid once per dependent phase (the links above plus 0.5 s intra, 4 s inter on
// the wire): flat one inter-node phase 45 + 4 = 49; rbd pilots then the copy inside the node
// 35 + 4 + 0.5 = 39.5; halo max(phase I 2 + 0.5, phase II 42 + 4 + phase III 2 + 0.5) = 48.5;
// rbd-halo the same phases with phase II's 150 pilot bytes: 32 + 4 + 2.5 = 38.5; inside one node
// (ep 2) one intra-node phase: 3 + 0.5.
TEST(PlanTerms, AllToAllWireLatencyPerPhase) {
  plan::ClusterProfile c = unit_profile();
  c.intra_node = {100, 1, 0.5};
  c.inter_node = {10, 2, 4};
  c.inter_group = {2, 3, 6};
  c.nics_per_node = 1;
  c.nic_bandwidth = 10;
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kFlat, 4, 4, 1, 400, 2), 49);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbd, 4, 4, 1, 400, 2), 39.5);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kHalo, 4, 4, 1, 400, 2), 48.5);
  EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, A2a::kRbdHalo, 4, 4, 1, 400, 2), 38.5);
  for (A2a algo : {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo})
    EXPECT_DOUBLE_EQ(plan::a2a_seconds(c, algo, 4, 2, 1, 400, 2), 3.5) << algo;
}

// The plan's time, links of the test above (intra 100 B/s + 1 s per message + 0.5 s on the wire,
// inter 5 B/s per rank + 2 s + 4 s), 4 ranks on nodes of 2, 10 pairs: 80 metadata bytes (rbd's
// 160), 1/4 to the other rank of my node, 1/2 to the other node.
//   flat: the counts, then the metadata, each phase 1·1 + 2·2 + 4 = 9; + max(20/100, 40/5) = 26
//   rbd: 16 bytes a pair: 18 + max(0.4, 16) = 34
//   halo: phase I + II 1 + 1·2 + max(0.2, 40/5) + 4 = 15; phase III 1 + 40/2 / 100 + 0.5: 16.7
//   rbd-halo: 3 + 16 + 4 + 1 + 0.4 + 0.5 = 24.9
//   inside one node (ep 2): flat 2·(1 + 0.5) + 40/100 = 3.4 (40 bytes to the peer); halo one
//     phase: 1 + 0.4 + 0.5 = 1.9
//   flat over 16 ranks (8 nodes): the counts' messages 1 + 14·2 = 29, their alltoall Bruck's: 4
//     rounds of 4 on the wire; the metadata 29 + 4 and 80·14/16 bytes at 5 B/s = 14: 92
//   a measured a2a curve includes the plan: 0.
TEST(PlanTerms, ExchangePlanByAlgorithm) {
  plan::ClusterProfile c = unit_profile();
  c.intra_node = {100, 1, 0.5};
  c.inter_node = {10, 2, 4};
  c.nics_per_node = 1;
  c.nic_bandwidth = 10;
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kFlat, 4, 4, 1, 10), 26);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kRbd, 4, 4, 1, 10), 34);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kHalo, 4, 4, 1, 10), 16.7);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kRbdHalo, 4, 4, 1, 10), 24.9);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kFlat, 4, 2, 1, 10), 3.4);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kHalo, 4, 2, 1, 10), 1.9);
  EXPECT_EQ(plan::a2a_plan_seconds(c, A2a::kFlat, 4, 1, 1, 10), 0);
  EXPECT_DOUBLE_EQ(plan::a2a_plan_seconds(c, A2a::kFlat, 16, 16, 1, 10), 92);
  c.comm.push_back(flat_a2a_curve_4_ranks());
  EXPECT_EQ(plan::a2a_plan_seconds(c, A2a::kFlat, 4, 4, 1, 10), 0);
}

// Ring all-reduce 2·(g-1)/g·bytes/bw + 2·(g-1)·latency on the slowest link the group spans, and
// p2p latency + bytes/bw, with the links above (4 ranks, nodes of 2).
//   group 2, stride 1 (one node): 400/100 + 2 = 6; stride 2 (two nodes: both ranks of a node
//   send across at once, 1 NIC of 10 B/s / 2 = 5 B/s): 80 + 4 = 84; group 4, stride 1: one
//   hop leaves each node (the NIC's whole 10 B/s): 2·3/4·400/10 + 2·3·2 = 60 + 12 = 72; the
//   same with 2 NICs of 4 B/s (a flow uses one: 4 B/s): 150 + 12 = 162.  p2p stride 2 (next
//   node): 2 + 80 = 82; stride 1: 1 + 4 = 5.
TEST(PlanTerms, AllReduceAndP2pLinkModel) {
  plan::ClusterProfile c = unit_profile();
  c.intra_node = {100, 1};
  c.inter_node = {10, 2};
  c.nics_per_node = 1;
  c.nic_bandwidth = 10;
  EXPECT_DOUBLE_EQ(plan::allreduce_seconds(c, 4, 2, 1, 400), 6);
  EXPECT_DOUBLE_EQ(plan::allreduce_seconds(c, 4, 2, 2, 400), 84);
  EXPECT_DOUBLE_EQ(plan::allreduce_seconds(c, 4, 4, 1, 400), 72);
  EXPECT_EQ(plan::allreduce_seconds(c, 4, 1, 1, 400), 0);
  EXPECT_DOUBLE_EQ(plan::p2p_seconds(c, 4, 2, 400), 82);
  EXPECT_DOUBLE_EQ(plan::p2p_seconds(c, 4, 1, 400), 5);
  c.nics_per_node = 2;
  c.nic_bandwidth = 4;
  EXPECT_DOUBLE_EQ(plan::allreduce_seconds(c, 4, 4, 1, 400), 162);
}

// The gradient all-reduce in two levels (comm/two_level.h) where a large span's group has several
// members on each node: 8 ranks in nodes of 4, 1 NIC of 10 B/s, intra 100 B/s and 1 s, inter 2 s,
// 4e6 bytes (1e6 floats, over core/two_level.h's threshold). Group 8, stride 1 (4 per node, 2 nodes):
//   in the node, twice: 3/4·4e6/100 + 3·1 = 30003; across: the 4 members of a node each send
//   their quarter at once (10/4 B/s each): 2·1/2·1e6/2.5 + 2·1·2 = 400004; total 460010
//   (one ring would take 2·7/8·4e6/10 + 14·2 = 700028).
// Group 2 at stride 4 (one member per node), the same group under the threshold, and the TP
// all-reduce (allreduce_seconds): one ring.
TEST(PlanTerms, TwoLevelAllReduce) {
  plan::ClusterProfile c = unit_profile();
  c.ranks_per_node = 4;
  c.intra_node = {100, 1};
  c.inter_node = {10, 2};
  c.inter_group = c.inter_node;
  c.nics_per_node = 1;
  c.nic_bandwidth = 10;
  EXPECT_DOUBLE_EQ(plan::gradient_allreduce_seconds(c, 8, 8, 1, 4e6), 460010);
  EXPECT_DOUBLE_EQ(plan::allreduce_seconds(c, 8, 8, 1, 4e6), 700028);  // the TP all-reduce: one ring
  EXPECT_DOUBLE_EQ(plan::gradient_allreduce_seconds(c, 8, 2, 4, 4e6), 2.0 * 1 / 2 * 4e6 / 2.5 + 2 * 2);
  EXPECT_DOUBLE_EQ(plan::gradient_allreduce_seconds(c, 8, 8, 1, 4000), 2.0 * 7 / 8 * 4000 / 10 + 14 * 2);
}

// Expert gradients are all-reduced over dp only, with stride ep·tp: pp 1, dp 2, ep 2 on 4 ranks
// (nodes of 2, the unit profile's links). Replicated spans over dp·ep = 4 ranks (stride 1, two
// nodes: one hop leaves each node, at one NIC's 16 GB/s; 2 ns):
//   128 params = 256 bytes: 2·3/4·256/16 + 2·3·2 = 24 + 12 = 36 ns; 44 params = 88 bytes:
//   8.25 + 12 = 20.25 ns.  Experts: 72 params = 144 bytes over dp 2 at stride 2 (two nodes,
//   both ranks of a node send across: 2 NICs x 16 GB/s / 2 = 16 GB/s each):
//   144/16 + 2·2 = 9 + 4 = 13 ns.  Total 69.25 ns.
TEST(PlanTerms, GradientAllReduceGroups) {
  const plan::ClusterProfile c = unit_profile();
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  const plan::TimeBreakdown t = plan::estimate_time(toy({true}), layout(1, 2, 2, 1), {4, 4, Precision::kBf16}, c, o);
  expect_ns(t.allreduce, 36 + 20.25 + 13, "allreduce");
}

// Tensor parallelism 2 as the trainer runs it: the embedding, the head (not vocab-parallel), the
// norms, the router and the experts are replicated over TP; q/k/v/o and the dense FFN split.
// One dense layer, one sequence of 4 tokens (n = 2 per rank), the unit profile, 2 ranks of a node.
//   parameters: attention 64/2 + norms 8 + FFN 72/2 + embedding 40 + head 40 + final norm 4 = 160
//   forward: q, k, v on the gathered N = 4 rows, 2 of 4 columns: 3 x 2·4·2·4 = 192, o 2·4·4·2 =
//     64; attention core 1 (sequence, head) pair: 128; the all-gather + reduce-scatter of N·H·2 =
//     32 bytes (one ring all-reduce: 2·1/2·32/32 + 2·1 = 3 ns) around the attention and again
//     around the FFN: 6; FFN I/tp = 3: 2 x 96 + 96 = 288; head on the shard's 2 tokens x the whole
//     vocabulary: 2·2·4·10 = 160. 256 + 128 + 6 + 288 + 160 = 838 ns.
//   backward: the GEMMs twice 2 x 704, attention 256, the collectives 6: 1670 ns.
//   gradient sums over TP of the tensors each TP rank holds whole, one all-reduce per run of them
//   in layout order (the split q/k/v/o and FFN end a run): embedding + input norm 44 parameters =
//   88 bytes: 2·1/2·88/32 + 2 = 4.75 ns; post-attention norm 4 -> 8 bytes: 2.25 ns; final norm +
//   head 44: 4.75 ns. 11.75 ns (dp = ep = 1: nothing else).
//   optimizer: 160 parameters x 1 ns.
// An MoE layer: no collective around the block; router nt(2, 4, 4) 64 and the 4 experts' 1 row
// each (n·k = 4 rows): gate + up 8 x 2·1·3·4 = 192, down 96: 256 + 128 + 3 + 64 + 192 + 96 + 160
// = 899 ns.
TEST(PlanTerms, TensorParallelReplicatesHeadAndEmbedding) {
  const plan::ClusterProfile c = unit_profile();
  plan::MemoryOptions o = bare();
  o.embeddings = true;
  plan::Layout l = layout(1, 1, 1, 1);
  l.tp = 2;
  const plan::PlanModel m = toy({false});
  EXPECT_EQ(plan::estimate_memory(m, l, {4, 1, Precision::kBf16}, o).stages[0].param_count, 160);
  const plan::TimeBreakdown t = plan::estimate_time(m, l, {4, 1, Precision::kBf16}, c, o);
  expect_ns(t.stages[0].fwd, 838, "tp fwd");
  expect_ns(t.stages[0].bwd, 1670, "tp bwd");
  expect_ns(t.allreduce, 11.75, "tp allreduce");
  expect_ns(t.optimizer, 160, "tp optimizer");
  expect_ns(plan::estimate_time(toy({true}), l, {4, 1, Precision::kBf16}, c, o).stages[0].fwd, 899, "tp moe fwd");
}

// A pipeline transfer between nodes follows the profile's inter-node link even when the profile
// holds a measured p2p curve: calibrate times neighbouring ranks, a pair inside one node.
TEST(PlanTerms, PipelineTransferBetweenNodesFollowsTheInterNodeLink) {
  moe::plan::ClusterProfile c = moe::plan::cluster_preset("dgx-h100");
  moe::plan::CommCurve p2p;
  p2p.op = "p2p";
  p2p.world = 16;
  p2p.group = 2;
  p2p.ranks_per_node = 0;  // as moetrain calibrate records it
  p2p.seconds.x = {1e3, 1e9};
  p2p.seconds.y = {1e-5, 1e-2};
  c.comm.push_back(p2p);
  const int world = 16, within = 1, across = c.ranks_per_node;  // stage strides
  const double bytes = 64e6;
  const double fast = moe::plan::p2p_seconds(c, world, across, bytes);
  c.inter_node.bandwidth = 1e3;  // a near-zero inter-node link
  const double slow = moe::plan::p2p_seconds(c, world, across, bytes);
  EXPECT_GT(slow, 1000 * fast);
  EXPECT_NEAR(slow, c.inter_node.latency + bytes / 1e3, 1e-6 * slow);
  // Inside a node the measured curve still holds, whatever the inter-node link.
  EXPECT_DOUBLE_EQ(moe::plan::p2p_seconds(c, world, within, bytes), p2p.seconds.time_at(bytes));
}
