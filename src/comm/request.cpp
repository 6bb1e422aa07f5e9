// Request and wait_all over MPI (or the mailbox of a group of one). See group.h.
#include <mpi.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "comm/group_internal.h"
#include "comm/host_stage.h"
#include "comm/sim_overhead.h"
#include "core/error.h"

namespace moe::comm {
using namespace detail;

Request::Request(Request&& o) noexcept { *this = std::move(o); }

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    release();
    handle_ = o.handle_;
    active_ = std::exchange(o.active_, false);
    is_recv_ = o.is_recv_;
    dtype_ = o.dtype_;
    count_ = o.count_;
    peer_ = o.peer_;
    peer_world_ = o.peer_world_;
    local_ = std::move(o.local_);
    local_id_ = o.local_id_;
    tag_ = o.tag_;
    rank_ = o.rank_;
    size_ = o.size_;
    stage_ = std::move(o.stage_);
  }
  return *this;
}

Request::~Request() { release(); }

void Request::release() noexcept {
  if (!active_) return;
  active_ = false;
  if (local_) {  // a pending local receive: cancelled
    local_forget(*local_, local_id_);
    local_.reset();
    return;
  }
  if (!mpi_alive()) return;
  MPI_Request r = unpack<MPI_Request>(handle_);
  if (is_recv_) {  // the buffer may die with us: make sure nothing lands in it later
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  } else {
    MPI_Request_free(&r);
    // MPI may still read a freed send's buffer: a staged host copy is kept for the process's life
    // (error paths only).
    if (stage_) {
      static std::vector<std::shared_ptr<HostStage>>* kept = new std::vector<std::shared_ptr<HostStage>>;
      kept->push_back(std::move(stage_));
    }
  }
  stage_.reset();
}

namespace {
void check_received(const MPI_Status& st, int dtype, int64_t count, int peer, int tag, int rank,
                    int size) {
  int got = 0;
  MPI_Get_count(&st, mpi_type(dtype), &got);
  MOE_CHECK(got == count, "MPI_Irecv on group rank ", rank, " of ", size, " (peer ", peer,
            ", tag ", tag, "): expected ", count, " elements, received ", got);
}
}  // namespace

void Request::wait() {
  if (!active_) return;
  if (local_) {
    active_ = false;
    const bool done = local_forget(*local_, local_id_);
    local_.reset();
    if (!done) local_never("MPI_Wait(irecv)", tag_);
    return;
  }
  MPI_Request r = unpack<MPI_Request>(handle_);
  MPI_Status st;
  int rc;
  {
    OpScope scope(is_recv_ ? "MPI_Wait(irecv)" : "MPI_Wait(isend)", rank_, size_, kNoMembers, peer_,
                  peer_world_, tag_);
    rc = MPI_Wait(&r, &st);
    charge_sim_messages();
  }
  active_ = false;
  if (rc != MPI_SUCCESS) fail(is_recv_ ? "MPI_Wait(irecv)" : "MPI_Wait(isend)", rc, rank_, size_, peer_, tag_);
  if (is_recv_) check_received(st, dtype_, count_, peer_, tag_, rank_, size_);
  if (stage_ && is_recv_) stage_->store();
  stage_.reset();
}

void wait_all(std::vector<Request>& reqs) {
  std::vector<MPI_Request> handles;
  std::vector<Request*> live;
  for (Request& q : reqs) {
    if (!q.active_) continue;
    if (q.local_) {
      q.wait();
      continue;
    }
    handles.push_back(unpack<MPI_Request>(q.handle_));
    live.push_back(&q);
  }
  if (handles.empty()) return;
  std::vector<MPI_Status> st(handles.size());
  int rc;
  {
    std::string what = str_cat("MPI_Waitall(", live.size(), " requests; peers in world ranks:");
    for (size_t i = 0; i < live.size() && i < 16; ++i) what += str_cat(" ", live[i]->peer_world_);
    if (live.size() > 16) what += " ...";
    what += ")";
    OpScope scope(what.c_str(), live[0]->rank_, live[0]->size_, kNoMembers);
    rc = MPI_Waitall(static_cast<int>(handles.size()), handles.data(), st.data());
    charge_sim_messages();
  }
  for (Request* q : live) q->active_ = false;
  if (rc != MPI_SUCCESS) {
    for (size_t i = 0; i < live.size(); ++i) {
      if (rc == MPI_ERR_IN_STATUS && st[i].MPI_ERROR != MPI_SUCCESS &&
          st[i].MPI_ERROR != MPI_ERR_PENDING) {
        const Request& q = *live[i];
        fail(q.is_recv_ ? "MPI_Waitall(irecv)" : "MPI_Waitall(isend)", st[i].MPI_ERROR, q.rank_,
             q.size_, q.peer_, q.tag_);
      }
    }
    fail("MPI_Waitall", rc, live[0]->rank_, live[0]->size_);
  }
  for (size_t i = 0; i < live.size(); ++i) {
    Request& q = *live[i];
    if (q.is_recv_) check_received(st[i], q.dtype_, q.count_, q.peer_, q.tag_, q.rank_, q.size_);
    if (q.stage_ && q.is_recv_) q.stage_->store();
    q.stage_.reset();
  }
}

}  // namespace moe::comm
