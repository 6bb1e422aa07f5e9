// The token exchange of expert parallelism: a sparse multicast of rows from source ranks to the
// ranks that hold their experts, and its reverse, a sparse reduction back to the sources. Three
// algorithms (and their combination) move the same rows behind one interface, and give
// bit-identical results:
//   flat  one alltoallv over the group (per (token, destination) pair, padding-free rows)
//   rbd   X-MoE redundancy-bypassing dispatch: a row crosses to a remote node once per
//         (row, destination node) as a pilot; the pilot's rank copies it to the other ranks of its
//         node; on the way back, contributions are summed on that node before crossing back
//   halo  Piper's 3-phase all-to-all: I intra-node (overlapped with II/III), II one packed message
//         per destination node rail to rail (local rank j -> local rank j), III intra-node forward
//   rbd-halo  both: rbd's pilots, one per (row, destination node), travel as halo's phase II (one
//         packed message per remote node, to my rail peer there), which copies each pilot to the
//         ranks of its pairs on that node (phase III); sums fold on that node on the way back
// Only its implementation (exchange.cpp, one exchange_<algorithm>.cpp per algorithm behind
// exchange_internal.h) and comm/ talk to the network.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/topology.h"
#include "comm/traffic.h"
#include "core/buffer.h"
#include "core/modes.h"

namespace moe::comm {
namespace exchange_detail {
class StagingPool;
struct ExchangeRun;
}  // namespace exchange_detail

// The algorithm (flat, rbd, halo, rbd-halo) is core/modes.h's A2a.

// Device buffers: src/recv/rows/dst/values may be GPU memory (device_of decides); they are staged
// through host copies around the host algorithms (v1: MPI is not CUDA-aware here). The host copies
// are host memory, so they are not charged to the staging tracker, which counts the device's.
//
// Who sends what to whom in one exchange; built collectively by TokenExchange::plan and reused,
// unchanged, for every exchange of that layer's forward and backward (a dispatch handle).
// Pair p of a source: (src_row[p], dst_rank[p], tag[p], value[p]); pairs are listed grouped by
// dst_rank ascending (stable). On a receiver, received pairs are in canonical order: by source
// rank ascending, then in the source's pair order.
struct ExchangePlan {
  int num_src_rows = 0;                // rows of the source buffer (tokens)
  int num_send_pairs = 0;              // pairs this rank sends
  int num_recv = 0;                    // pairs this rank receives
  std::vector<int32_t> recv_tag;       // [num_recv] tag of each received pair (e.g. expert id)
  std::vector<float> recv_value;       // [num_recv] value of each received pair (e.g. combine weight)
  std::vector<int32_t> recv_src_rank;  // [num_recv] group rank the pair came from
  struct Impl;                         // algorithm-specific routing tables
  std::shared_ptr<Impl> impl;
};

class TokenExchange {
 public:
  // group: the expert-parallel group; topo: ranks -> nodes, in WORLD ranks (group.world_rank()
  // maps). stats may be null. The object is cheap; one per MoE layer or shared by all.
  TokenExchange(const Group& group, const Topology& topo, A2a algo, TrafficStats* stats);
  A2a algorithm() const { return algo_; }
  // Charges the staging rows every exchange allocates while it runs (send/receive buffers, RBD
  // pools, HALO rails) to `tracker`; null (the default) charges nothing.
  void set_staging_tracker(MemTracker* tracker) { staging_ = tracker; }
  // Keeps the staging rows from one exchange to the next instead of allocating them per call
  // (off by default: a trainer with one TokenExchange per layer would hold every layer's staging
  // between calls). The SMPI programs turn it on: there every allocation is a fresh shared
  // mapping, and touching it again is most of what simulating an exchange costs. Copies of this
  // object share the kept rows; use them one at a time.
  void keep_staging(bool keep);
  // false: every message is sent with its size, but no row is packed, copied or summed, so the
  // receive and reduce buffers hold whatever they held. For a simulation whose rows are
  // placeholders (moetrain_smpi_step: SMPI's shared malloc, compute not executed), where copying
  // rows is most of the host's work and none of the simulated time. True by default.
  void set_copy_rows(bool copy) { copy_rows_ = copy; }

  // Collective. Exchanges counts and the per-pair metadata (tag, value). fold_key (optional, one
  // int per pair): reduce then sums each source row's pairs in ascending fold_key order, one pair
  // at a time, independent of where the pairs went (see reduce); rbd then returns every pair's row
  // unsummed (its in-network sums would group by node).
  ExchangePlan plan(int num_src_rows, int num_pairs, const int32_t* src_row,
                    const int32_t* dst_rank, const int32_t* tag, const float* value,
                    const int32_t* fold_key = nullptr) const;

  // Collective. recv[i,:] = src[src_row(i),:] of the source of received pair i (canonical order).
  // src [num_src_rows, H]; recv [num_recv, H].
  void multicast(const ExchangePlan& plan, const float* src, float* recv, int H) const;

  // Collective. The reverse: dst[t,:] += the sum of rows[i,:] over the received pairs i whose
  // source pair had src_row t. Summation order, identical for every algorithm (so results are
  // bit-identical): S_rank(t, r) = left fold, in pair order, of the rows of t's pairs on rank r;
  // S_node(t, n) = left fold of S_rank over the ranks r of node n, ascending; then
  // dst[t] += S_node(t, n) for the nodes n ascending. With a fold key: dst[t] += row of each of
  // t's pairs, in ascending key order (the same bits whichever ranks hold the pairs, and for every
  // algorithm). rows [num_recv, H]; dst [num_src_rows, H].
  void reduce(const ExchangePlan& plan, const float* rows, float* dst, int H) const;

  // Collective. One float per received pair back to its source: src_vals[p] = recv_vals[i(p)].
  void return_values(const ExchangePlan& plan, const float* recv_vals, float* src_vals) const;

 private:
  // The algorithms on host memory (the public calls stage device buffers around them).
  void multicast_host(const ExchangePlan& plan, const float* src, float* recv, int H) const;
  void reduce_host(const ExchangePlan& plan, const float* rows, float* dst, int H) const;
  void return_values_host(const ExchangePlan& plan, const float* recv_vals, float* src_vals) const;
  // What one call's algorithm runs with (starts the call's use of the kept staging rows).
  exchange_detail::ExchangeRun start_run(const ExchangePlan::Impl& im) const;

  const Group& group_;
  const Topology& topo_;
  A2a algo_;
  TrafficStats* stats_;
  MemTracker* staging_ = nullptr;
  std::shared_ptr<exchange_detail::StagingPool> pool_;  // keep_staging
  bool copy_rows_ = true;
};

}  // namespace moe::comm
