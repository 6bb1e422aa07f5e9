// ZeRO-1's collectives on real MPI processes: Group::reduce_scatter_sum / allgatherv with uneven
// blocks (an empty one included), and ZeroShard over a grid (DP = world, or EP 2 × DP world/2):
// every element stamped with its origin, so the receiver checks where each value came from.
#include <cstdio>
#include <vector>

#include "comm/mpi_runtime.h"
#include "model/config.h"
#include "model/params.h"
#include "mpi_check.h"
#include "parallel/grid.h"
#include "parallel/zero1.h"

namespace moe {
namespace {

void collectives(const comm::Group& g) {
  const int P = g.size(), me = g.rank();
  std::vector<int> counts(P);
  for (int r = 0; r < P; ++r) counts[r] = r == 1 ? 0 : 5 + r;  // rank 1's block is empty
  std::vector<int> displs(P, 0);
  for (int r = 1; r < P; ++r) displs[r] = displs[r - 1] + counts[r - 1];
  const int n = displs[P - 1] + counts[P - 1];
  std::vector<float> buf(n);
  for (int i = 0; i < n; ++i) buf[i] = static_cast<float>(me * 1000 + i);  // exact in float
  g.reduce_scatter_sum(buf.data(), counts);
  for (int i = displs[me]; i < displs[me] + counts[me]; ++i)
    CHECK(buf[i] == static_cast<float>(1000 * P * (P - 1) / 2 + P * i), "reduce_scatter_sum: element ", i,
          " = ", buf[i], ", expected the sum over ", P, " ranks");
  std::vector<float> all(n, -1.0f);
  for (int i = displs[me]; i < displs[me] + counts[me]; ++i) all[i] = static_cast<float>(me * 1000 + i);
  g.allgatherv(all.data(), counts);
  for (int r = 0; r < P; ++r)
    for (int i = displs[r]; i < displs[r] + counts[r]; ++i)
      CHECK(all[i] == static_cast<float>(r * 1000 + i), "allgatherv: element ", i, " = ", all[i],
            ", expected rank ", r, "'s");
}

void shard(int ep) {
  model::ModelConfig cfg = model::preset("test-moe");
  parallel::ParallelDims dims;
  dims.ep = ep;
  dims.dp = comm::Group::world().size() / ep;
  parallel::Grid grid = parallel::make_grid(dims, cfg, 0, 0);
  const int El = cfg.n_routed_experts / ep;
  model::ParamLayout layout(cfg, model::ExpertShard{grid.me.ep * El, El});
  const parallel::ZeroShard z = parallel::ZeroShard::split(layout, grid);
  const size_t n = layout.total();
  // Gradients: (data rank + 1) · (i mod 7), exact sums.
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((grid.data_rank() + 1) * static_cast<int>(i % 7));
  z.reduce_scatter(g.data());
  const int D = grid.data.size(), Pd = grid.dp.size();
  for (const parallel::ShardSpan& s : z.spans()) {
    // Replicated: summed over every data rank; experts: over the DP ranks of this EP index.
    double f = 0;
    if (s.expert)
      for (int d = 0; d < Pd; ++d) f += d * ep + grid.me.ep + 1;
    else
      f = D * (D + 1) / 2.0;
    for (size_t i = s.mine_begin(); i < s.mine_end(); ++i)
      CHECK(g[i] == static_cast<float>(f * (i % 7)), "ZeroShard::reduce_scatter: element ", i, " = ", g[i]);
  }
  // Parameters: this rank's slice stamped with its data rank; after allgather, each element names
  // its owner (the group rank holding it).
  std::vector<float> p(n, -1.0f);
  for (const auto& [b, e] : z.ranges())
    for (size_t i = b; i < e; ++i) p[i] = static_cast<float>(grid.data_rank());
  z.allgather(p.data());
  std::vector<float> local(z.owned());
  for (size_t k = 0; k < local.size(); ++k) local[k] = static_cast<float>(grid.data_rank());
  std::vector<float> full(n, -2.0f);
  z.gather_full(local.data(), Device::kCpu, full.data());
  for (const parallel::ShardSpan& s : z.spans()) {
    size_t at = s.begin;
    for (int r = 0; r < static_cast<int>(s.counts.size()); ++r) {
      // Group rank r's data rank: the data group is ordered by data rank; dp rank r has dp·ep + ep_idx.
      const float owner = static_cast<float>(s.expert ? r * ep + grid.me.ep : r);
      for (size_t i = at; i < at + static_cast<size_t>(s.counts[r]); ++i) {
        CHECK(p[i] == owner, "ZeroShard::allgather: element ", i, " = ", p[i], ", owner ", owner);
        CHECK(full[i] == owner, "ZeroShard::gather_full: element ", i, " = ", full[i], ", owner ", owner);
      }
      at += static_cast<size_t>(s.counts[r]);
    }
    CHECK(at == s.end, "span [", s.begin, ", ", s.end, ") blocks end at ", at);
  }
  std::vector<float> back(z.owned(), -3.0f);
  z.take_slice(full.data(), back.data(), Device::kCpu);
  CHECK(back == local, "take_slice(gather_full(slice)) is the slice");
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::comm::MpiRuntime mpi(&argc, &argv);
  int exit_code = 0;
  try {
    moe::comm::Group world = moe::comm::Group::world();
    moe::mpitest::ck.rank = world.rank();
    moe::collectives(world);
    moe::shard(1);
    if (world.size() % 2 == 0) moe::shard(2);
    exit_code = moe::mpitest::ck.report(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_test_zero1: %s\n", e.what());
    moe::comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
