// The two-level all-reduce of a group whose members sit on several nodes, as NCCL and OpenMPI's
// han do: reduce-scatter inside each node (fast links), all-reduce across the nodes of the share
// each member holds (every member of a node sends at once, so the node's NICs all carry a
// share, instead of the one flow per node of a ring over the whole group), all-gather inside the
// node. Every member ends with the same bits: each share is summed once inside its node and once
// across the nodes (MPI_Allreduce gives its members one result), then copied.
//
//   NodeSplit s = NodeSplit::of(group, topo);        // collective over group, once
//   allreduce_sum(group, s, data, count);             // two levels where they apply, else flat
#pragma once
#include <cstdint>

#include "comm/group.h"
#include "comm/topology.h"

namespace moe::comm {

struct NodeSplit {
  Group node;   // the members on this rank's node, by group rank
  Group cross;  // the members with this rank's place on the other nodes, by node
  int per_node = 0, nodes = 0;
  bool uniform = false;  // every node holds per_node members (else two levels do not apply)

  // Collective over g. Members' nodes are topo.node_of(world rank).
  static NodeSplit of(const Group& g, const Topology& topo);
  // Whether allreduce_sum of `count` floats runs in two levels (core/two_level.h's rule, on
  // host buffers: a group on NCCL keeps NCCL's own algorithm).
  bool applies(const Group& g, int64_t count) const;
};

// In place: the sum over g of every member's data. Two levels where s.applies(g, count), else one
// g.allreduce_sum.
void allreduce_sum(const Group& g, const NodeSplit& s, float* data, int64_t count);

}  // namespace moe::comm
