// `moetrain bench a2a`: the token dispatch (plan + multicast) of flat, rbd and halo, nccl-tests
// style: one row per (message size, algorithm) with time, algbw, busbw, the exact bytes that crossed
// node boundaries, and #wrong from checking every received row against its stamped origin.
//   size   bytes per rank that flat sends for the dispatch: tokens · k · H · 4
//   count  tokens per rank T = size / (k · H · 4), at least 1
//   time   median over iters of the slowest rank's plan + multicast (barrier before each)
//   algbw  size / time; busbw = algbw · (n − 1) / n (nccl-tests' all-to-all convention)
// Routing: every token picks k distinct experts of E; expert e lives on the rank the contiguous
// placement gives it (balance::LayerPlacement::contiguous(E, n): rank e / (E / n)).
//   uniform       each expert equally likely
//   skewed        expert e drawn with probability ∝ 1 / (e + 1)^1.2 (k draws without replacement,
//                 each proportional among the experts not yet chosen): low experts, hence low
//                 ranks, are hot
//   node-limited  DeepSeek-V3's node-limited routing: groups = nodes (n_group = nodes, each node's
//                 E / nodes experts), every token restricted to --topk-group nodes. Each token
//                 draws iid uniform scores and the router's own selection picks its experts
//                 (math::topk_row with a GroupLimit: the nodes with the largest top-2 score sums,
//                 then the top k inside them), so any one expert is as likely as under uniform.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "core/rng.h"

namespace moe::comm {

struct A2aBenchOptions {
  int64_t min_bytes = 256 << 10;  // -b
  int64_t max_bytes = 8 << 20;    // -e
  double factor = 2;              // -f: next size = size · factor
  int hidden = 1024;              // H
  int experts = 64;               // E (a multiple of the number of ranks)
  int topk = 8;                   // k
  std::vector<A2a> algorithms = {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo};
  std::string routing = "uniform";  // "uniform" | "skewed" | "node-limited"
  int topk_group = 0;               // node-limited: nodes a token may reach (required there only)
  int iters = 20, warmup = 5;
  uint64_t seed = 1;
  bool json = false;  // for the caller: print a2a_bench_json instead of the table
  // false: received rows' contents are not compared with their stamps (their origin, tag and
  // count still are). For SMPI runs whose row buffers are folded by shared malloc: all ranks'
  // rows then share pages, so their contents mean nothing.
  bool check_rows = true;
};

struct A2aBenchRow {
  int64_t size = 0;   // bytes per rank (tokens · k · H · 4)
  int64_t count = 0;  // tokens per rank
  A2a algo = A2a::kFlat;
  double time_us = 0;                    // plan + multicast (median of per-iteration max over ranks)
  double plan_us = 0, multicast_us = 0;  // the same statistic of each part
  double algbw_gbps = 0, busbw_gbps = 0;
  uint64_t inter_node_bytes = 0;        // row bytes over inter-node + inter-group links, all ranks
  uint64_t intra_node_bytes = 0;        // row bytes over intra-node links, all ranks
  uint64_t same_rank_bytes = 0;         // row bytes a rank routed to itself, all ranks
  double inter_node_msgs_per_rank = 0;  // non-empty inter-node row messages, mean over ranks
  int64_t wrong = 0;                    // rows with a wrong origin or content, plus missing rows
  // Receive-side imbalance (rows each rank's experts get; the same in every algorithm): the
  // busiest rank's rows and the hottest node's rows (its ranks summed). Under skewed routing these
  // bind, not the mean; the planner's a2a_seconds takes them as the bytes of the exchange.
  int64_t max_rank_recv_rows = 0, max_node_recv_rows = 0;
};

struct A2aBenchResult {
  A2aBenchOptions opts;
  int ranks = 0;
  std::string topology;  // Topology::describe()
  std::vector<A2aBenchRow> rows;
};

// The routing of the benchmark (and of `moetrain calibrate`): T tokens, each to k distinct of
// `experts` experts (as above; node-limited: n_group groups of consecutive experts, topk_group of
// them a token), expert e on the contiguous placement's rank; pairs grouped by destination rank
// (stable: token order), tag = expert id, value = token index (exact for T < 2^24: lets receivers
// verify origin).
struct A2aRouting {
  std::vector<int32_t> src_row, dst, tag;
  std::vector<float> value;
};
A2aRouting make_a2a_routing(int experts, int topk, const std::string& routing, int T, int n, Rng rng,
                            int n_group = 1, int topk_group = 1);

// Collective over `group` (every member calls it). Only rank 0's result needs to be complete
// (all ranks get the same rows here). Throws moe::Error on bad options (naming them).
A2aBenchResult run_a2a_bench(const Group& group, const Topology& topo, const A2aBenchOptions& opts);
std::string format_a2a_table(const A2aBenchResult& result);
std::string a2a_bench_json(const A2aBenchResult& result);

}  // namespace moe::comm
