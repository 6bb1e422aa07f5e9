// Degrees of parallelism and the rank grid. World = PP × DP × EP × TP with TP fastest, then EP,
// then DP, then PP, so the ranks of one EP group are adjacent (and share a node when they fit).
//   world rank = ((pp_idx · dp + dp_idx) · ep + ep_idx) · tp + tp_idx
#pragma once
#include <string>
#include <vector>

#include "model/config.h"
#include "model/params.h"

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

// Layers per pipeline stage: `explicit_layers` (--pp.layers 5,4,4,3) when given, else an even
// split with the remainder on the first stages. Errors name the numbers: pp > layers, a stage
// with no layer, a list whose length is not pp or whose sum is not num_hidden_layers.
std::vector<int> split_layers(const model::ModelConfig& cfg, int pp,
                              const std::vector<int>& explicit_layers);
// The StageSpec of stage s for a split.
model::StageSpec stage_spec(const std::vector<int>& layers_per_stage, int s);

}  // namespace moe::parallel
