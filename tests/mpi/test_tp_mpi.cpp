// Tensor parallelism's conversions on real MPI processes (the TP group = the world): every rank
// cuts its slices out of one logical block stamped with each element's index (tp_slice), tp_gather
// puts them back together, and the result is the logical block, element for element.
#include <cstdio>
#include <vector>

#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "model/config.h"
#include "model/params.h"
#include "mpi_check.h"
#include "parallel/tensor_parallel.h"

namespace moe {
namespace {

void round_trip(const char* preset) {
  const comm::Group world = comm::Group::world();
  const model::ModelConfig cfg = model::preset(preset);
  const model::ParamLayout one(cfg);
  const model::ParamLayout mine(cfg, {}, {}, {world.rank(), world.size()});
  std::vector<float> full(one.total());
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i % (1 << 24));
  std::vector<float> local(mine.total(), -1.0f), back(one.total(), -1.0f);
  parallel::tp_slice(one, full.data(), mine, local.data());
  parallel::tp_gather(mine, local.data(), one, back.data(), world);
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < full.size(); ++i)
    if (back[i] != full[i] && wrong++ == 0) first = i;
  CHECK(wrong == 0, preset, ": tp_gather over ", world.size(), " ranks: ", wrong, " of ", full.size(),
        " elements wrong, the first at ", first);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::comm::MpiRuntime mpi(&argc, &argv);
  int exit_code = 0;
  try {
    moe::comm::Group world = moe::comm::Group::world();
    moe::mpitest::ck.rank = world.rank();
    moe::round_trip("test-moe");
    if (world.size() <= 2) moe::round_trip("test-dense");  // 2 heads
    exit_code = moe::mpitest::ck.report(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_test_tp: %s\n", e.what());
    moe::comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
