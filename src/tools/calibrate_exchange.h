// Communication micro-benchmarks for `moetrain calibrate`: the token exchange (flat, rbd, halo) by
// size and group, point-to-point between neighbouring ranks, and all-reduce by size and group.
// Every group of the world measures at once (as in training, where every EP group exchanges at
// the same time); a point is the mean over iterations of the slowest rank's time (a step sums
// many of them, slow ones included). Plain data out: the planner's profile format lives in plan/,
// which does not link MPI.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/topology.h"
#include "core/modes.h"

namespace moe::comm {

struct CommMeasurement {
  std::string op;           // a2a | p2p | allreduce
  std::optional<A2a> algo;  // a2a: the exchange; else none
  int world = 0, group = 0, ranks_per_node = 0;
  std::vector<double> bytes;    // per rank (a2a: flat dispatch bytes tokens·k·H·4)
  std::vector<double> seconds;  // mean of the per-iteration maximum over ranks (a2a: one of
                                // dispatch and combine: the mean of plan + multicast and reduce,
                                // each timed after an idle gap as long as the last one took)
};

// Collective over `world`. Groups of `group` adjacent ranks (group divides world.size()); uniform
// routing of k distinct experts of max(8, group) per token over a TokenExchange.
std::vector<CommMeasurement> measure_a2a(const Group& world, const Topology& topo, int group,
                                         const std::vector<A2a>& algos, double min_bytes,
                                         double max_bytes, int hidden, int topk, int iters);
// Pairs (r, r + stride) for r whose r / stride is even exchange one message each way; the time of
// one direction. stride 1: neighbours (2i, 2i+1); stride = ranks per node: rank j of node 2i with
// rank j of node 2i+1, every pair across a node boundary at once.
CommMeasurement measure_p2p(const Group& world, double min_bytes, double max_bytes, int iters, int stride = 1);
CommMeasurement measure_allreduce(const Group& world, int group, double min_bytes, double max_bytes,
                                  int iters);

// A barrier over MPI_COMM_WORLD that sleeps instead of spinning, so one rank can time kernels
// alone on a machine with fewer cores than ranks.
void quiet_barrier();

}  // namespace moe::comm
