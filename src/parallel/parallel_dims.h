// Degrees of parallelism and the rank grid. World = PP × DP × EP × TP with TP fastest, then EP,
// then DP, then PP, so the ranks of one EP group are adjacent (and share a node when they fit).
//   world rank = ((pp_idx · dp + dp_idx) · ep + ep_idx) · tp + tp_idx
#pragma once
#include <string>

#include "model/config.h"

namespace moe::parallel {

struct ParallelDims {
  int pp = 1, dp = 1, ep = 1, tp = 1;

  int world() const { return pp * dp * ep * tp; }
  // Errors name the numbers: "pp(1) * dp(2) * ep(4) * tp(1) = 8 != world size 6".
  void validate(int world_size, const model::ModelConfig& cfg) const;
  std::string describe() const;  // "pp 1 × dp 2 × ep 4 × tp 1"
};

// Coordinates of one rank in the grid.
struct RankCoords {
  int pp = 0, dp = 0, ep = 0, tp = 0;
};
RankCoords coords_of(const ParallelDims& d, int world_rank);
int rank_of(const ParallelDims& d, const RankCoords& c);

}  // namespace moe::parallel
