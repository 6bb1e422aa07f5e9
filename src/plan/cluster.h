// ClusterProfile: what the planner knows about a machine. Either a preset built from published
// figures (frontier: REFERENCE §4; dgx-h100), whose GEMM/attention tables come from a roofline of
// those figures, or a profile file written by `moetrain calibrate` with measured tables (GEMM by
// shape, attention, memory-bound ops, optimizer, all-to-all / p2p / all-reduce by size and group,
// compute sharing when ranks outnumber cores). Errors name the field and the file.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/modes.h"
#include "plan/tables.h"

namespace moe::plan {

// One class of link, per rank and direction.
struct LinkClass {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // seconds per message
  // Seconds one way on the wire (NICs, switch hops), paid once per dependent phase of an
  // exchange, not per message (JSON "wire_latency", optional: 0).
  double wire_latency = 0;
  // Bytes/s one rank sends over this class to all its peers at once, when each peer has a path of
  // its own at `bandwidth` (JSON "injection", optional; 0: `bandwidth`, one path shared by them).
  double injection = 0;
};

// Seconds for one rank to send `bytes` spread evenly over `peers` peers of a link class: each
// peer's share at the link's bandwidth, and the whole under its injection limit.
double fan_out_seconds(const LinkClass& l, double bytes, int peers);

// A measured communication curve: seconds by bytes per rank.
//   a2a        dispatch of one MoE layer (plan + rows): bytes = rows sent · H · 4 per rank
//   p2p        one message between neighbouring ranks (all pairs at once)
//   allreduce  sum of a buffer of `bytes` over `group` ranks
struct CommCurve {
  std::string op;           // a2a | p2p | allreduce
  std::optional<A2a> algo;  // a2a: the exchange; else none (written as "")
  int world = 0;            // ranks running at once during the measurement
  int group = 0;            // ranks of one communicating group
  int ranks_per_node = 0;   // topology the measurement ran under
  Table1D seconds;
};

struct ClusterProfile {
  std::string name;                        // preset name or file path
  NodeKind kind = NodeKind::kGpu;          // gpu | cpu (cpu: a node's ranks share its cores and memory)
  Precision precision = Precision::kBf16;  // native training precision (cpu: fp32, the trainer's)
  int ranks_per_node = 8;                  // GPUs (or ranks) per node
  int nodes = 0;                           // nodes available (0 = no limit)
  int fast_domain_nodes = 1;               // N_h: nodes one EP group may span on single-hop links
  int nodes_per_group = 0;                 // nodes per switch group (0 = one group)
  int nics_per_node = 1;
  double nic_bandwidth = 0;     // bytes/s per NIC per direction
  double hbm_bytes = 0;         // memory per rank (cpu: per node, shared by its ranks)
  double reserved_bytes = 0;    // runtime, communication library, allocator slack
  double peak_flops = 0;        // per rank at the native precision (MFU's denominator)
  double mem_bandwidth = 0;     // bytes/s per rank
  bool fused_attention = true;  // flash attention: no s² activations
  LinkClass intra_node, inter_node, inter_group;
  // GEMM throughput by shape for the three forms a linear layer uses (kernels/gemm.cpp):
  // nt: y = x·wᵀ (forward), nn: dx = dy·w, tn: dw = dyᵀ·x.
  GemmTable gemm_nt, gemm_nn, gemm_tn;
  AttentionTable attention;
  // Memory-bound work (norms, rope, activation functions, softmax/top-k, gather/scatter, copies,
  // allocation) in seconds per activation element a layer allocates, forward and backward, by
  // the bytes of one [N, H] activation (cache and allocator behaviour change with the size).
  // recompute_*: recomputation's extra per element a layer drops in forward and rebuilds in
  // backward (the trainer's allocator hands freed pages back and faults them in again; GPU
  // caching allocators keep them: 0).
  Table1D elem_fwd, elem_bwd, recompute_fwd, recompute_bwd;
  double optimizer_s_per_param = 0;  // AdamW + gradient zeroing + norm, per local parameter
  int cores_per_node = 0;            // cpu
  Table1D compute_share;             // cpu: ranks busy on the node -> per-rank speed vs alone
  std::vector<CommCurve> comm;
  std::string notes;  // where the numbers come from

  // Memory one rank may use when `ranks_on_node` ranks share the node.
  double rank_memory(int ranks_on_node) const;
  // Per-rank compute speed relative to one rank alone (1 on GPUs).
  double compute_share_at(int ranks_on_node) const;
  // The measured curve for (op, algo, group) at this world size and topology, or the closest
  // world size measured with the same group and topology; null when none.
  const CommCurve* find_comm(const std::string& op, std::optional<A2a> algo, int world, int group,
                             int ranks_per_node) const;
  // Errors name the field: "frontier.json: \"ranks_per_node\" must be positive, got 0".
  void validate(const std::string& where) const;
};

ClusterProfile cluster_preset(const std::string& name);  // frontier | dgx-h100
std::vector<std::string> cluster_preset_names();
ClusterProfile load_profile(const std::string& path);
// Written through io::write_file_atomic (io/output_file.h): path is new or a regular file, never
// a link, device or FIFO; errors name `flag` ("--save-cluster", "calibrate -o") and the path.
void save_profile(const ClusterProfile& p, const std::string& path, const std::string& flag = "cluster profile");
nlohmann::json profile_to_json(const ClusterProfile& p);
ClusterProfile profile_from_json(const nlohmann::json& j, const std::string& where);
ClusterProfile resolve_cluster(const std::string& name_or_path);

// Roofline tables for a GPU preset: time = max(2mnk / (eff · peak), bytes moved / bandwidth) +
// launch, sampled on a grid, so that small and tall-skinny shapes come out far below peak.
GemmTable roofline_gemm(double peak_flops, double mem_bw, double efficiency, double elem_bytes,
                        double launch_s);
AttentionTable roofline_attention(double peak_flops, double efficiency);

}  // namespace moe::plan
