// Where each rank sits: world rank -> node -> switch group. Ranks are block-placed (rank /
// ranks_per_node = node), as mpirun --map-by core and srun's block distribution place them. The
// link class of two ranks is what every byte of an all-to-all is accounted by (comm/traffic.h);
// forcing ranks_per_node / nodes_per_group lets one machine run as several emulated nodes.
#pragma once
#include <string>

namespace moe::comm {

enum class LinkClass {
  kSameRank = 0,
  kIntraNode = 1,
  kInterNode = 2,
  kInterGroup = 3
};
inline constexpr int kNumLinkClasses = 4;
// "same_rank" | "intra_node" | "inter_node" | "inter_group"
const char* link_class_name(LinkClass c);

struct Topology {
  int world_size = 1;
  int ranks_per_node = 1;
  int nodes_per_group = 0;  // 0 = all nodes in one switch group

  int node_of(int world_rank) const { return world_rank / ranks_per_node; }
  int local_rank(int world_rank) const { return world_rank % ranks_per_node; }
  int group_of(int world_rank) const {
    return nodes_per_group > 0 ? node_of(world_rank) / nodes_per_group : 0;
  }
  int num_nodes() const { return world_size / ranks_per_node; }
  int num_groups() const { return nodes_per_group > 0 ? num_nodes() / nodes_per_group : 1; }
  // Same rank, same node, same switch group, else inter-group. Ranks must be in [0, world_size).
  LinkClass link(int a, int b) const;

  // Throws moe::Error naming the numbers: world_size % ranks_per_node != 0, nodes %
  // nodes_per_group != 0, or a value out of range.
  void validate() const;

  // forced_* > 0 win (flags --topo.ranks-per-node / --topo.nodes-per-group). Otherwise ranks per
  // node come from the launcher: OMPI_COMM_WORLD_LOCAL_SIZE, else SLURM_NTASKS_PER_NODE (its first
  // number), else the size of MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) when MPI is initialised
  // (then collective over MPI_COMM_WORLD), else world_size (one node). Validated.
  static Topology detect(int world_size, int forced_ranks_per_node = 0,
                         int forced_nodes_per_group = 0);

  // "8 ranks = 4 nodes x 2 ranks/node, 2 switch groups x 2 nodes"
  std::string describe() const;
};

}  // namespace moe::comm
