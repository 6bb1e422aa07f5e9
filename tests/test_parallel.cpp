// ParallelDims: validation messages name the numbers; rank <-> coordinates (TP fastest, then EP,
// DP, PP) against a naive enumeration.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/config.h"
#include "parallel/parallel_dims.h"

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
  EXPECT_NE(error_of({1, 1, 1, 2}, 2, c).find("--tp 2"), std::string::npos);
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
