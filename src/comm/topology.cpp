// Topology: block placement, link classes, detection from the launcher. See topology.h.
#include "comm/topology.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace moe::comm {

const char* link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::kSameRank: return "same_rank";
    case LinkClass::kIntraNode: return "intra_node";
    case LinkClass::kInterNode: return "inter_node";
    case LinkClass::kInterGroup: return "inter_group";
  }
  return "?";
}

LinkClass Topology::link(int a, int b) const {
  MOE_CHECK(a >= 0 && a < world_size && b >= 0 && b < world_size, "Topology::link: ranks ", a,
            ", ", b, " out of range [0, ", world_size, ")");
  if (a == b) return LinkClass::kSameRank;
  if (node_of(a) == node_of(b)) return LinkClass::kIntraNode;
  if (group_of(a) == group_of(b)) return LinkClass::kInterNode;
  return LinkClass::kInterGroup;
}

void Topology::validate() const {
  MOE_CHECK(world_size >= 1, "topology: world size ", world_size, " must be >= 1");
  MOE_CHECK(ranks_per_node >= 1, "topology: ranks per node ", ranks_per_node,
            " must be >= 1 (--topo.ranks-per-node)");
  MOE_CHECK(world_size % ranks_per_node == 0, "topology: world size ", world_size,
            " is not a multiple of ranks per node ", ranks_per_node, " (--topo.ranks-per-node)");
  MOE_CHECK(nodes_per_group >= 0, "topology: nodes per group ", nodes_per_group,
            " must be >= 0 (0 = one switch group; --topo.nodes-per-group)");
  if (nodes_per_group > 0) {
    MOE_CHECK(num_nodes() % nodes_per_group == 0, "topology: ", num_nodes(), " nodes (",
              world_size, " ranks / ", ranks_per_node,
              " per node) do not split into switch groups of ", nodes_per_group,
              " nodes (--topo.nodes-per-group)");
  }
}

namespace {

// First number of a SLURM task list such as "4(x2),2"; 0 when absent or malformed.
int leading_int(const char* s) {
  if (!s) return 0;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  return (end != s && v > 0 && v < (1L << 30)) ? static_cast<int>(v) : 0;
}

// Ranks sharing this one's node, from MPI; 0 when MPI is not initialised. Collective.
int mpi_node_size() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return 0;
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS)
    return 0;
  int n = 0;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  // Every rank must agree, or block placement does not hold.
  int lo = n, hi = n;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MOE_CHECK(lo == hi, "topology: nodes hold different numbers of ranks (", lo, " to ", hi,
            "); set --topo.ranks-per-node");
  return n;
}

}  // namespace

Topology Topology::detect(int world_size, int forced_ranks_per_node, int forced_nodes_per_group) {
  MOE_CHECK(forced_ranks_per_node >= 0, "topology: --topo.ranks-per-node ", forced_ranks_per_node,
            " must be >= 0 (0 = from the launcher)");
  MOE_CHECK(forced_nodes_per_group >= 0, "topology: --topo.nodes-per-group ",
            forced_nodes_per_group, " must be >= 0 (0 = one switch group)");
  Topology t;
  t.world_size = world_size;
  t.nodes_per_group = forced_nodes_per_group;
  std::string source = "--topo.ranks-per-node";
  int rpn = forced_ranks_per_node;
  if (rpn <= 0) {
    source = "OMPI_COMM_WORLD_LOCAL_SIZE";
    rpn = leading_int(std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"));
  }
  if (rpn <= 0) {
    source = "SLURM_NTASKS_PER_NODE";
    rpn = leading_int(std::getenv("SLURM_NTASKS_PER_NODE"));
  }
  if (rpn <= 0) {
    source = "MPI_COMM_TYPE_SHARED";
    rpn = mpi_node_size();
  }
  if (rpn <= 0) {
    source = "world size";
    rpn = world_size;
  }
  t.ranks_per_node = rpn;
  try {
    t.validate();
  } catch (const Error& e) {
    throw Error(str_cat(e.what(), " [ranks per node from ", source, "]"));
  }
  return t;
}

std::string Topology::describe() const {
  std::string s = str_cat(world_size, " ranks = ", num_nodes(), " node", num_nodes() == 1 ? "" : "s",
                          " x ", ranks_per_node, " ranks/node");
  if (nodes_per_group > 0)
    s += str_cat(", ", num_groups(), " switch group", num_groups() == 1 ? "" : "s", " x ",
                 nodes_per_group, " nodes");
  else
    s += ", one switch group";
  return s;
}

}  // namespace moe::comm
