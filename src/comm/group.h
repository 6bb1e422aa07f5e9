// A communicator: a set of ranks that exchange data (the world, an expert-parallel group, a
// pipeline pair). Owns a duplicated MPI communicator, so its traffic never mixes with other
// groups'. Every call checks MPI's return code and throws moe::Error naming the operation, this
// rank's place in the group, the peer where there is one, and MPI's own message.
// Counts and displacements are in elements. Buffers may be GPU memory (device_of decides): MPI
// here is not CUDA-aware, so they are staged through host copies (a receive is stored to the
// device when it completes). mpi.h stays out of this header: MPI handles are
// kept as opaque 64-bit words (checked by static_assert in group_internal.h).
#pragma once
#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace moe::comm {

class HostStage;  // comm/host_stage.h: the host copy of a device buffer in flight
struct LocalBox;  // group_internal.h: the messages a group of one sends itself (a world without MPI)
class NcclComm;   // comm/nccl.h: the NCCL communicator of a group

// A pending non-blocking send or receive. Movable, not copyable. A receive checks on completion
// that exactly the posted number of elements arrived. Destroying a pending request cancels a
// receive and detaches a send (only on error paths: wait for every request you post).
class Request {
 public:
  Request() = default;
  Request(Request&& o) noexcept;
  Request& operator=(Request&& o) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  bool pending() const { return active_; }
  void wait();

 private:
  friend class Group;
  friend void wait_all(std::vector<Request>& reqs);
  void release() noexcept;
  uint64_t handle_ = 0;  // MPI_Request
  bool active_ = false;
  bool is_recv_ = false;
  int dtype_ = 0;      // 0 float, 1 int32
  int64_t count_ = 0;  // elements posted
  int peer_ = -1, tag_ = 0, rank_ = -1, size_ = 0;
  int peer_world_ = -1;              // the peer's world rank (for the timeout message)
  std::shared_ptr<LocalBox> local_;  // a group of one without MPI: the mailbox, not handle_
  uint64_t local_id_ = 0;            // this receive's place in local_'s pending receives
  // A device buffer's host copy: what MPI reads (send) or fills (receive; stored to the device
  // when the request completes).
  std::shared_ptr<HostStage> stage_;
};

// Waits for all (MPI_Waitall); pending requests only, done ones are skipped.
void wait_all(std::vector<Request>& reqs);

// The collective timeout (`train --comm.timeout`). While one is alive, a rank that has waited in
// one operation of this file (a collective, a send or receive, a wait) for longer than `seconds`
// prints one line naming itself (world rank, pid, host), the operation, and the group and peer it
// waited on, and ends the process with exit status 1; the launcher then ends the job (a stalled
// or dead peer would otherwise keep every other rank waiting forever).
// The check runs on a watchdog thread, which never calls MPI (MPI_THREAD_FUNNELED), so a wait
// costs two clock reads and an uncontended lock. `stop_flag` (the trainer's SIGTERM/SIGINT flag)
// shortens the patience: once it is set, a wait that is still blocked `stop_grace_s` after the
// request ends the job too, so a stop request is never held up by a stalled peer.
// While it lives, the watchdogs also send each other UDP heartbeats, so the line names the ranks
// this rank no longer hears from (a cut link, a dead node) apart from ranks alive but elsewhere.
// Collective over MPI_COMM_WORLD when MPI is running (the heartbeat addresses are exchanged).
// Only one may be alive at a time; seconds <= 0 is refused (construct none to have no timeout).
class CommTimeout {
 public:
  explicit CommTimeout(double seconds, const volatile std::sig_atomic_t* stop_flag = nullptr,
                       double stop_grace_s = 30.0);
  ~CommTimeout();
  CommTimeout(const CommTimeout&) = delete;
  CommTimeout& operator=(const CommTimeout&) = delete;
};

class Group {
 public:
  Group() = default;  // invalid (valid() == false) until assigned
  Group(Group&& o) noexcept;
  Group& operator=(Group&& o) noexcept;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

  // A duplicate of MPI_COMM_WORLD (MPI must be initialised: see MpiRuntime), or, while an
  // MpiRuntime keeps a world of one without MPI, a local group of one: its collectives copy or do
  // nothing, a message to itself is matched as MPI would (tag, then order), and it calls no MPI.
  static Group world();
  // Collective. Ranks with the same color form one group, ordered by (key, rank). color < 0: this
  // rank joins no group (the result is invalid).
  Group split(int color, int key) const;

  bool valid() const { return valid_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int world_rank() const { return world_rank_; }  // of this process
  int world_rank_of(int group_rank) const;        // of a member

  void barrier() const;

  // Collective: from now on this group's all-reduces and alltoallvs of device buffers go over
  // NCCL (comm/nccl.h; every member must have its own GPU, selected before this call). Host
  // buffers and point-to-point stay on MPI.
  void enable_nccl();
  bool nccl_enabled() const { return nccl_ != nullptr; }

  // count_per_rank elements to and from every rank.
  void alltoall(const int32_t* send, int32_t* recv, int count_per_rank) const;
  // Counts/displacements: size() entries each, in elements.
  void alltoallv(const float* send, const std::vector<int>& send_counts,
                 const std::vector<int>& send_displs, float* recv,
                 const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) const;
  void alltoallv(const int32_t* send, const std::vector<int>& send_counts,
                 const std::vector<int>& send_displs, int32_t* recv,
                 const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) const;

  // In place, over all ranks.
  void allreduce_sum(float* data, int64_t count) const;
  void allreduce_sum(double* data, int64_t count) const;
  void allreduce_sum(int64_t* data, int64_t count) const;
  void allreduce_max(double* data, int64_t count) const;
  void allreduce_max(int64_t* data, int64_t count) const;

  // recv[r * count_per_rank + i] = rank r's send[i]
  void allgather(const int32_t* send, int32_t* recv, int count_per_rank) const;
  void allgather(const double* send, double* recv, int count_per_rank) const;

  // ZeRO-1 (parallel/zero1.h), in place over one buffer of sum(counts) elements cut into size()
  // consecutive blocks, block r of counts[r] elements:
  //   reduce_scatter_sum: afterwards this rank's block holds the sum over all ranks of that block
  //     (MPI_Reduce_scatter); the other blocks hold unspecified values.
  //   allgatherv: afterwards every block holds what its rank had there (MPI_Allgatherv).
  void reduce_scatter_sum(float* data, const std::vector<int>& counts) const;
  void allgatherv(float* data, const std::vector<int>& counts) const;

  void send(const float* data, int64_t count, int peer, int tag = 0) const;
  void send(const int32_t* data, int64_t count, int peer, int tag = 0) const;
  void recv(float* data, int64_t count, int peer, int tag = 0) const;  // exactly count arrive
  void recv(int32_t* data, int64_t count, int peer, int tag = 0) const;
  // The length in int32 of the next message from peer with this tag (MPI_Probe; it stays to be
  // received): for a message whose size the receiver cannot know without another round trip.
  int64_t probe_int32(int peer, int tag = 0) const;
  Request isend(const float* data, int64_t count, int peer, int tag = 0) const;
  Request isend(const int32_t* data, int64_t count, int peer, int tag = 0) const;
  Request irecv(float* data, int64_t count, int peer, int tag = 0) const;
  Request irecv(int32_t* data, int64_t count, int peer, int tag = 0) const;

 private:
  void release() noexcept;
  Request post(bool is_recv, int dtype, void* data, int64_t count, int peer, int tag) const;
  void blocking(bool is_recv, int dtype, void* data, int64_t count, int peer, int tag) const;
  void alltoallv_impl(int dtype, const void* send, const std::vector<int>& send_counts,
                      const std::vector<int>& send_displs, void* recv,
                      const std::vector<int>& recv_counts,
                      const std::vector<int>& recv_displs) const;
  void allreduce_impl(int dtype, int op, void* data, int64_t count, const char* name) const;
  void allgather_impl(int dtype, const void* send, void* recv, int count_per_rank) const;
  void check_peer(int peer, const char* op) const;
  std::vector<int> block_displs(const std::vector<int>& counts, const char* op) const;

  uint64_t comm_ = 0;  // MPI_Comm (owned; freed in the destructor)
  bool valid_ = false;
  std::string members_;  // "world ranks 0-3" (for the timeout message)
  int rank_ = -1, size_ = 0, world_rank_ = -1;
  std::vector<int> world_ranks_;     // [size] world rank of each member
  std::shared_ptr<NcclComm> nccl_;   // set by enable_nccl
  std::shared_ptr<LocalBox> local_;  // set: a group of one without MPI (comm_ unused)
};

}  // namespace moe::comm
