// The two-level all-reduce. See two_level.h.
#include "comm/two_level.h"

#include <algorithm>
#include <vector>

#include "core/two_level.h"

namespace moe::comm {

NodeSplit NodeSplit::of(const Group& g, const Topology& topo) {
  NodeSplit s;
  if (!g.valid()) return s;
  const int node = topo.node_of(g.world_rank());
  s.node = g.split(node, g.rank());
  s.cross = g.split(s.node.rank(), node);
  // Uniform: every node holds the same number of members (then each cross group spans them all).
  int64_t mm[2] = {s.node.size(), -s.node.size()};
  g.allreduce_max(mm, 2);
  s.uniform = mm[0] == -mm[1];
  s.per_node = s.node.size();
  s.nodes = s.cross.size();
  return s;
}

bool NodeSplit::applies(const Group& g, int64_t count) const {
  // MPI's block counts and displacements are int: larger spans stay on the flat call.
  return uniform && !g.nccl_enabled() && count < (int64_t{1} << 31) &&
         two_level_allreduce_applies(per_node, nodes, count);
}

void allreduce_sum(const Group& g, const NodeSplit& s, float* data, int64_t count) {
  if (!s.applies(g, count)) {
    if (g.size() > 1) g.allreduce_sum(data, count);
    return;
  }
  // Member i of the node owns block i: count / per_node floats, the first count % per_node
  // blocks one more.
  const int r = s.per_node;
  std::vector<int> counts(r);
  for (int i = 0; i < r; ++i) counts[i] = static_cast<int>(count / r + (i < count % r ? 1 : 0));
  int64_t mine = 0;
  for (int i = 0; i < s.node.rank(); ++i) mine += counts[i];
  s.node.reduce_scatter_sum(data, counts);
  s.cross.allreduce_sum(data + mine, counts[s.node.rank()]);
  s.node.allgatherv(data, counts);
}

}  // namespace moe::comm
