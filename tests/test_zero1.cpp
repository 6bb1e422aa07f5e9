// ZeRO-1's split (parallel/zero1.h) and AdamW over owned ranges (train/optimizer.h), one process:
// every rank's slice, updated alone, equals the same elements of the unsharded update bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "model/config.h"
#include "model/params.h"
#include "parallel/zero1.h"
#include "train/optimizer.h"

namespace moe {
namespace {

model::ParamLayout test_layout() {
  // Experts split over 2 EP ranks (rank 1's half), so both kinds of spans occur, several times.
  return model::ParamLayout(model::preset("test-moe"), model::ExpertShard{2, 2});
}

TEST(Zero1, SplitCoversEverySpanOnceInEqualOrOneLargerBlocks) {
  const model::ParamLayout layout = test_layout();
  const int data_size = 3, dp_size = 2;  // replicated over 3 ranks, experts over 2 (n % P != 0 too)
  std::vector<int> owner(layout.total(), 0);
  int spans_of_both_kinds[2] = {0, 0};
  for (int dr = 0; dr < data_size; ++dr) {
    const int dpr = dr % dp_size;
    const parallel::ZeroShard z = parallel::ZeroShard::split(layout, dr, data_size, dpr, dp_size);
    ASSERT_TRUE(z.sharded());
    size_t owned = 0, prev_end = 0;
    for (const parallel::ShardSpan& s : z.spans()) {
      const int P = s.expert ? dp_size : data_size;
      ASSERT_EQ(static_cast<int>(s.counts.size()), P);
      size_t sum = 0;
      for (int c : s.counts) {
        sum += static_cast<size_t>(c);
        EXPECT_LE(s.counts[0] - c, 1) << "blocks differ by more than one element";
        EXPECT_GE(s.counts[0] - c, 0) << "a later block larger than the first";
      }
      EXPECT_EQ(sum, s.end - s.begin);
      EXPECT_EQ(s.begin, prev_end) << "spans tile the layout";
      prev_end = s.end;
      if (dr == 0) ++spans_of_both_kinds[s.expert ? 1 : 0];
      // The expert spans' owners are counted once per DP rank: only ranks with data_rank < dp_size.
      if (!s.expert || dr < dp_size)
        for (size_t i = s.mine_begin(); i < s.mine_end(); ++i) ++owner[i];
      owned += s.mine_end() - s.mine_begin();
    }
    EXPECT_EQ(prev_end, layout.total());
    EXPECT_EQ(z.owned(), owned);
    size_t in_ranges = 0;
    for (const auto& [b, e] : z.ranges()) in_ranges += e - b;
    EXPECT_EQ(in_ranges, owned);
  }
  EXPECT_GE(spans_of_both_kinds[0], 2);
  EXPECT_GE(spans_of_both_kinds[1], 2);
  for (size_t i = 0; i < owner.size(); ++i) ASSERT_EQ(owner[i], 1) << "element " << i;
}

TEST(Zero1, WholeIsOneRangeAndOneRankSplitIsTheWholeLayout) {
  const model::ParamLayout layout = test_layout();
  const parallel::ZeroShard w = parallel::ZeroShard::whole(layout);
  EXPECT_FALSE(w.sharded());
  ASSERT_EQ(w.ranges().size(), 1u);
  EXPECT_EQ(w.owned(), layout.total());
  const parallel::ZeroShard one = parallel::ZeroShard::split(layout, 0, 1, 0, 1);
  EXPECT_EQ(one.owned(), layout.total());
}

TEST(Zero1, SlicedAdamWStepsEqualTheFullStepBitForBit) {
  const model::ParamLayout layout = test_layout();
  const size_t n = layout.total();
  Rng rng(7);
  std::vector<float> p0(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    p0[i] = static_cast<float>(rng.uniform() - 0.5);
    g[i] = static_cast<float>(rng.uniform() - 0.5) * 0.5f;
  }
  train::OptimConfig oc;
  oc.grad_clip = 1.0f;  // active: the norm of these gradients is far above 1
  std::vector<float> full = p0;
  train::AdamW ref(layout, oc);
  double ref_norm = 0;
  for (int s = 0; s < 3; ++s) ref_norm = ref.step(full.data(), g.data(), s);

  const int P = 3;
  // The global norm from the ranks' partial sums, as the trainer's reducer completes it.
  std::vector<parallel::ZeroShard> shards;
  for (int r = 0; r < P; ++r) shards.push_back(parallel::ZeroShard::split(layout, r, P, r, P));
  std::vector<std::vector<float>> mine(P, p0);
  std::vector<train::AdamW> opts;
  for (int r = 0; r < P; ++r) opts.emplace_back(layout, oc, shards[r].ranges());
  for (int s = 0; s < 3; ++s) {
    // Partials of every rank first (what the all-reduce over the data group would sum).
    double rep = 0, exp = 0;
    for (int r = 0; r < P; ++r)
      for (const auto& [b, e] : shards[r].ranges())
        for (const model::ParamSpec& sp : layout.specs()) {
          const size_t lo = std::max(b, sp.offset), hi = std::min(e, sp.offset + sp.numel);
          for (size_t i = lo; i < hi; ++i) (sp.is_expert ? exp : rep) += static_cast<double>(g[i]) * g[i];
        }
    for (int r = 0; r < P; ++r) {
      opts[r].set_norm_reducer([rep, exp](double, double, double) { return rep + exp; });
      const double norm = opts[r].step(mine[r].data(), g.data(), s);
      EXPECT_NEAR(norm, ref_norm, 1e-9 * ref_norm);  // the same gradients every step
    }
  }
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(opts[r].m().size(), shards[r].owned());
    std::vector<bool> own(n, false);
    for (const auto& [b, e] : shards[r].ranges())
      for (size_t i = b; i < e; ++i) own[i] = true;
    for (size_t i = 0; i < n; ++i) {
      if (own[i]) {
        // Same clip coefficient (float) from a norm summed in another order: same bits here.
        ASSERT_EQ(mine[r][i], full[i]) << "rank " << r << " element " << i;
      } else {
        ASSERT_EQ(mine[r][i], p0[i]) << "rank " << r << " updated element " << i << " it does not own";
      }
    }
  }
  // Moments: gathered back from the slices, they are the full optimizer's.
  std::vector<float> m_full(n, -1.0f);
  for (int r = 0; r < P; ++r) {
    size_t at = 0;
    for (const auto& [b, e] : shards[r].ranges())
      for (size_t i = b; i < e; ++i) m_full[i] = opts[r].m().data()[at++];
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(m_full[i], ref.m().data()[i]) << "m element " << i;
}

}  // namespace
}  // namespace moe
