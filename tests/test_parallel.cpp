// ParallelDims: validation messages name the numbers; rank <-> coordinates (TP fastest, then EP,
// DP, PP) against a naive enumeration.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/parallel_dims.h"
#include "parallel/tensor_parallel.h"

using namespace moe;
using parallel::ParallelDims;

namespace {
std::string error_of(const ParallelDims& d, int world, const model::ModelConfig& c) {
  try {
    d.validate(world, c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ParallelDims, ValidationNamesTheNumbers) {
  model::ModelConfig c = model::preset("test-moe");  // E = 8
  EXPECT_EQ(error_of({1, 2, 4, 1}, 8, c), "");
  EXPECT_EQ(error_of({1, 1, 1, 1}, 6, c), "pp(1) * dp(1) * ep(1) * tp(1) = 1 != world size 6");
  EXPECT_EQ(error_of({1, 2, 4, 1}, 6, c), "pp(1) * dp(2) * ep(4) * tp(1) = 8 != world size 6");
  EXPECT_EQ(error_of({1, 1, 3, 1}, 3, c), "ep(3) does not divide n_routed_experts (8)");
  EXPECT_EQ(error_of({2, 1, 1, 1}, 2, c), "");
  EXPECT_EQ(error_of({4, 1, 1, 1}, 4, c), "pp(4) exceeds the model's 3 layers: every pipeline stage needs at least one layer");
  EXPECT_EQ(error_of({1, 1, 1, 2}, 2, c), "");  // 4 heads, intermediate_size 48
  EXPECT_EQ(error_of({1, 1, 1, 3}, 3, c), "tp(3) does not divide num_attention_heads (4)");
  model::ModelConfig wide = c;
  wide.intermediate_size = 50;
  EXPECT_EQ(error_of({1, 1, 1, 4}, 4, wide), "tp(4) does not divide intermediate_size (50) of the dense layers");
  EXPECT_NE(error_of({1, 0, 1, 1}, 0, c).find("dp(0)"), std::string::npos);
  EXPECT_NE(error_of({1, 1, 2, 1}, 2, model::preset("test-dense")).find("no"), std::string::npos);
}

TEST(ParallelDims, RankOrderTpFastestThenEpDpPp) {
  ParallelDims d{2, 3, 2, 2};
  int r = 0;
  for (int pp = 0; pp < d.pp; ++pp)
    for (int dp = 0; dp < d.dp; ++dp)
      for (int ep = 0; ep < d.ep; ++ep)
        for (int tp = 0; tp < d.tp; ++tp, ++r) {
          parallel::RankCoords c = parallel::coords_of(d, r);
          EXPECT_EQ(c.pp, pp);
          EXPECT_EQ(c.dp, dp);
          EXPECT_EQ(c.ep, ep);
          EXPECT_EQ(c.tp, tp);
          EXPECT_EQ(parallel::rank_of(d, c), r);
        }
  EXPECT_EQ(r, d.world());
}

TEST(ParallelDims, LayerSplits) {
  model::ModelConfig c = model::preset("tiny");  // 4 layers
  EXPECT_EQ(parallel::split_layers(c, 1, {}), (std::vector<int>{4}));
  EXPECT_EQ(parallel::split_layers(c, 3, {}), (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(parallel::split_layers(c, 2, {1, 3}), (std::vector<int>{1, 3}));
  auto err = [&](int pp, std::vector<int> l) {
    try {
      parallel::split_layers(c, pp, l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err(5, {}), "pp(5) must be between 1 and the model's 4 layers");
  EXPECT_EQ(err(2, {4, 0}), "--pp.layers: stage 1 has 0 layers; every stage needs at least one");
  EXPECT_EQ(err(2, {2, 1}), "--pp.layers adds up to 3 layers but the model has 4");
  EXPECT_EQ(err(3, {2, 2}), "--pp.layers lists 2 stages but pp is 3");
  model::StageSpec s0 = parallel::stage_spec({1, 3}, 0), s1 = parallel::stage_spec({1, 3}, 1);
  EXPECT_TRUE(s0.embedding && !s0.head && s0.first_layer == 0 && s0.num_layers == 1);
  EXPECT_TRUE(!s1.embedding && s1.head && s1.first_layer == 1 && s1.num_layers == 3);
}

// Tensor parallelism's slices (ParamSpec::tp_dim), against naive loops over the logical tensors:
// q/k/v and the dense gate/up keep rows [r·R/t, (r+1)·R/t), o_proj and down keep columns
// [r·C/t, (r+1)·C/t) of every row; everything else is whole on every rank; the unsplit layout is the
// one-process layout, so tp_slice of a full block gives each rank exactly its elements.
TEST(TensorParallel, SlicesAreTheLogicalTensorsRowsOrColumns) {
  const model::ModelConfig c = model::preset("test-moe");  // H 32, I 48, 1 dense + 2 MoE layers
  const int t = 4;
  const model::ParamLayout one(c);
  std::vector<float> full(one.total());
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);  // exact up to 2^24
  ASSERT_LT(full.size(), size_t{1} << 24);
  size_t split_elems = 0;
  for (int r = 0; r < t; ++r) {
    const model::ParamLayout mine(c, {}, {}, {r, t});
    EXPECT_EQ(parallel::unsplit_layout(mine, c).total(), one.total());
    std::vector<float> local(mine.total(), -1.0f);
    parallel::tp_slice(one, full.data(), mine, local.data());
    for (const model::ParamSpec& s : mine.specs()) {
      const model::ParamSpec& f = one.find(s.name);
      EXPECT_EQ(s.full_shape, f.shape) << s.name;
      const bool rows = s.name.find("q_proj") != std::string::npos || s.name.find("k_proj") != std::string::npos ||
                        s.name.find("v_proj") != std::string::npos ||
                        (s.name.find(".mlp.gate_proj") != std::string::npos) ||
                        (s.name.find(".mlp.up_proj") != std::string::npos);
      const bool cols = s.name.find("o_proj") != std::string::npos || s.name.find(".mlp.down_proj") != std::string::npos;
      EXPECT_EQ(s.tp_dim, rows ? 0 : (cols ? 1 : -1)) << s.name;
      if (s.tp_dim < 0) {
        EXPECT_EQ(s.shape, f.shape) << s.name;
        for (size_t i = 0; i < s.numel; ++i) ASSERT_EQ(local[s.offset + i], full[f.offset + i]) << s.name;
        continue;
      }
      split_elems += s.numel;
      const int64_t R = f.shape[0], C = f.shape[1];
      const int64_t lr = rows ? R / t : R, lc = cols ? C / t : C;
      ASSERT_EQ(s.shape, (std::vector<int64_t>{lr, lc})) << s.name;
      for (int64_t i = 0; i < lr; ++i)
        for (int64_t j = 0; j < lc; ++j) {
          const int64_t fi = rows ? r * lr + i : i, fj = cols ? r * lc + j : j;
          ASSERT_EQ(local[s.offset + i * lc + j], full[f.offset + fi * C + fj]) << s.name << " rank " << r;
        }
    }
  }
  // Together the ranks hold every element of the split tensors exactly once: 2 x 4 attention
  // matrices of [32,32] per layer x 3 layers, and the dense layer's 3 [48,32] ones.
  EXPECT_EQ(split_elems, size_t{3} * 4 * 32 * 32 + 3 * 48 * 32);
}
