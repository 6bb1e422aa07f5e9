// Tensor parallelism's conversions on real MPI processes (the TP group = the world): every rank
// cuts its slices out of one logical block stamped with each element's index (tp_slice), tp_gather
// puts them back together, and the result is the logical block, element for element. Then the
// step itself: a TP model with one process's weights, on one batch, gives that process's loss (the
// mean of the ranks' shard losses) and, after sync_tensor_parallel, its gradients, element by
// element (a wrong TP loss scale shows in every gradient, not only in their norm, which AdamW and
// clipping would hide from the losses of a run).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "model/config.h"
#include "model/model.h"
#include "moe/moe_layer.h"
#include "model/params.h"
#include "mpi_check.h"
#include "parallel/grid.h"
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

void gradients(const char* preset) {
  const comm::Group world = comm::Group::world();
  const model::ModelConfig cfg = model::preset(preset);
  const int B = 4, T = 16;
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % cfg.vocab_size);
  // One process's step, on every rank (no communication).
  model::Model one(cfg);
  one.init_weights(7);
  one.zero_grads();
  const double loss_one = one.forward(tokens.data(), B, T).total;
  one.backward(1.0f);
  // The same weights over the TP group (the world).
  parallel::ParallelDims dims;
  dims.tp = world.size();
  const parallel::Grid grid = parallel::make_grid(dims, cfg, 0, 0);
  model::TensorParallel tp{&grid.tp, grid.tp.rank(), grid.tp.size()};
  // As the trainer does: the router's batch statistics (aux loss) summed over the token shards.
  mixture::ExpertParallel xp;
  xp.reduce_aux_stats = [&grid](std::vector<double>& v) {
    grid.tokens.allreduce_sum(v.data(), static_cast<int64_t>(v.size()));
  };
  model::Model mine(cfg, {}, &xp, {}, Recompute::kNone, &tp);
  parallel::tp_slice(one.layout(), one.params(), mine.layout(), mine.params());
  mine.zero_grads();
  double loss = mine.forward(tokens.data(), B, T).total;
  mine.backward(1.0f);
  grid.tp.allreduce_sum(&loss, 1);
  loss /= grid.tp.size();
  CHECK(std::abs(loss - loss_one) <= 1e-5 * std::abs(loss_one), preset, " TP", world.size(), ": loss ", loss,
        ", one process ", loss_one);
  parallel::sync_tensor_parallel(mine.layout(), mine.grads(), grid);
  std::vector<float> g(one.layout().total(), NAN);
  parallel::tp_gather(mine.layout(), mine.grads(), one.layout(), g.data(), grid.tp);
  for (const model::ParamSpec& s : one.layout().specs()) {
    double scale = 0, err = 0, ratio = 0;
    for (size_t i = 0; i < s.numel; ++i) {
      const double want = one.grads()[s.offset + i], got = g[s.offset + i];
      scale = std::max(scale, std::abs(want));
      err = std::max(err, std::abs(got - want));
      ratio += want * got;
    }
    double norm2 = 0;
    for (size_t i = 0; i < s.numel; ++i) norm2 += static_cast<double>(one.grads()[s.offset + i]) * one.grads()[s.offset + i];
    CHECK(err <= 1e-4 * scale + 1e-9, preset, " TP", world.size(), ": gradient of ", s.name, " off by ", err,
          " (largest element ", scale, "; <g_tp, g_one> / |g_one|^2 = ", norm2 > 0 ? ratio / norm2 : 0.0, ")");
  }
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
    moe::gradients("test-moe");
    if (world.size() <= 2) moe::gradients("test-dense");
    exit_code = moe::mpitest::ck.report(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_test_tp: %s\n", e.what());
    moe::comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
