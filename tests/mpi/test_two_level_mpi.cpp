// The two-level gradient all-reduce (comm/two_level.h) on real MPI processes, one machine as
// several nodes (--ranks-per-node): the sum of exact values is exact, inexact sums are the same
// bits on every member and within round-off of the flat all-reduce, and spans below the threshold,
// groups with one member per node and groups with unequal members per node take the flat call.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi_runtime.h"
#include "comm/topology.h"
#include "comm/two_level.h"
#include "core/two_level.h"
#include "mpi_check.h"

namespace moe {
namespace {

void sums(const comm::Group& g, const comm::Topology& topo, int64_t n) {
  const comm::NodeSplit s = comm::NodeSplit::of(g, topo);
  const int P = g.size(), me = g.rank();
  const bool expect_two = s.uniform && two_level_allreduce_applies(s.per_node, s.nodes, n);
  CHECK(s.applies(g, n) == expect_two, "NodeSplit::applies(", n, ") = ", s.applies(g, n), " with ", s.per_node,
        " per node on ", s.nodes, " nodes, uniform ", s.uniform);
  // Exact: (rank + 1) · (i mod 7 + 1), summed (P(P+1)/2) · (i mod 7 + 1).
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((me + 1) * (i % 7 + 1));
  comm::allreduce_sum(g, s, x.data(), n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += x[i] != static_cast<float>(P * (P + 1) / 2 * (i % 7 + 1));
  CHECK(bad == 0, bad, " of ", n, " exact sums wrong (", s.per_node, " per node x ", s.nodes, " nodes)");
  // Inexact: the same bits on every member, and within round-off of the flat all-reduce.
  std::vector<float> y(n), flat(n);
  for (int64_t i = 0; i < n; ++i) y[i] = flat[i] = 0.1f * static_cast<float>(me + 1) * std::sin(0.001f * i);
  comm::allreduce_sum(g, s, y.data(), n);
  g.allreduce_sum(flat.data(), n);
  std::vector<double> hi(n), lo(n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    hi[i] = y[i];
    lo[i] = -static_cast<double>(y[i]);
    worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - flat[i]) / (1e-30 + std::fabs(flat[i]) + 1e-3));
  }
  g.allreduce_max(hi.data(), n);
  g.allreduce_max(lo.data(), n);
  bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += hi[i] != -lo[i];
  CHECK(bad == 0, bad, " of ", n, " sums differ between members");
  CHECK(worst < 1e-6, "two-level against flat: largest relative difference ", worst);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::comm::MpiRuntime mpi(&argc, &argv);
  int rpn = 1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--ranks-per-node") == 0) rpn = std::atoi(argv[i + 1]);
  int exit_code = 0;
  try {
    moe::comm::Group world = moe::comm::Group::world();
    moe::mpitest::ck.rank = world.rank();
    // A world that is not whole nodes still runs (its last node holds fewer: the flat call).
    moe::comm::Topology topo;
    topo.world_size = world.size();
    topo.ranks_per_node = rpn;
    for (int64_t n : {int64_t{1000}, moe::kTwoLevelMinFloats, int64_t{100003}}) moe::sums(world, topo, n);
    // Every other rank: members on each node halve, and stay uniform where the world is.
    moe::comm::Group half = world.split(world.rank() % 2, world.rank());
    moe::sums(half, topo, 100003);
    exit_code = moe::mpitest::ck.report(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_test_two_level: %s\n", e.what());
    moe::comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
