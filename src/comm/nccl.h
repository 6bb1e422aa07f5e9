// The NCCL backend of comm::Group: collectives on GPU buffers without staging through the host.
// Used when every rank of the job has its own GPU (NCCL refuses two ranks on one GPU); otherwise
// device buffers are staged through the host over MPI (comm/host_stage.h).
// libnccl.so.2 is opened at run time (dlopen), so a binary built with CUDA starts on a machine
// without NCCL and simply runs the MPI path there.
// What goes over NCCL: all-reduce (the gradient sync) and alltoallv (grouped ncclSend/ncclRecv),
// when the buffers are device memory. Point-to-point (the pipeline's isend/irecv, blocking
// send/recv) stays on MPI: both ends of a message must use the same transport, and NCCL p2p on
// one stream in 1F1B order can deadlock without grouping the pairs.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/modes.h"

namespace moe::comm {

class Group;

// Which transport carries device buffers: core/modes.h's CommBackend (mpi, nccl).

// Pure: the backend for a job (`req`: --comm.backend, std::nullopt = auto). gpu_of_rank[r] = (host id, GPU index) of world rank r, or
// (host, -1) on the CPU. NCCL needs: a CUDA device on every rank, each (host, GPU) used once, more
// than one rank, and the library (nccl_loadable). auto picks NCCL exactly then; nccl refuses
// otherwise (the error says which condition failed); mpi is always allowed. `why` says why the
// choice was made, for the log; `not_loadable` is why the library could not be used (quoted in
// the error and the log when that is the reason).
CommBackend choose_comm_backend(std::optional<CommBackend> req,
                                const std::vector<std::pair<double, int>>& gpu_of_rank,
                                bool nccl_loadable, std::string* why,
                                const std::string& not_loadable = "");

// True when this binary has the CUDA backend and libnccl.so.2 can be opened: the real NCCL, or
// on the emulated device (MOETRAIN_EMULATED_CUDA) only the fake one of tests/fake_nccl (NCCL's
// API over MPI). `why` receives the reason when not.
bool nccl_loadable(std::string* why = nullptr);

// One NCCL communicator over the ranks of a Group (same ranks, same order).
class NcclComm {
 public:
  // Collective over g: rank 0 makes the unique id, every rank receives it over MPI, then
  // ncclCommInitRank on the current CUDA device.
  explicit NcclComm(const Group& g);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // dtype: 0 float, 1 int32, 2 double, 3 int64 (Group's codes). op: 0 sum, 1 max. In place.
  // Synchronous with respect to the host (the legacy default stream, then a synchronise), as the
  // MPI path is.
  void allreduce(void* data, int64_t count, int dtype, int op) const;
  // Counts and displacements in elements, one entry per rank; both buffers device memory.
  void alltoallv(const void* send, const std::vector<int>& send_counts,
                 const std::vector<int>& send_displs, void* recv,
                 const std::vector<int>& recv_counts, const std::vector<int>& recv_displs,
                 int dtype) const;

 private:
  void* comm_ = nullptr;  // ncclComm_t
  int rank_ = 0, size_ = 0;
};

}  // namespace moe::comm
