// The device side of a run, set up once the grid exists: BLAS threads, this rank's GPU (its local
// rank modulo the visible GPUs), the run's execution context (device and GEMM precision:
// kernels/exec_context.h), and the transport of device buffers between ranks (NCCL when every
// rank has its own GPU and libnccl loads, else MPI staged through the host; decided from every
// rank's (host, GPU), so all agree). While it lives, the run's context is the current one: the
// model built then lives on its device and precision (and owns a context of its own for its
// work); destroyed, the thread is back on the context it had before.
#pragma once
#include <string>

#include "comm/nccl.h"
#include "kernels/exec_context.h"
#include "parallel/grid.h"
#include "train/run_setup.h"

namespace moe::train {

class RunDevice {
 public:
  // Collective over the world (the GPUs of every rank); enables NCCL on the grid's groups.
  RunDevice(const TrainOptions& opts, const RunSetup& setup, parallel::Grid& grid);
  ~RunDevice();
  RunDevice(const RunDevice&) = delete;
  RunDevice& operator=(const RunDevice&) = delete;
  CommBackend backend() const { return backend_; }
  const std::string& backend_why() const { return backend_why_; }

 private:
  CommBackend backend_ = CommBackend::kMpi;
  std::string backend_why_ = "one rank";
  kernels::ExecContext ctx_;
  kernels::ContextScope on_;  // every buffer and kernel of the run while it lives (after ctx_: ends first)
};

}  // namespace moe::train
