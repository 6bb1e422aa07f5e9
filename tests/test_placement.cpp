// The expert placement map, its manifest JSON, the parameter layout it names, and Piper's hill
// climb against a naive re-implementation of the same rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "test_util.h"
#include "balance/placement.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/params.h"
#include "train/migration.h"

using namespace moe;
using balance::LayerPlacement;
using balance::Placement;

namespace {

using test_util::error_of;

TEST(Placement, ContiguousIsTheOldFormula) {
  const LayerPlacement p = LayerPlacement::contiguous(12, 4);
  for (int e = 0; e < 12; ++e) {
    EXPECT_EQ(p.rank_of(e), e / 3);
    EXPECT_EQ(p.slot_of(e), e % 3);
    EXPECT_EQ(p.expert_at(e / 3, e % 3), e);
  }
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.experts_of(2), (std::vector<int>{6, 7, 8}));
}

TEST(Placement, SwapExchangesRankAndSlot) {
  LayerPlacement p = LayerPlacement::contiguous(8, 2);
  p.swap_experts(1, 6);
  EXPECT_EQ(p.rank_of(1), 1);
  EXPECT_EQ(p.slot_of(1), 2);
  EXPECT_EQ(p.rank_of(6), 0);
  EXPECT_EQ(p.slot_of(6), 1);
  EXPECT_EQ(p.experts_of(0), (std::vector<int>{0, 6, 2, 3}));
  EXPECT_EQ(p.experts_of(1), (std::vector<int>{4, 5, 1, 7}));
  EXPECT_FALSE(p.is_contiguous());
  p.swap_experts(6, 1);
  EXPECT_TRUE(p.is_contiguous());
}

TEST(Placement, BadMapsNameTheProblem) {
  EXPECT_NE(error_of([] { LayerPlacement::from_ranks({{0, 1}, {1, 3}}, "m"); }).find("expert 1 is placed twice"),
            std::string::npos);
  EXPECT_NE(error_of([] { LayerPlacement::from_ranks({{0, 1}, {2}}, "m"); }).find("rank 1 holds 1 experts"),
            std::string::npos);
  EXPECT_NE(error_of([] { LayerPlacement::from_ranks({{0, 9}, {2, 1}}, "m"); }).find("expert 9 is outside [0, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([] { LayerPlacement::contiguous(10, 4); }).find("4 expert-parallel ranks do not divide the 10"),
            std::string::npos);
}

TEST(Placement, JsonRoundTripAndTheOlderFormat) {
  const std::vector<bool> is_moe = {false, true, true};
  Placement p = Placement::contiguous(is_moe, 8, 4);
  p.layers[2].swap_experts(0, 7);
  const nlohmann::json j = p.to_json();
  EXPECT_FALSE(j.contains("0"));
  EXPECT_EQ(j["2"][0], (std::vector<int>{7, 1}));
  EXPECT_TRUE(Placement::from_json(j, is_moe, 8, 4, "m") == p);
  // The older manifests: the EP rank of each expert, slots by ascending expert.
  const nlohmann::json old = {{"1", {0, 0, 1, 1, 2, 2, 3, 3}}, {"2", {3, 0, 1, 1, 2, 2, 0, 3}}};
  const Placement q = Placement::from_json(old, is_moe, 8, 4, "m");
  EXPECT_TRUE(q.layers[1].is_contiguous());
  EXPECT_EQ(q.layers[2].experts_of(0), (std::vector<int>{1, 6}));
  EXPECT_EQ(q.layers[2].experts_of(3), (std::vector<int>{0, 7}));
  // Errors name the field, the layer and the value.
  EXPECT_NE(error_of([&] { Placement::from_json({{"0", {0, 0, 1, 1, 2, 2, 3, 3}}}, is_moe, 8, 4, "F"); })
                .find("F: \"0\" is not an MoE layer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Placement::from_json({{"1", {0, 0, 1, 1, 2, 2, 3, 4}}}, is_moe, 8, 4, "F"); })
                .find("F, layer 1: EP rank 4 is outside [0, 4)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Placement::from_json({{"1", {0, 0, 0, 1, 2, 2, 3, 3}}}, is_moe, 8, 4, "F"); })
                .find("F, layer 1: rank 1 holds 1 experts"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Placement::from_json({{"1", {{0, 1}, {2, 3}}}}, is_moe, 8, 4, "F"); }).find("F, layer 1: expected 4 lists"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Placement::from_json({{"1", "x"}}, is_moe, 8, 4, "F"); }).find("F, layer 1"),
            std::string::npos);
}

TEST(Placement, ParamLayoutNamesEachSlotByItsLogicalExpert) {
  model::ModelConfig c = model::preset("test-moe");  // 3 layers, layers 1-2 MoE, E = 8
  std::vector<bool> is_moe(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) is_moe[l] = c.is_moe_layer(l);
  Placement p = Placement::contiguous(is_moe, c.n_routed_experts, 2);
  const model::ParamLayout before(c, model::ExpertShard::of(p, 1));
  EXPECT_EQ(before.total(), model::ParamLayout(c, model::ExpertShard{4, 4, {}}).total());
  p.layers[1].swap_experts(5, 2);  // rank 1 slot 1 now holds expert 2
  const model::ParamLayout after(c, model::ExpertShard::of(p, 1));
  ASSERT_EQ(after.total(), before.total());
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
    const std::string mine = std::string("model.layers.1.mlp.experts.2.") + proj + ".weight";
    const std::string gone = std::string("model.layers.1.mlp.experts.5.") + proj + ".weight";
    EXPECT_TRUE(after.contains(mine));
    EXPECT_FALSE(after.contains(gone));
    EXPECT_EQ(after.find(mine).offset, before.find(gone).offset);  // the slot keeps its storage
  }
  EXPECT_TRUE(after.contains("model.layers.2.mlp.experts.5.up_proj.weight"));  // the other layer kept
  EXPECT_FALSE(model::ExpertShard::of(p, 1).holds_all(c.n_routed_experts));
  EXPECT_TRUE(model::ExpertShard{}.holds_all(c.n_routed_experts));
}

// The hill climb's rule, written naively: rank loads recomputed from scratch, every pair tried.
std::vector<balance::SwapStep> naive_climb(LayerPlacement p, const std::vector<double>& load, int cap) {
  std::vector<balance::SwapStep> out;
  while (static_cast<int>(out.size()) < cap) {
    std::vector<double> rl(p.ep_size(), 0.0);
    for (int e = 0; e < p.num_experts(); ++e) rl[p.rank_of(e)] += load[e];
    const int hi = static_cast<int>(std::max_element(rl.begin(), rl.end()) - rl.begin());
    const int lo = static_cast<int>(std::min_element(rl.begin(), rl.end()) - rl.begin());
    double best = rl[hi];
    balance::SwapStep pick;
    for (int s = 0; s < p.per_rank(); ++s)
      for (int u = 0; u < p.per_rank(); ++u) {
        const int x = p.expert_at(hi, s), y = p.expert_at(lo, u);
        const double m = std::max(rl[hi] - load[x] + load[y], rl[lo] - load[y] + load[x]);
        if (m < best) {
          best = m;
          pick = {x, y};
        }
      }
    if (pick.a < 0) break;
    p.swap_experts(pick.a, pick.b);
    out.push_back(pick);
  }
  return out;
}

TEST(HillClimb, MatchesTheNaiveRuleAndNeverRaisesTheMaximum) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ep = 2 + static_cast<int>(rng.below(4)), per = 1 + static_cast<int>(rng.below(6));
    std::vector<double> load(ep * per);
    for (double& x : load) x = static_cast<double>(rng.below(trial % 2 ? 50 : 5000));  // ties at % 2
    if (trial % 3 == 0) load[0] *= 20;                                                 // one hot expert
    LayerPlacement p = LayerPlacement::contiguous(ep * per, ep);
    const double before = balance::imbalance(p, load);
    const auto want = naive_climb(p, load, 100);
    const auto got = balance::hill_climb(p, load, 100);
    ASSERT_EQ(got.size(), want.size()) << "trial " << trial;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].a, want[i].a) << "trial " << trial << " swap " << i;
      EXPECT_EQ(got[i].b, want[i].b) << "trial " << trial << " swap " << i;
    }
    EXPECT_LE(balance::imbalance(p, load), before + 1e-12) << "trial " << trial;
  }
}

TEST(HillClimb, BalancesAnObviousCaseAndStops) {
  // Rank 0 holds the two hot experts: one swap fixes it, and then nothing helps.
  LayerPlacement p = LayerPlacement::contiguous(4, 2);
  const std::vector<double> load = {10, 10, 1, 1};
  EXPECT_DOUBLE_EQ(balance::imbalance(p, load), 20.0 / 11.0);
  const auto swaps = balance::hill_climb(p, load);
  ASSERT_EQ(swaps.size(), 1u);
  EXPECT_DOUBLE_EQ(balance::imbalance(p, load), 1.0);
  EXPECT_TRUE(balance::hill_climb(p, load).empty());
  // The cap holds.
  LayerPlacement q = LayerPlacement::contiguous(64, 8);
  std::vector<double> skew(64);
  for (int e = 0; e < 64; ++e) skew[e] = 1000.0 / (e + 1);
  EXPECT_LE(balance::hill_climb(q, skew, 3).size(), 3u);
}

TEST(Migration, PlanOnlyTouchesLayersAboveTheThreshold) {
  const std::vector<bool> is_moe = {false, true, true};
  const Placement p = Placement::contiguous(is_moe, 4, 2);
  std::vector<train::LayerMigration> changed;
  const Placement next =
      train::plan_migration(p, {1, 2}, {{10, 10, 1, 1}, {5, 5, 5, 6}}, 1.05, &changed);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].layer, 1);
  EXPECT_GT(changed[0].imbalance_before, changed[0].imbalance_after);
  EXPECT_FALSE(next.layers[1].is_contiguous());
  EXPECT_TRUE(next.layers[2] == p.layers[2]);  // 11/10.5 = 1.048 is under the threshold
}

}  // namespace
