// What the files of comm::Group share (group.cpp, request.cpp, group_local.cpp, comm_timeout.cpp):
// MPI handles kept in group.h's opaque 64-bit words, the element types, the error line of a failed
// call, the timeout's OpScope and the mailbox of a group of one. Internal to comm/: it includes
// mpi.h, which group.h keeps out.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace moe::comm {

// ---- A group of one without MPI (MpiRuntime::local_world); group_local.cpp ----
// What it sends itself, matched as MPI matches: by tag, in the order posted (messages of one tag
// do not overtake). A send is copied at once; it goes to the oldest pending receive of its tag, or
// waits here for the next receive posted. A receive that no send reaches would wait forever under
// MPI: here its wait throws.
struct LocalBox {
  struct Msg {
    int tag;
    std::vector<char> bytes;
  };
  struct Pending {
    uint64_t id;
    int tag, dtype;
    void* dst;
    int64_t count;
    bool done;
  };
  std::deque<Msg> msgs;
  std::deque<Pending> recvs;  // posted order
  uint64_t next_id = 1;
};

namespace detail {

static_assert(sizeof(MPI_Comm) <= sizeof(uint64_t), "MPI_Comm must fit the opaque handle");
static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "MPI_Request must fit the opaque handle");

template <class H>
H unpack(uint64_t v) {
  H h;
  std::memcpy(&h, &v, sizeof(H));
  return h;
}
template <class H>
uint64_t pack(H h) {
  uint64_t v = 0;
  std::memcpy(&v, &h, sizeof(H));
  return v;
}

enum Dtype {
  kFloat = 0,
  kInt32 = 1,
  kDouble = 2,
  kInt64 = 3
};
inline MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case kFloat: return MPI_FLOAT;
    case kInt32: return MPI_INT32_T;
    case kDouble: return MPI_DOUBLE;
    default: return MPI_INT64_T;
  }
}

inline size_t dtype_bytes(int dtype) { return dtype == kFloat || dtype == kInt32 ? 4 : 8; }

// "MPI_Isend failed on group rank 2 of 8 (peer 5, tag 7): <MPI's message>"
[[noreturn]] void fail(const char* op, int rc, int rank, int size, int peer = -1, int tag = -1);
// count as MPI's int, or an error naming op.
int to_int(int64_t count, const char* op);
// MPI is initialised and not yet finalised.
bool mpi_alive();

// ---- The collective timeout's record of the current wait (comm_timeout.cpp) ----
struct Watch;
// RAII: marks this rank as waiting in one operation for as long as it lives. The main thread
// records the operation it is about to wait in; the watchdog thread reads the record under the
// same lock. Costs nothing while no CommTimeout is alive.
class OpScope {
 public:
  OpScope(const char* op, int rank, int size, const std::string& members, int peer = -1,
          int peer_world = -1, int tag = -1);
  // A wait the watchdog reported as long says that it completed after all (a link that flapped).
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Watch* w_ = nullptr;
};
inline const std::string kNoMembers;

// ---- The mailbox of a group of one (group_local.cpp) ----
void local_send(LocalBox& box, int dtype, const void* data, int64_t count, int tag);
// The oldest message of this tag into dst; false when there is none.
bool local_take(LocalBox& box, int dtype, void* dst, int64_t count, int tag, const char* op);
// The error of a receive that nothing was sent to.
[[noreturn]] void local_never(const char* op, int tag);
// Forgets receive `id`; whether a message had reached it.
bool local_forget(LocalBox& box, uint64_t id);

}  // namespace detail
}  // namespace moe::comm
