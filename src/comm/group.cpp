// Group over MPI (or, without MPI, a group of one). See group.h; Request is in request.cpp, the
// collective timeout in comm_timeout.cpp, the mailbox of a group of one in group_local.cpp.
#include "comm/group.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "comm/group_internal.h"
#include "comm/host_stage.h"
#include "comm/mpi_runtime.h"
#include "comm/sim_overhead.h"
#include "comm/nccl.h"
#include "core/error.h"

namespace moe::comm {
namespace detail {
namespace {
// Bytes spanned by a (counts, displacements) pair of an alltoallv side.
size_t extent_bytes(const std::vector<int>& counts, const std::vector<int>& displs, int dtype) {
  int64_t end = 0;
  for (size_t i = 0; i < counts.size() && i < displs.size(); ++i)
    if (counts[i] > 0) end = std::max<int64_t>(end, int64_t{displs[i]} + counts[i]);
  return static_cast<size_t>(end) * dtype_bytes(dtype);
}

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return str_cat("MPI error code ", rc);
  return std::string(buf, len);
}
}  // namespace

void fail(const char* op, int rc, int rank, int size, int peer, int tag) {
  std::string where = str_cat(op, " failed on group rank ", rank, " of ", size);
  if (peer >= 0) where += str_cat(" (peer ", peer, tag >= 0 ? str_cat(", tag ", tag) : "", ")");
  throw Error(str_cat(where, ": ", mpi_error_string(rc)));
}

int to_int(int64_t count, const char* op) {
  MOE_CHECK(count >= 0 && count <= INT_MAX, op, ": count ", count,
            " out of MPI's int range [0, ", INT_MAX, "]");
  return static_cast<int>(count);
}

bool mpi_alive() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}
}  // namespace detail

using namespace detail;

namespace {
// "world ranks 0-3" / "world ranks 0,2,4": the members of a group, as ranges.
std::string describe_members(const std::vector<int>& world_ranks) {
  std::string s = "world ranks ";
  for (size_t i = 0; i < world_ranks.size();) {
    size_t j = i;
    while (j + 1 < world_ranks.size() && world_ranks[j + 1] == world_ranks[j] + 1) ++j;
    if (i > 0) s += ",";
    s += std::to_string(world_ranks[i]);
    if (j > i) {
      s += j == i + 1 ? ',' : '-';
      s += std::to_string(world_ranks[j]);
    }
    i = j + 1;
  }
  return s;
}
}  // namespace

// ---- Group ----

Group::Group(Group&& o) noexcept { *this = std::move(o); }

Group& Group::operator=(Group&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = o.comm_;
    valid_ = std::exchange(o.valid_, false);
    rank_ = std::exchange(o.rank_, -1);
    size_ = std::exchange(o.size_, 0);
    world_rank_ = o.world_rank_;
    world_ranks_ = std::move(o.world_ranks_);
    members_ = std::move(o.members_);
    nccl_ = std::move(o.nccl_);
    local_ = std::move(o.local_);
  }
  return *this;
}

Group::~Group() { release(); }

void Group::release() noexcept {
  nccl_.reset();
  if (!valid_) return;
  valid_ = false;
  if (local_) {
    local_.reset();
    return;
  }
  if (!mpi_alive()) return;  // outlived MpiRuntime: MPI_Finalize has freed it
  MPI_Comm c = unpack<MPI_Comm>(comm_);
  MPI_Comm_free(&c);
}

namespace {
// Fills a Group's fields from an owned communicator.
void adopt(MPI_Comm c, uint64_t& comm, bool& valid, int& rank, int& size, int& world_rank,
           std::vector<int>& world_ranks, std::string& members) {
  comm = pack(c);
  valid = true;
  auto check = [&](int rc, const char* op) {
    if (rc != MPI_SUCCESS) fail(op, rc, rank, size);
  };
  check(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(c, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(c, &size), "MPI_Comm_size");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank(MPI_COMM_WORLD)");
  MPI_Group g, w;
  check(MPI_Comm_group(c, &g), "MPI_Comm_group");
  check(MPI_Comm_group(MPI_COMM_WORLD, &w), "MPI_Comm_group(MPI_COMM_WORLD)");
  std::vector<int> mine(size);
  for (int i = 0; i < size; ++i) mine[i] = i;
  world_ranks.assign(size, -1);
  int rc = MPI_Group_translate_ranks(g, size, mine.data(), w, world_ranks.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  check(rc, "MPI_Group_translate_ranks");
  members = describe_members(world_ranks);
}
}  // namespace

Group Group::world() {
  if (!mpi_alive() && MpiRuntime::local_world()) {
    Group g;
    g.local_ = std::make_shared<LocalBox>();
    g.valid_ = true;
    g.rank_ = 0;
    g.size_ = 1;
    g.world_rank_ = 0;
    g.world_ranks_ = {0};
    g.members_ = describe_members(g.world_ranks_);
    return g;
  }
  MOE_CHECK(mpi_alive(), "Group::world: MPI is not initialised (create a comm::MpiRuntime first)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm c;
  int rc;
  {
    int r = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    OpScope scope("MPI_Comm_dup(MPI_COMM_WORLD)", r, n, kNoMembers);
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
  }
  if (rc != MPI_SUCCESS) {
    int r = 0, n = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    fail("MPI_Comm_dup(MPI_COMM_WORLD)", rc, r, n);
  }
  Group g;
  adopt(c, g.comm_, g.valid_, g.rank_, g.size_, g.world_rank_, g.world_ranks_, g.members_);
  return g;
}

Group Group::split(int color, int key) const {
  MOE_CHECK(valid_, "Group::split on an invalid group");
  if (local_) {  // a group of one splits into itself (with its own messages, as MPI's would) or none
    (void)key;
    Group g;
    if (color < 0) return g;
    g.local_ = std::make_shared<LocalBox>();
    g.valid_ = true;
    g.rank_ = 0;
    g.size_ = 1;
    g.world_rank_ = world_rank_;
    g.world_ranks_ = world_ranks_;
    g.members_ = members_;
    return g;
  }
  MPI_Comm c;
  int rc;
  {
    OpScope scope("MPI_Comm_split", rank_, size_, members_);
    rc = MPI_Comm_split(unpack<MPI_Comm>(comm_), color < 0 ? MPI_UNDEFINED : color, key, &c);
  }
  if (rc != MPI_SUCCESS) fail("MPI_Comm_split", rc, rank_, size_);
  Group g;
  if (c == MPI_COMM_NULL) return g;
  adopt(c, g.comm_, g.valid_, g.rank_, g.size_, g.world_rank_, g.world_ranks_, g.members_);
  return g;
}

int Group::world_rank_of(int group_rank) const {
  MOE_CHECK(group_rank >= 0 && group_rank < size_, "Group::world_rank_of: rank ", group_rank,
            " out of range [0, ", size_, ")");
  return world_ranks_[group_rank];
}

void Group::check_peer(int peer, const char* op) const {
  MOE_CHECK(valid_, op, " on an invalid group");
  MOE_CHECK(peer >= 0 && peer < size_, op, " on group rank ", rank_, " of ", size_, ": peer ",
            peer, " out of range [0, ", size_, ")");
}

void Group::enable_nccl() {
  MOE_CHECK(valid_, "enable_nccl on an invalid group");
  if (local_) return;  // one member: every collective is a local copy, nothing to move
  if (!nccl_) nccl_ = std::make_shared<NcclComm>(*this);
}

void Group::barrier() const {
  MOE_CHECK(valid_, "MPI_Barrier on an invalid group");
  if (local_) return;
  OpScope scope("MPI_Barrier", rank_, size_, members_);
  int rc = MPI_Barrier(unpack<MPI_Comm>(comm_));
  if (rc != MPI_SUCCESS) fail("MPI_Barrier", rc, rank_, size_);
}

void Group::alltoall(const int32_t* send, int32_t* recv, int count_per_rank) const {
  MOE_CHECK(valid_, "MPI_Alltoall on an invalid group");
  if (local_) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(std::max(count_per_rank, 0)) * sizeof(int32_t));
    return;
  }
  OpScope scope("MPI_Alltoall", rank_, size_, members_);
  note_sim_messages(2 * (size_ - 1));
  int rc = MPI_Alltoall(send, count_per_rank, MPI_INT32_T, recv, count_per_rank, MPI_INT32_T,
                        unpack<MPI_Comm>(comm_));
  charge_sim_messages();
  if (rc != MPI_SUCCESS) fail("MPI_Alltoall", rc, rank_, size_);
}

void Group::alltoallv_impl(int dtype, const void* send, const std::vector<int>& send_counts,
                           const std::vector<int>& send_displs, void* recv,
                           const std::vector<int>& recv_counts,
                           const std::vector<int>& recv_displs) const {
  MOE_CHECK(valid_, "MPI_Alltoallv on an invalid group");
  size_t n = static_cast<size_t>(size_);
  MOE_CHECK(send_counts.size() == n && send_displs.size() == n && recv_counts.size() == n &&
                recv_displs.size() == n,
            "MPI_Alltoallv on group rank ", rank_, " of ", size_,
            ": counts/displacements must have one entry per rank (got ", send_counts.size(), ", ",
            send_displs.size(), ", ", recv_counts.size(), ", ", recv_displs.size(), ")");
  if (local_) {  // this rank's one segment to itself
    MOE_CHECK(send_counts[0] == recv_counts[0] && send_counts[0] >= 0 && send_displs[0] >= 0 &&
                  recv_displs[0] >= 0,
              "MPI_Alltoallv on group rank 0 of 1: sends ", send_counts[0], " elements to itself but receives ",
              recv_counts[0]);
    if (send_counts[0] == 0) return;
    const size_t b = dtype_bytes(dtype);
    HostStage s(send, extent_bytes(send_counts, send_displs, dtype), /*fill=*/true);
    HostStage r(recv, extent_bytes(recv_counts, recv_displs, dtype), /*fill=*/true);
    std::memmove(r.as<char>() + static_cast<size_t>(recv_displs[0]) * b,
                 s.as<char>() + static_cast<size_t>(send_displs[0]) * b, static_cast<size_t>(send_counts[0]) * b);
    r.store();
    return;
  }
  if (nccl_ && device_of(send) == Device::kCuda && device_of(recv) == Device::kCuda) {
    OpScope scope("ncclSend/ncclRecv (alltoallv)", rank_, size_, members_);
    nccl_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype);
    return;
  }
  MPI_Datatype t = mpi_type(dtype);
  HostStage s(send, extent_bytes(send_counts, send_displs, dtype), /*fill=*/true);
  // Filled too: store() writes the whole extent back, gaps between segments included.
  HostStage r(recv, extent_bytes(recv_counts, recv_displs, dtype), /*fill=*/true);
  int messages = 0;  // non-empty messages to and from other ranks (simulated overhead)
  for (size_t p = 0; p < n; ++p)
    if (static_cast<int>(p) != rank_) messages += (send_counts[p] > 0) + (recv_counts[p] > 0);
  note_sim_messages(messages);
  int rc;
  {
    OpScope scope("MPI_Alltoallv", rank_, size_, members_);
    rc = MPI_Alltoallv(s.get(), send_counts.data(), send_displs.data(), t, r.get(),
                       recv_counts.data(), recv_displs.data(), t, unpack<MPI_Comm>(comm_));
    charge_sim_messages();
  }
  if (rc != MPI_SUCCESS) fail("MPI_Alltoallv", rc, rank_, size_);
  r.store();
}

void Group::alltoallv(const float* send, const std::vector<int>& sc, const std::vector<int>& sd,
                      float* recv, const std::vector<int>& rc, const std::vector<int>& rd) const {
  alltoallv_impl(kFloat, send, sc, sd, recv, rc, rd);
}
void Group::alltoallv(const int32_t* send, const std::vector<int>& sc, const std::vector<int>& sd,
                      int32_t* recv, const std::vector<int>& rc, const std::vector<int>& rd) const {
  alltoallv_impl(kInt32, send, sc, sd, recv, rc, rd);
}

void Group::allreduce_impl(int dtype, int op, void* data, int64_t count, const char* name) const {
  MOE_CHECK(valid_, name, " on an invalid group");
  int n = to_int(count, name);
  if (local_) return;  // the sum or max over one rank is its own value
  if (nccl_ && device_of(data) == Device::kCuda) {
    OpScope scope("ncclAllReduce", rank_, size_, members_);
    nccl_->allreduce(data, n, dtype, op);
    return;
  }
  HostStage d(data, static_cast<size_t>(n) * dtype_bytes(dtype), /*fill=*/true);
  int rc;
  {
    OpScope scope(name, rank_, size_, members_);
    rc = MPI_Allreduce(MPI_IN_PLACE, d.get(), n, mpi_type(dtype), op == 0 ? MPI_SUM : MPI_MAX,
                       unpack<MPI_Comm>(comm_));
  }
  if (rc != MPI_SUCCESS) fail(name, rc, rank_, size_);
  d.store();
}

void Group::allreduce_sum(float* d, int64_t n) const { allreduce_impl(kFloat, 0, d, n, "MPI_Allreduce(sum)"); }
void Group::allreduce_sum(double* d, int64_t n) const { allreduce_impl(kDouble, 0, d, n, "MPI_Allreduce(sum)"); }
void Group::allreduce_sum(int64_t* d, int64_t n) const { allreduce_impl(kInt64, 0, d, n, "MPI_Allreduce(sum)"); }
void Group::allreduce_max(double* d, int64_t n) const { allreduce_impl(kDouble, 1, d, n, "MPI_Allreduce(max)"); }
void Group::allreduce_max(int64_t* d, int64_t n) const { allreduce_impl(kInt64, 1, d, n, "MPI_Allreduce(max)"); }

void Group::allgather_impl(int dtype, const void* send, void* recv, int count_per_rank) const {
  MOE_CHECK(valid_, "MPI_Allgather on an invalid group");
  if (local_) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(std::max(count_per_rank, 0)) * dtype_bytes(dtype));
    return;
  }
  OpScope scope("MPI_Allgather", rank_, size_, members_);
  int rc = MPI_Allgather(send, count_per_rank, mpi_type(dtype), recv, count_per_rank, mpi_type(dtype),
                         unpack<MPI_Comm>(comm_));
  if (rc != MPI_SUCCESS) fail("MPI_Allgather", rc, rank_, size_);
}

void Group::allgather(const int32_t* send, int32_t* recv, int count_per_rank) const {
  allgather_impl(kInt32, send, recv, count_per_rank);
}
void Group::allgather(const double* send, double* recv, int count_per_rank) const {
  allgather_impl(kDouble, send, recv, count_per_rank);
}

// Block displacements of reduce_scatter_sum/allgatherv; checks one count per rank.
std::vector<int> Group::block_displs(const std::vector<int>& counts, const char* op) const {
  MOE_CHECK(valid_, op, " on an invalid group");
  MOE_CHECK(static_cast<int>(counts.size()) == size_, op, " on group rank ", rank_, " of ", size_,
            ": counts must have one entry per rank (got ", counts.size(), ")");
  std::vector<int> displs(counts.size());
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    MOE_CHECK(counts[r] >= 0, op, ": negative count ", counts[r], " for rank ", r);
    displs[r] = to_int(at, op);
    at += counts[r];
  }
  to_int(at, op);
  return displs;
}

void Group::reduce_scatter_sum(float* data, const std::vector<int>& counts) const {
  const char* op = "MPI_Reduce_scatter(sum)";
  const std::vector<int> displs = block_displs(counts, op);
  if (local_) return;  // the one block already holds the sum over one rank
  const size_t total = static_cast<size_t>(displs.back()) + counts.back();
  HostStage d(data, total * sizeof(float), /*fill=*/true);
  int rc;
  {
    OpScope scope(op, rank_, size_, members_);
    // In place, MPI leaves this rank's reduced block at the start of the buffer.
    rc = MPI_Reduce_scatter(MPI_IN_PLACE, d.get(), counts.data(), MPI_FLOAT, MPI_SUM,
                            unpack<MPI_Comm>(comm_));
  }
  if (rc != MPI_SUCCESS) fail(op, rc, rank_, size_);
  float* h = d.as<float>();
  std::memmove(h + displs[rank_], h, static_cast<size_t>(counts[rank_]) * sizeof(float));
  d.store();
}

void Group::allgatherv(float* data, const std::vector<int>& counts) const {
  const char* op = "MPI_Allgatherv";
  const std::vector<int> displs = block_displs(counts, op);
  if (local_) return;  // the one block is this rank's
  const size_t total = static_cast<size_t>(displs.back()) + counts.back();
  HostStage d(data, total * sizeof(float), /*fill=*/true);
  int rc;
  {
    OpScope scope(op, rank_, size_, members_);
    rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d.get(), counts.data(), displs.data(),
                        MPI_FLOAT, unpack<MPI_Comm>(comm_));
  }
  if (rc != MPI_SUCCESS) fail(op, rc, rank_, size_);
  d.store();
}

void Group::blocking(bool is_recv, int dtype, void* data, int64_t count, int peer, int tag) const {
  const char* op = is_recv ? "MPI_Recv" : "MPI_Send";
  check_peer(peer, op);
  int n = to_int(count, op);
  if (local_) {
    if (!is_recv) local_send(*local_, dtype, data, n, tag);
    else if (!local_take(*local_, dtype, data, n, tag, op)) local_never(op, tag);
    return;
  }
  MPI_Comm c = unpack<MPI_Comm>(comm_);
  HostStage h(data, static_cast<size_t>(n) * dtype_bytes(dtype), /*fill=*/!is_recv);
  if (!is_recv) {
    int rc;
    {
      OpScope scope(op, rank_, size_, members_, peer, world_ranks_[peer], tag);
      rc = MPI_Send(h.get(), n, mpi_type(dtype), peer, tag, c);
    }
    if (rc != MPI_SUCCESS) fail(op, rc, rank_, size_, peer, tag);
    return;
  }
  MPI_Status st;
  int rc;
  {
    OpScope scope(op, rank_, size_, members_, peer, world_ranks_[peer], tag);
    rc = MPI_Recv(h.get(), n, mpi_type(dtype), peer, tag, c, &st);
  }
  if (rc != MPI_SUCCESS) fail(op, rc, rank_, size_, peer, tag);
  int got = 0;
  MPI_Get_count(&st, mpi_type(dtype), &got);
  MOE_CHECK(got == n, "MPI_Recv on group rank ", rank_, " of ", size_, " (peer ", peer, ", tag ",
            tag, "): expected ", n, " elements, received ", got);
  h.store();
}

int64_t Group::probe_int32(int peer, int tag) const {
  check_peer(peer, "MPI_Probe");
  if (local_) {
    for (const LocalBox::Msg& m : local_->msgs)
      if (m.tag == tag) return static_cast<int64_t>(m.bytes.size() / sizeof(int32_t));
    local_never("MPI_Probe", tag);
  }
  MPI_Status st;
  int rc;
  {
    OpScope scope("MPI_Probe", rank_, size_, members_, peer, world_ranks_[peer], tag);
    rc = MPI_Probe(peer, tag, unpack<MPI_Comm>(comm_), &st);
  }
  if (rc != MPI_SUCCESS) fail("MPI_Probe", rc, rank_, size_, peer, tag);
  int got = 0;
  MPI_Get_count(&st, MPI_INT32_T, &got);
  MOE_CHECK(got >= 0, "MPI_Probe on group rank ", rank_, " of ", size_, " (peer ", peer, ", tag ",
            tag, "): the message is not a whole number of int32");
  return got;
}

Request Group::post(bool is_recv, int dtype, void* data, int64_t count, int peer, int tag) const {
  const char* op = is_recv ? "MPI_Irecv" : "MPI_Isend";
  check_peer(peer, op);
  int n = to_int(count, op);
  Request q;
  q.is_recv_ = is_recv;
  q.dtype_ = dtype;
  q.count_ = n;
  q.peer_ = peer;
  q.tag_ = tag;
  q.rank_ = rank_;
  q.size_ = size_;
  q.peer_world_ = world_ranks_[peer];
  if (local_) {
    if (!is_recv) {
      local_send(*local_, dtype, data, n, tag);  // complete: copied
    } else if (!local_take(*local_, dtype, data, n, tag, op)) {
      q.local_ = local_;
      q.local_id_ = local_->next_id++;
      q.active_ = true;
      local_->recvs.push_back({q.local_id_, tag, dtype, data, n, false});
    }
    return q;
  }
  // A host copy only for device memory: the CPU path posts the buffer itself, allocating nothing.
  std::shared_ptr<HostStage> stage;
  if (device_of(data) == Device::kCuda)
    stage = std::make_shared<HostStage>(data, static_cast<size_t>(n) * dtype_bytes(dtype),
                                        /*fill=*/!is_recv);
  void* buf = stage ? stage->get() : data;
  note_sim_messages(1);
  MPI_Request r;
  int rc = is_recv ? MPI_Irecv(buf, n, mpi_type(dtype), peer, tag, unpack<MPI_Comm>(comm_), &r)
                   : MPI_Isend(buf, n, mpi_type(dtype), peer, tag, unpack<MPI_Comm>(comm_), &r);
  if (rc != MPI_SUCCESS) fail(op, rc, rank_, size_, peer, tag);
  q.stage_ = std::move(stage);
  q.handle_ = pack(r);
  q.active_ = true;
  return q;
}

void Group::send(const float* d, int64_t n, int p, int t) const { blocking(false, kFloat, const_cast<float*>(d), n, p, t); }
void Group::send(const int32_t* d, int64_t n, int p, int t) const { blocking(false, kInt32, const_cast<int32_t*>(d), n, p, t); }
void Group::recv(float* d, int64_t n, int p, int t) const { blocking(true, kFloat, d, n, p, t); }
void Group::recv(int32_t* d, int64_t n, int p, int t) const { blocking(true, kInt32, d, n, p, t); }
Request Group::isend(const float* d, int64_t n, int p, int t) const { return post(false, kFloat, const_cast<float*>(d), n, p, t); }
Request Group::isend(const int32_t* d, int64_t n, int p, int t) const { return post(false, kInt32, const_cast<int32_t*>(d), n, p, t); }
Request Group::irecv(float* d, int64_t n, int p, int t) const { return post(true, kFloat, d, n, p, t); }
Request Group::irecv(int32_t* d, int64_t n, int p, int t) const { return post(true, kInt32, d, n, p, t); }

}  // namespace moe::comm