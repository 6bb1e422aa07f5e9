// bench a2a's routing (comm::make_a2a_routing, pure): node-limited routing reaches at most
// topk_group nodes a token with k distinct experts, each pair goes to the rank the contiguous
// placement gives its expert, and no expert is favoured (the same mean load as uniform routing).
// Legend: T tokens, E experts, k per token, n ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "balance/placement.h"
#include "tools/bench_a2a.h"
#include "core/rng.h"

namespace {

using namespace moe;

// token -> its experts, checking each pair's rank, tag and value on the way.
std::map<int, std::set<int>> experts_by_token(const comm::A2aRouting& r, int E, int n, int T) {
  const balance::LayerPlacement placement = balance::LayerPlacement::contiguous(E, n);
  std::map<int, std::set<int>> by_token;
  for (size_t i = 0; i < r.dst.size(); ++i) {
    EXPECT_EQ(r.dst[i], placement.rank_of(r.tag[i])) << "pair " << i;
    EXPECT_EQ(r.value[i], static_cast<float>(r.src_row[i]));
    EXPECT_TRUE(r.src_row[i] >= 0 && r.src_row[i] < T);
    by_token[r.src_row[i]].insert(r.tag[i]);
  }
  return by_token;
}

TEST(BenchA2aRouting, NodeLimitedReachesAtMostTopkGroupNodes) {
  const int E = 64, k = 8, n = 8, nodes = 4, T = 500;  // 2 ranks a node, 16 experts a node
  for (int topk_group : {1, 2, 3}) {
    const comm::A2aRouting r =
        comm::make_a2a_routing(E, k, "node-limited", T, n, Rng(5 + topk_group), nodes, topk_group);
    ASSERT_EQ(r.dst.size(), static_cast<size_t>(T) * k);
    const auto by_token = experts_by_token(r, E, n, T);
    ASSERT_EQ(by_token.size(), static_cast<size_t>(T));
    std::vector<double> load(E, 0.0);
    for (const auto& [t, experts] : by_token) {
      ASSERT_EQ(experts.size(), static_cast<size_t>(k)) << "token " << t;
      std::set<int> reached;
      for (int e : experts) {
        reached.insert(e / (E / nodes));
        load[e] += 1.0;
      }
      ASSERT_LE(static_cast<int>(reached.size()), topk_group) << "token " << t;
    }
    // Every expert as likely: each load is T·k/E = 62.5 on average; binomial sd ~7.7, so 4.5 sd.
    for (int e = 0; e < E; ++e) EXPECT_NEAR(load[e], T * k / static_cast<double>(E), 35.0) << "expert " << e;
  }
}

TEST(BenchA2aRouting, UniformRoutingIsUnlimited) {
  const int E = 64, k = 8, n = 8, T = 300;
  const auto by_token = experts_by_token(comm::make_a2a_routing(E, k, "uniform", T, n, Rng(9)), E, n, T);
  int spread = 0;  // tokens reaching all 4 nodes: common when nothing limits them
  for (const auto& [t, experts] : by_token) {
    std::set<int> reached;
    for (int e : experts) reached.insert(e / 16);
    spread += reached.size() == 4;
  }
  EXPECT_GT(spread, T / 4);
}

}  // namespace
