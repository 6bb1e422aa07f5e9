// The op table (op_table.h) at its three sets of shapes: the test shapes (small: every input
// element is finite-differenced), the benchmark shapes (the model's sizes) and the device shapes
// (the CUDA kernels' block and warp edges, empty inputs, refusals).
#include <cmath>
#include <tuple>
#include <utility>

#include "ops/op_table.h"

namespace moe::ops {

// The order of the test shapes fixes each entry's seeds in tests/test_kernels.cpp.

const std::vector<Op>& test_ops() {
  static const std::vector<Op> table = [] {
    std::vector<Op> ops;
    ops.push_back(linear_op(5, 7, 6));
    ops.push_back(rmsnorm_op(4, 16));
    ops.push_back(rope_op(2, 5, 2, 8));
    ops.push_back(attention_op(2, 5, 2, 4));
    ops.push_back(swiglu_op(50));
    ops.push_back(embedding_op(7, 5, {3, 0, 3, 6, 1, 3}));  // repeats, unused rows
    ops.push_back(cross_entropy_op(9, {2, 8, 0, 5}));       // first and last class
    ops.push_back(swiglu_mlp_op(5, 8, 6));
    // Uneven segments 3,0,5,1,4,0: an empty expert in the middle and at the end.
    ops.push_back(grouped_swiglu_op(8, 6, {0, 3, 3, 8, 9, 13, 13}));
    // op_table_dense.cpp: every transpose, dense and strided; K = 0 (C = beta·C0, and an exact
    // zero with beta 0, not stale memory); M = 0.
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int pad : {0, 3}) ops.push_back(gemm_op(ta, tb, 5, 4, 6, 0.5f, 2.0f, pad));
    ops.push_back(gemm_op(false, true, 3, 4, 0, 1.0f, 0.5f, 0));
    ops.push_back(gemm_op(false, true, 3, 4, 0, 1.0f, 0.0f, 1));
    ops.push_back(gemm_op(false, false, 0, 4, 5, 1.0f, 0.5f, 0));
    ops.push_back(gemm_grouped_op(false, true, {3, 0, 5, 2}, 4, 6));
    ops.push_back(gemm_grouped_op(true, false, {2, 4, 0}, 5, 3));
    ops.push_back(add_inplace_op(37));
    ops.push_back(copy_fill_op(37));
    ops.push_back(copy_cols_op(7, 12, 8));  // cut
    ops.push_back(copy_cols_op(7, 8, 12));  // zero-padded
    // A query wider than the value, a value wider than the query (YaRN), no nope columns.
    ops.push_back(mla_heads_op(2, 5, 3, 8, 4, 8, false));
    ops.push_back(mla_heads_op(1, 5, 2, 4, 6, 16, true));
    ops.push_back(mla_heads_op(2, 5, 1, 0, 2, 3, false));
    ops.push_back(adamw_op(101, 3));
    ops.push_back(sum_squares_op(1000));
    // op_table_moe.cpp: an expert never chosen; capacity drops and padding.
    ops.push_back(count_pairs_op(50, 3, 7, 5));
    for (Offsets kind : {Offsets::kFull, Offsets::kCapacity, Offsets::kPadded})
      ops.push_back(place_pairs_op(50, 3, 7, 5, kind));
    ops.push_back(gather_rows_op(13, 2, 4, 5));
    ops.push_back(combine_rows_op(13, 2, 4, 5, false));
    ops.push_back(combine_rows_op(13, 2, 4, 5, true));
    ops.push_back(scatter_rows_op(11, 5));
    ops.push_back(gather_rows_by_index_op(11, 5));
    ops.push_back(gather_scaled_rows_op(11, 5));
    ops.push_back(router_topk_op(6, 8, 2, false, Scoring::kSoftmax, true));
    ops.push_back(router_topk_op(6, 8, 3, true, Scoring::kSoftmax, false));
    ops.push_back(router_topk_op(6, 8, 2, true, Scoring::kSigmoidBias, true));
    ops.push_back(router_topk_op(6, 16, 3, false, Scoring::kGroupsSoftmax, false));
    ops.push_back(router_topk_op(6, 20, 4, true, Scoring::kGroupsSigmoidBias, true));
    ops.push_back(router_aux_stats_op(6, 8, 2, false, false));
    ops.push_back(router_aux_stats_op(6, 8, 2, false, true));
    return ops;
  }();
  return table;
}

// The model's sizes: the attention projections, o-proj, an expert down-proj and a slice of the LM
// head for linear (4096 tokens, hidden 1024, experts of 704); vocabularies of 32000.
std::vector<Op> bench_ops() {
  Rng rng(4);
  std::vector<int32_t> tokens(4096), targets(512);
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(32000));
  for (auto& t : targets) t = static_cast<int32_t>(rng.below(32000));
  // 4096 token-expert rows over 16 experts of log-normal popularity.
  const int E = 16, R = 4096;
  std::vector<double> w(E);
  double total = 0.0;
  for (double& x : w) total += x = std::exp(0.5 * rng.normal());
  std::vector<int32_t> offsets(E + 1, 0);
  for (int e = 0; e < E; ++e)
    offsets[e + 1] = offsets[e] + static_cast<int32_t>(std::floor(R * (w[e] / total)));
  offsets[E] = R;  // what the rounding down left lands on the last expert
  std::vector<Op> ops;
  ops.push_back(linear_op(4096, 1024, 1024));
  ops.push_back(linear_op(4096, 1024, 3072));
  ops.push_back(linear_op(4096, 704, 1024));
  ops.push_back(linear_op(512, 1024, 32000));
  ops.push_back(rmsnorm_op(4096, 1024));
  ops.push_back(rope_op(1, 4096, 16, 64));
  ops.push_back(attention_op(1, 1024, 8, 64));
  ops.push_back(swiglu_op(size_t(4096) * 704));
  ops.push_back(embedding_op(32000, 1024, tokens));
  ops.push_back(cross_entropy_op(32000, targets));
  ops.push_back(swiglu_mlp_op(4096, 1024, 704));
  ops.push_back(grouped_swiglu_op(1024, 704, offsets));
  // A square GEMM, the weight gradient's TN shape, and the expert up-projections as one grouped
  // call (the offsets above as row counts).
  ops.push_back(gemm_op(false, false, 1024, 1024, 1024, 1.0f, 0.0f, 0));
  ops.push_back(gemm_op(true, false, 1024, 1024, 4096, 1.0f, 1.0f, 0));
  std::vector<int> rows_E(E);
  for (int e = 0; e < E; ++e) rows_E[e] = offsets[e + 1] - offsets[e];
  ops.push_back(gemm_grouped_op(false, true, rows_E, 704, 1024));
  ops.push_back(add_inplace_op(size_t(4096) * 1024));
  ops.push_back(copy_fill_op(size_t(4096) * 1024));
  // DeepSeek-V2-Lite's heads: 16 of nope 128, rope 64, value 128 (D = 192), 4096 tokens.
  ops.push_back(copy_cols_op(size_t(4096) * 16, 192, 128));
  ops.push_back(mla_heads_op(1, 4096, 16, 128, 64, 128, false));
  ops.push_back(adamw_op(size_t(1) << 22, 10));
  ops.push_back(sum_squares_op(size_t(1) << 22));
  // 4096 tokens over 64 experts, top-6 (DeepSeek-V2-Lite); 2048 of them, rows of 1024, for the
  // row kernels.
  ops.push_back(count_pairs_op(4096, 6, 64, -1));
  ops.push_back(place_pairs_op(4096, 6, 64, -1, Offsets::kFull));
  ops.push_back(gather_rows_op(2048, 6, 64, 1024));
  ops.push_back(combine_rows_op(2048, 6, 64, 1024, false));
  ops.push_back(scatter_rows_op(12288, 1024));
  ops.push_back(gather_rows_by_index_op(12288, 1024));
  ops.push_back(gather_scaled_rows_op(12288, 1024));
  ops.push_back(router_topk_op(4096, 64, 6, false, Scoring::kSoftmax, true));
  // DeepSeek-V3's router size: 256 experts, top-8, sigmoid + bias, group-limited (the table's 4
  // groups; V3 has 8).
  ops.push_back(router_topk_op(4096, 256, 8, true, Scoring::kGroupsSigmoidBias, true));
  ops.push_back(router_aux_stats_op(4096, 64, 6, false, false));
  return ops;
}

#ifdef MOETRAIN_OP_DEVICE
// The CUDA kernels' edges: rows and widths off the block size, a width below the block that is
// not a power of two (rmsnorm dim 96: a launch sized to the row instead of kThreads breaks
// block_sum's tree, scripts/planted_bugs.sh), head_dim at the 128 limit and past it, T = 0,
// 1 and past a key block, GPT-2's vocabulary, empty inputs, an empty expert, and refusals.
std::vector<Op> device_ops() {
  std::vector<Op> ops;
  ops.push_back(linear_op(33, 70, 41));
  using Rows = std::vector<std::pair<int, int>>;
  for (auto [rows, dim] : Rows{{37, 1000}, {5, 4097}, {300, 64}, {9, 96}, {0, 16}})
    ops.push_back(rmsnorm_op(rows, dim));
  ops.push_back(rope_op(2, 13, 3, 16));
  using Att = std::tuple<int, int, int, int>;  // B, T, nh, hd
  // clang-format off
  for (auto [B, T, nh, hd] : std::vector<Att>{{2, 37, 3, 16}, {1, 70, 2, 128}, {1, 5, 1, 24},
                                              {3, 1, 2, 8}, {1, 200, 1, 64}, {2, 0, 2, 16},
                                              {1, 1, 1, 130}})
    ops.push_back(attention_op(B, T, nh, hd));
  // clang-format on
  for (size_t n : {size_t{10007}, size_t{0}}) ops.push_back(swiglu_op(n));
  // 301 tokens over the whole vocabulary, over half of it (repeats, unused rows), and a single
  // token (one long run of adds into one row).
  for (int distinct : {50, 25, 1}) {
    Rng rng(4 + distinct);
    std::vector<int32_t> tokens(301);
    for (auto& t : tokens) t = static_cast<int32_t>(rng.below(distinct));
    ops.push_back(embedding_op(50, 67, tokens));
  }
  for (auto [N, V] : Rows{{19, 1001}, {3, 50257}, {0, 10}}) {
    Rng rng(50 + N);
    std::vector<int32_t> targets(N);
    for (auto& t : targets) t = static_cast<int32_t>(rng.below(V));
    ops.push_back(cross_entropy_op(V, targets));
  }
  ops.push_back(cross_entropy_op(10, {1, 2, 10, 3}));                // target 10 is outside [0, 10)
  ops.push_back(grouped_swiglu_op(24, 40, {0, 7, 20, 20, 33, 37}));  // expert 2 has no rows
  // op_table_dense.cpp: GEMM's transposes, strides, K = 0, M = 0, bf16; grouped with an empty
  // problem.
  ops.push_back(gemm_op(false, false, 37, 53, 29, 0.7f, 0.3f, 0));
  ops.push_back(gemm_op(false, true, 64, 33, 100, 1.0f, 0.0f, 0));
  ops.push_back(gemm_op(true, false, 17, 128, 65, 1.0f, 1.0f, 0));
  ops.push_back(gemm_op(true, true, 5, 7, 3, -0.5f, 0.25f, 0));
  ops.push_back(gemm_op(false, false, 31, 29, 47, 1.0f, 0.5f, 3));
  ops.push_back(gemm_op(true, true, 31, 29, 47, 1.0f, 0.0f, 2));
  ops.push_back(gemm_op(false, true, 9, 11, 0, 1.0f, 0.5f, 0));  // K = 0: C = beta·C
  ops.push_back(gemm_op(false, true, 9, 11, 0, 1.0f, 0.0f, 1));  // K = 0, beta 0: C = 0
  ops.push_back(gemm_op(false, false, 0, 11, 5, 1.0f, 0.5f, 0));
  ops.push_back(gemm_op(false, false, 128, 96, 200, 1.0f, 0.0f, 0, true));
  ops.push_back(gemm_op(true, false, 33, 65, 47, 0.5f, 1.0f, 3, true));
  ops.push_back(gemm_op(false, true, 64, 40, 96, 1.0f, 1.0f, 0, true));
  ops.push_back(gemm_grouped_op(false, true, {37, 0, 64, 5}, 41, 29));
  ops.push_back(add_inplace_op(4099));
  ops.push_back(copy_fill_op(4099));
  // MLA: a query wider than the value (V padded), a value wider than the query (Q and K padded)
  // with a YaRN table, no nope columns; copy_cols both ways.
  ops.push_back(mla_heads_op(2, 9, 3, 8, 4, 8, false));
  ops.push_back(mla_heads_op(1, 13, 2, 4, 6, 16, true));
  ops.push_back(mla_heads_op(2, 5, 1, 0, 2, 3, false));
  ops.push_back(copy_cols_op(37, 12, 8));
  ops.push_back(copy_cols_op(37, 8, 12));
  ops.push_back(adamw_op(5003, 3));
  for (size_t n : {size_t{100003}, size_t{1}, size_t{0}}) ops.push_back(sum_squares_op(n));
  // op_table_moe.cpp. E = 12288 is the most experts count_kernel histograms in shared memory
  // (48 KiB, the default limit); E = 12289 takes its global-memory path.
  // clang-format off
  using Ids = std::tuple<int, int, int, int>;  // T, k, E, the expert never chosen (-1: none)
  for (auto [T, k, E, skip] : std::vector<Ids>{{50, 3, 7, 5}, {1000, 1, 16, 3}, {257, 4, 64, -1},
                                               {300, 2, 12288, -1}, {300, 2, 12289, -1}}) {
    // clang-format on
    ops.push_back(count_pairs_op(T, k, E, skip));
    for (Offsets kind : {Offsets::kFull, Offsets::kCapacity, Offsets::kPadded})
      ops.push_back(place_pairs_op(T, k, E, skip, kind));
  }
  ops.push_back(place_pairs_op(0, 2, 2, -1, Offsets::kFull));  // P = 0
  ops.push_back(count_pairs_op(2, 3, 3, -1, /*bad_id=*/true));
  // The row kernels on a padded layout with drops, odd H, and no tokens.
  for (auto [T, k, E, H] : std::vector<Ids>{{61, 2, 8, 37}, {40, 1, 4, 300}, {0, 2, 4, 8}}) {
    ops.push_back(gather_rows_op(T, k, E, H));
    ops.push_back(combine_rows_op(T, k, E, H, false));
    ops.push_back(combine_rows_op(T, k, E, H, true));
  }
  for (int n : {0, 1, 211}) {
    ops.push_back(scatter_rows_op(n, 45));
    ops.push_back(gather_rows_by_index_op(n, 45));
    ops.push_back(gather_scaled_rows_op(n, 45));
  }
  using Router = std::tuple<int, int, int, bool>;  // T, E, k, renorm
  for (auto [T, E, k, renorm] : std::vector<Router>{
           {67, 16, 1, false}, {67, 16, 4, true}, {130, 64, 6, false}, {9, 8, 8, true}}) {
    for (Scoring s : {Scoring::kSoftmax, Scoring::kSigmoidBias, Scoring::kGroupsSoftmax,
                      Scoring::kGroupsSigmoidBias})
      ops.push_back(router_topk_op(T, E, k, renorm, s, false));
    ops.push_back(router_aux_stats_op(T, E, k, renorm, false));
  }
  return ops;
}
#endif

}  // namespace moe::ops
