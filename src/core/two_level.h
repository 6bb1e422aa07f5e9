// When a gradient all-reduce runs in two levels (comm/two_level.h): one rule for the trainer, the
// simulated step (smpi/) and the planner's time model (plan/), which may not include comm/.
#pragma once
#include <cstdint>

namespace moe {

// Below this many floats the three collectives' latencies cost more than the ring's bandwidth
// saves: one flat all-reduce.
inline constexpr int64_t kTwoLevelMinFloats = int64_t{1} << 16;

// A group with `per_node` members on each of `nodes` nodes (the same on every node), summing
// `floats` floats: reduce-scatter inside the node, all-reduce of each member's share across the
// nodes, all-gather inside the node.
inline bool two_level_allreduce_applies(int per_node, int nodes, int64_t floats) {
  return per_node >= 2 && nodes >= 2 && floats >= kTwoLevelMinFloats;
}

}  // namespace moe
