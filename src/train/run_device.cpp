#include "train/run_device.h"

#include <utility>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/gemm_bf16_cpu.h"

namespace moe::train {

// The context's CUDA handles are made on first use, after select_device has picked the GPU.
RunDevice::RunDevice(const TrainOptions& opts, const RunSetup& setup, parallel::Grid& grid)
    : ctx_(setup.device, setup.precision == Precision::kBf16), on_(ctx_) {
  kernels::set_blas_threads(opts.device.threads);
  const int gpu = select_device(setup.device, grid.topo.local_rank(grid.world.rank()));
  if (grid.world.size() > 1) {
    std::vector<double> gpus(grid.world.size());
    const double mine = gpu;
    grid.world.allgather(&mine, gpus.data(), 1);
    std::vector<std::pair<double, int>> gpu_of_rank(grid.world.size());
    for (int r = 0; r < grid.world.size(); ++r) gpu_of_rank[r] = {setup.host_of[r], static_cast<int>(gpus[r])};
    std::string nccl_why;
    const bool nccl = setup.device == Device::kCuda && comm::nccl_loadable(&nccl_why);
    backend_ = comm::choose_comm_backend(setup.comm_backend, gpu_of_rank, nccl, &backend_why_, nccl_why);
    if (backend_ == CommBackend::kNccl)
      for (comm::Group* g : {&grid.ep, &grid.dp, &grid.data, &grid.pp, &grid.tp, &grid.tokens})
        if (g->valid() && g->size() > 1) g->enable_nccl();
  }
}

RunDevice::~RunDevice() = default;

}  // namespace moe::train
