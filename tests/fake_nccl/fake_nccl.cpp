// A fake libnccl.so.2 for the emulated CUDA build (-DMOETRAIN_EMULATE_CUDA=ON): NCCL's API over
// the host program's MPI, so `--comm.backend nccl` runs in CI on 2-4 ranks without a GPU and the
// grouping and ordering logic of comm/nccl.cpp is exercised against NCCL's contracts.
//
// What it implements: ncclGetVersion, ncclGetUniqueId, ncclCommInitRank, ncclCommDestroy,
// ncclCommAbort, ncclCommCount, ncclCommUserRank, ncclCommCuDevice, ncclCommGetAsyncError,
// ncclAllReduce, ncclSend, ncclRecv, ncclGroupStart, ncclGroupEnd, ncclGetErrorString,
// ncclGetLastError, and moetrain_fake_nccl (a marker: comm/nccl.cpp in the emulated build refuses
// a libnccl.so.2 without it, i.e. the real NCCL, which cannot reach the emulated device's memory).
//
// Contracts, checked on every call with NCCL's result codes; ncclGetErrorString(r) of the last
// failure on this thread names the problem ("invalid argument: ncclSend: peer 5 is not in
// [0, 2)"), other codes give NCCL's own strings:
//  - comm: NULL, or not a live communicator (destroyed, never made): ncclInvalidArgument.
//  - datatype in [0, ncclNumTypes), op in [0, ncclNumOps), peer in [0, nranks), a non-NULL
//    device buffer on the communicator's device when count > 0: ncclInvalidArgument.
//  - groups: ncclGroupStart nests (a depth counter); the operations of a group run at the
//    outermost ncclGroupEnd. ncclGroupEnd without a start: ncclInvalidUsage. An operation that
//    fails its checks inside a group returns its error and aborts the group: ncclGroupEnd returns
//    that error and runs none of the group's operations. ncclCommDestroy of a communicator with
//    operations waiting in an open group: ncclInvalidUsage.
//  - send/receive: as in NCCL, the k-th ncclSend from A to B in a group matches the k-th ncclRecv
//    on B from A in its group, and both must name the same count and datatype (each message
//    carries a header, so a mismatch is ncclInvalidUsage on the receiver, not silent corruption).
//    Outside a group each ncclSend/ncclRecv is a group of its own and blocks until the peer's
//    matching call (the send is synchronous, MPI_Issend), which is NCCL's semantics: two ranks
//    that both send before they receive deadlock there. The fake reports that after
//    FAKE_NCCL_TIMEOUT_S seconds (default 120) as ncclInvalidUsage naming the stuck operations
//    instead of hanging; the same for a group whose peer never posts the matching call.
//  - ncclCommInitRank: nranks >= 1, rank in [0, nranks) (ncclInvalidArgument); the id must come
//    from ncclGetUniqueId (a magic, a random nonce, the maker's world rank and a checksum: else
//    ncclInvalidArgument), be used for one communicator only, and be passed by all nranks ranks
//    with the same nranks and distinct ranks (ncclInvalidUsage); after the communicator is formed
//    its members all-gather the whole id and their (host, CUDA device): a differing id or two
//    ranks on one GPU of a host ("Duplicate GPU detected") is ncclInvalidUsage on every member.
//
// Forming a communicator without deadlock. moetrain makes one NCCL communicator per Group it
// enables (Trainer::choose_comm_backend: ep, dp, data, pp, tp, tokens, each of size > 1), and
// nothing requires the other ranks of the world to call ncclCommInitRank at the same moment
// (another program may enable NCCL for some groups only). So no collective over MPI_COMM_WORLD is
// used (an MPI_Comm_split of the world would hang as soon as one world rank is not initialising
// NCCL). Instead, as NCCL's own bootstrap does with a socket, the rank that called
// ncclGetUniqueId is the root of that id: every member sends it a "join" message (point-to-point
// on MPI_COMM_WORLD, tag kTagJoin), the root collects nranks joins with the id's nonce (joins for
// other ids that arrive meanwhile are kept for their own ncclCommInitRank), checks them, and
// answers each member with the world ranks in NCCL rank order (or the error, so every member fails
// with the same message); then the members alone form the communicator with
// MPI_Comm_create_group, which is collective over them only. Waits poll with a deadline
// (FAKE_NCCL_TIMEOUT_S): a rank that passed another id, or a root that never joins, gives an error
// naming the likely cause instead of a hang. The limit: the process that called ncclGetUniqueId
// must itself be one of the communicator's ranks (in real NCCL a bootstrap thread answers for it);
// moetrain's NcclComm makes the id on group rank 0.
//
// Data: buffers are emulated device memory, which host code cannot touch; the fake synchronises
// the operation's stream (cudaStreamSynchronize: the emulated stream is a queue that runs at sync
// points), stages through host buffers with cudaMemcpy(..., cudaMemcpyDefault) and runs the MPI
// operation on those. The CUDA runtime functions are not linked: they resolve at load time to the
// SIMT shim inside the executable (linked with ENABLE_EXPORTS). ncclAllReduce is MPI_Allreduce
// (MPI_IN_PLACE, the same MPI datatype and op) on a communicator of the same ranks in the same
// order as comm::Group's MPI path, so its results are bit-identical to that path by construction
// (not MPI_Iallreduce: libnbc's algorithms may sum in another order). float16/bfloat16/fp8
// reductions are not implemented (ncclInternalError); their send/receive is.
// The fake is synchronous: when a call returns, its results are in the device buffers.
//
// NCCL_DEBUG=WARN prints every failure on stderr; NCCL_DEBUG=INFO also prints one line per
// communicator made and one per communicator destroyed with the counts of operations it carried.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

// The communicator behind ncclComm_t.
struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;  // the members, in NCCL rank order
  int rank = 0, nranks = 0, device = 0;
  uint64_t nonce = 0;            // of the unique id it was made from
  std::vector<int> world_ranks;  // [nranks]
  long long allreduces = 0, sends = 0, recvs = 0, bytes_sent = 0, bytes_received = 0;
};

namespace {

// ---- errors ----
thread_local ncclResult_t t_last_code = ncclSuccess;
thread_local std::string t_last_msg;  // the last failure's message (ncclGetLastError)
thread_local std::string t_string;    // what ncclGetErrorString returned last

int debug_level() {  // 0 none, 1 WARN, 2 INFO (NCCL_DEBUG)
  static const int level = [] {
    const char* v = std::getenv("NCCL_DEBUG");
    if (!v) return 0;
    std::string s(v);
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (s == "INFO" || s == "TRACE") return 2;
    if (s == "WARN") return 1;
    return 0;
  }();
  return level;
}

int world_rank_or(int dflt) {
  int init = 0, fin = 0, r = dflt;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

void log_line(const char* level, const std::string& msg) {
  std::fprintf(stderr, "fake NCCL %s [world rank %d, pid %d] %s\n", level, world_rank_or(-1),
               static_cast<int>(getpid()), msg.c_str());
}

std::string vformat(const char* fmt, va_list ap) {
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  return buf;
}

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t r, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  t_last_msg = vformat(fmt, ap);
  va_end(ap);
  t_last_code = r;
  if (debug_level() >= 1) log_line("WARN", t_last_msg);
  return r;
}

__attribute__((format(printf, 1, 2))) void info(const char* fmt, ...) {
  if (debug_level() < 2) return;
  va_list ap;
  va_start(ap, fmt);
  const std::string m = vformat(fmt, ap);
  va_end(ap);
  log_line("INFO", m);
}

// NCCL 2.x's own strings.
const char* base_string(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
const char* short_string(ncclResult_t r) {
  switch (r) {
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return base_string(r);
  }
}

std::string mpi_error(int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(s, static_cast<size_t>(n));
}

// Read at every wait (a test shortens it around the cases that wait for it).
double timeout_s() {
  const char* v = std::getenv("FAKE_NCCL_TIMEOUT_S");
  char* end = nullptr;
  const double x = v ? std::strtod(v, &end) : 0.0;
  return v && end && *end == '\0' && x > 0 ? x : 120.0;
}

// A wait loop's pacing: yield to the other ranks (the CI machine runs 4 ranks on 2 cores), and
// sleep a little once nothing has happened for a while.
class Pacer {
 public:
  Pacer()
      : deadline_(std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_s()))) {}
  void progressed() { idle_ = 0; }
  void idle() {
    if (++idle_ < 64) sched_yield();
    else usleep(100);
  }
  bool expired() const { return std::chrono::steady_clock::now() > deadline_; }

 private:
  std::chrono::steady_clock::time_point deadline_;
  int idle_ = 0;
};

// ---- types ----
bool valid_type(ncclDataType_t t) { return static_cast<int>(t) >= 0 && t < ncclNumTypes; }
size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}
const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "float16";
    case ncclFloat32: return "float32";
    case ncclFloat64: return "float64";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat8e4m3: return "float8e4m3";
    case ncclFloat8e5m2: return "float8e5m2";
    default: return "invalid";
  }
}
MPI_Datatype mpi_type(ncclDataType_t t) {  // MPI_DATATYPE_NULL: no reduction in the fake
  switch (t) {
    case ncclInt8: return MPI_INT8_T;
    case ncclUint8: return MPI_UINT8_T;
    case ncclInt32: return MPI_INT32_T;
    case ncclUint32: return MPI_UINT32_T;
    case ncclInt64: return MPI_INT64_T;
    case ncclUint64: return MPI_UINT64_T;
    case ncclFloat32: return MPI_FLOAT;
    case ncclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}
const char* op_name(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "invalid";
  }
}

// ---- live communicators ----
std::mutex g_mu;
std::set<const ncclComm*> g_live;

ncclResult_t check_comm(const ncclComm* c, const char* fn) {
  if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_live.count(c))
    return fail(ncclInvalidArgument,
                "%s: comm %p is not a live communicator (destroyed, or not made by ncclCommInitRank)",
                fn, static_cast<const void*>(c));
  return ncclSuccess;
}

ncclResult_t check_buffer(const ncclComm* c, const void* p, size_t count, const char* fn,
                          const char* name) {
  if (count == 0) return ncclSuccess;
  if (!p) return fail(ncclInvalidArgument, "%s: %s is NULL with count %zu", fn, name, count);
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(ncclInvalidArgument, "%s: %s %p is not a valid pointer (%s)", fn, name, p,
                cudaGetErrorString(e));
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    return fail(ncclInvalidArgument, "%s: %s %p is not device memory (NCCL needs GPU buffers)", fn,
                name, p);
  if (a.device != c->device)
    return fail(ncclInvalidArgument, "%s: %s allocated on device %d mismatches with NCCL device %d",
                fn, name, a.device, c->device);
  return ncclSuccess;
}

// ---- groups ----
struct Op {
  enum Kind {
    kAllReduce,
    kSend,
    kRecv
  } kind;
  ncclComm* comm;
  const void* sbuf;
  void* rbuf;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t red;
  int peer;
  cudaStream_t stream;
};
const char* op_kind(const Op& o) {
  return o.kind == Op::kAllReduce ? "ncclAllReduce" : (o.kind == Op::kSend ? "ncclSend" : "ncclRecv");
}

thread_local int t_depth = 0;                         // ncclGroupStart nesting
thread_local std::vector<Op> t_ops;                   // the open group's operations, in issue order
thread_local ncclResult_t t_group_err = ncclSuccess;  // the first failure inside the open group
thread_local std::string t_group_err_msg;

// A failure of a call inside an open group also aborts the group.
ncclResult_t group_fail(ncclResult_t r) {
  if (r != ncclSuccess && t_depth > 0 && t_group_err == ncclSuccess) {
    t_group_err = r;
    t_group_err_msg = t_last_msg;
  }
  return r;
}

// ---- running operations ----
// On MPI_COMM_WORLD: joins and replies; MPI_Comm_create_group's tag is 1000 + nonce % 30000 (one
// per communicator; all below 32767, the least MPI_TAG_UB allowed). On the fake's communicators:
// kTagP2p.
constexpr int kTagJoin = 31001, kTagReply = 31002, kTagP2p = 7;
constexpr uint32_t kMsgMagic = 0x4e43434cu;  // "NCCL": the header of every send

struct MsgHeader {
  uint32_t magic;
  int32_t type;
  uint64_t count;
};

ncclResult_t cuda_copy(void* dst, const void* src, size_t bytes, const char* fn) {
  if (bytes == 0) return ncclSuccess;
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(ncclUnhandledCudaError, "%s: cudaMemcpy of %zu bytes: %s", fn, bytes,
                cudaGetErrorString(e));
  }
  return ncclSuccess;
}

template <typename T>
void divide(void* p, size_t n, int by) {
  T* v = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(v[i] / static_cast<T>(by));
}

ncclResult_t run_allreduce(const Op& o) {
  ncclComm* c = o.comm;
  if (o.count == 0) return ncclSuccess;
  const size_t bytes = o.count * type_size(o.type);
  std::vector<uint64_t> host((bytes + 7) / 8);  // 8-byte aligned
  if (ncclResult_t r = cuda_copy(host.data(), o.sbuf, bytes, "ncclAllReduce")) return r;
  MPI_Op mop = o.red == ncclProd  ? MPI_PROD
               : o.red == ncclMax ? MPI_MAX
               : o.red == ncclMin ? MPI_MIN
                                  : MPI_SUM;  // ncclAvg: a sum, then divided
  const int rc = MPI_Allreduce(MPI_IN_PLACE, host.data(), static_cast<int>(o.count),
                               mpi_type(o.type), mop, c->mpi);
  if (rc != MPI_SUCCESS)
    return fail(ncclSystemError, "ncclAllReduce on rank %d of %d: MPI_Allreduce: %s", c->rank,
                c->nranks, mpi_error(rc).c_str());
  if (o.red == ncclAvg) {
    switch (o.type) {
      case ncclInt8: divide<int8_t>(host.data(), o.count, c->nranks); break;
      case ncclUint8: divide<uint8_t>(host.data(), o.count, c->nranks); break;
      case ncclInt32: divide<int32_t>(host.data(), o.count, c->nranks); break;
      case ncclUint32: divide<uint32_t>(host.data(), o.count, c->nranks); break;
      case ncclInt64: divide<int64_t>(host.data(), o.count, c->nranks); break;
      case ncclUint64: divide<uint64_t>(host.data(), o.count, c->nranks); break;
      case ncclFloat32: divide<float>(host.data(), o.count, c->nranks); break;
      default: divide<double>(host.data(), o.count, c->nranks); break;
    }
  }
  if (ncclResult_t r = cuda_copy(o.rbuf, host.data(), bytes, "ncclAllReduce")) return r;
  ++c->allreduces;
  return ncclSuccess;
}

std::string describe(const Op& o) {
  char b[160];
  std::snprintf(b, sizeof b, "%s of %s x %zu %s peer %d", op_kind(o), type_name(o.type), o.count,
                o.kind == Op::kSend ? "to" : "from", o.peer);
  return b;
}

// The sends and receives of one group (or one lone call: `grouped` false). Sends are posted in
// issue order; each peer's receives are matched in issue order with MPI_Improbe (matched probes
// keep MPI's per-pair order), so the k-th send from A to B in this group meets the k-th receive
// on B from A, as in NCCL.
ncclResult_t run_p2p(const std::vector<Op>& ops, bool grouped) {
  struct Pending {
    const Op* op;
    std::vector<unsigned char> buf;
    MPI_Request req = MPI_REQUEST_NULL;
    bool posted = false, done = false;
  };
  std::vector<Pending> sends, recvs;
  for (const Op& o : ops) {
    if (o.kind == Op::kAllReduce) continue;
    const size_t bytes = o.count * type_size(o.type);
    if (bytes > static_cast<size_t>(INT_MAX) - sizeof(MsgHeader))
      return fail(ncclInternalError, "%s: the fake NCCL moves at most 2 GiB per message",
                  op_kind(o));
    (o.kind == Op::kSend ? sends : recvs).push_back(Pending{&o, {}, MPI_REQUEST_NULL, false, false});
  }
  for (Pending& s : sends) {
    const Op& o = *s.op;
    const size_t bytes = o.count * type_size(o.type);
    s.buf.resize(sizeof(MsgHeader) + bytes);
    const MsgHeader h{kMsgMagic, static_cast<int32_t>(o.type), o.count};
    std::memcpy(s.buf.data(), &h, sizeof h);
    if (ncclResult_t r = cuda_copy(s.buf.data() + sizeof h, o.sbuf, bytes, "ncclSend")) return r;
    const int n = static_cast<int>(s.buf.size());
    // A lone send completes only once its receive is posted (NCCL: blocking for the GPU).
    const int rc = grouped ? MPI_Isend(s.buf.data(), n, MPI_BYTE, o.peer, kTagP2p, o.comm->mpi, &s.req)
                           : MPI_Issend(s.buf.data(), n, MPI_BYTE, o.peer, kTagP2p, o.comm->mpi, &s.req);
    if (rc != MPI_SUCCESS)
      return fail(ncclSystemError, "ncclSend to peer %d: MPI_Isend: %s", o.peer, mpi_error(rc).c_str());
    s.posted = true;
  }
  // recvs of each (communicator, peer), in issue order; next[key] = the next one to match.
  std::map<std::pair<const ncclComm*, int>, std::vector<size_t>> queue;
  for (size_t i = 0; i < recvs.size(); ++i) queue[{recvs[i].op->comm, recvs[i].op->peer}].push_back(i);
  std::map<std::pair<const ncclComm*, int>, size_t> next;
  ncclResult_t first = ncclSuccess;
  std::string first_msg;
  auto note = [&](ncclResult_t r) {
    if (r != ncclSuccess && first == ncclSuccess) {
      first = r;
      first_msg = t_last_msg;
    }
  };
  size_t left = sends.size() + recvs.size();
  Pacer pace;
  while (left > 0) {
    bool progress = false;
    for (auto& [key, list] : queue) {
      size_t& k = next[key];
      while (k < list.size()) {
        Pending& p = recvs[list[k]];
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        int rc = MPI_Improbe(key.second, kTagP2p, key.first->mpi, &flag, &msg, &st);
        if (rc != MPI_SUCCESS)
          return fail(ncclSystemError, "ncclRecv from peer %d: MPI_Improbe: %s", key.second,
                      mpi_error(rc).c_str());
        if (!flag) break;
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        p.buf.resize(static_cast<size_t>(n));
        rc = MPI_Imrecv(p.buf.data(), n, MPI_BYTE, &msg, &p.req);
        if (rc != MPI_SUCCESS)
          return fail(ncclSystemError, "ncclRecv from peer %d: MPI_Imrecv: %s", key.second,
                      mpi_error(rc).c_str());
        p.posted = true;
        progress = true;
        ++k;
      }
    }
    for (Pending& s : sends) {
      if (s.done) continue;
      int flag = 0;
      const int rc = MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclSend to peer %d: %s", s.op->peer, mpi_error(rc).c_str());
      if (!flag) continue;
      s.done = true;
      --left;
      progress = true;
      ++s.op->comm->sends;
      s.op->comm->bytes_sent += static_cast<long long>(s.buf.size() - sizeof(MsgHeader));
    }
    for (Pending& p : recvs) {
      if (p.done || !p.posted) continue;
      int flag = 0;
      const int rc = MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclRecv from peer %d: %s", p.op->peer, mpi_error(rc).c_str());
      if (!flag) continue;
      p.done = true;
      --left;
      progress = true;
      const Op& o = *p.op;
      MsgHeader h{};
      if (p.buf.size() >= sizeof h) std::memcpy(&h, p.buf.data(), sizeof h);
      if (p.buf.size() < sizeof h || h.magic != kMsgMagic) {
        note(fail(ncclInternalError, "ncclRecv from peer %d: a message without the fake's header",
                  o.peer));
        continue;
      }
      const ncclDataType_t st = static_cast<ncclDataType_t>(h.type);
      if (st != o.type || h.count != o.count) {
        note(fail(ncclInvalidUsage,
                  "ncclRecv of %s x %zu from peer %d (rank %d of %d) met that peer's ncclSend of "
                  "%s x %llu: a send and its receive must name the same count and datatype",
                  type_name(o.type), o.count, o.peer, o.comm->rank, o.comm->nranks,
                  type_name(st), static_cast<unsigned long long>(h.count)));
        continue;
      }
      note(cuda_copy(o.rbuf, p.buf.data() + sizeof h, p.buf.size() - sizeof h, "ncclRecv"));
      ++o.comm->recvs;
      o.comm->bytes_received += static_cast<long long>(p.buf.size() - sizeof h);
    }
    if (left == 0) break;
    if (progress) {
      pace.progressed();
      continue;
    }
    if (pace.expired()) {
      // MPI may still use the buffers of pending requests: they are abandoned, never freed.
      static std::vector<std::vector<unsigned char>>* abandoned = new std::vector<std::vector<unsigned char>>;
      for (auto* list : {&sends, &recvs})
        for (Pending& p : *list)
          if (!p.done && p.posted) abandoned->push_back(std::move(p.buf));
      std::string stuck;
      int n = 0;
      for (const auto* list : {&sends, &recvs})
        for (const Pending& p : *list)
          if (!p.done && n++ < 4) stuck += (stuck.empty() ? "" : "; ") + describe(*p.op);
      if (!grouped)
        return fail(ncclInvalidUsage,
                    "%s (rank %d of %d) outside ncclGroupStart/End did not complete within %g s "
                    "(FAKE_NCCL_TIMEOUT_S): outside a group each send or receive is a group of "
                    "its own and waits for the peer's matching call, so ranks that both send "
                    "before they receive deadlock (real NCCL hangs here): put the pair in one "
                    "group",
                    stuck.c_str(), ops[0].comm->rank, ops[0].comm->nranks, timeout_s());
      return fail(ncclInvalidUsage,
                  "ncclGroupEnd: %zu of %zu sends/receives did not complete within %g s "
                  "(FAKE_NCCL_TIMEOUT_S): %s: did the peer post the matching call in its group?",
                  left, sends.size() + recvs.size(), timeout_s(), stuck.c_str());
    }
    pace.idle();
  }
  if (first != ncclSuccess) return fail(first, "%s", first_msg.c_str());
  return ncclSuccess;
}

// Runs a group's operations (or a lone call's): the streams are synchronised, the collectives run
// in issue order (every rank issues them in the same order, as NCCL requires), then all sends and
// receives progress together.
ncclResult_t run_ops(const std::vector<Op>& ops, bool grouped) {
  std::vector<cudaStream_t> synced;
  for (const Op& o : ops) {
    if (std::find(synced.begin(), synced.end(), o.stream) != synced.end()) continue;
    synced.push_back(o.stream);
    const cudaError_t e = cudaStreamSynchronize(o.stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return fail(ncclUnhandledCudaError, "%s: cudaStreamSynchronize: %s", op_kind(o),
                  cudaGetErrorString(e));
    }
  }
  for (const Op& o : ops)
    if (o.kind == Op::kAllReduce)
      if (ncclResult_t r = run_allreduce(o)) return r;
  bool p2p = false;
  for (const Op& o : ops) p2p |= o.kind != Op::kAllReduce;
  return p2p ? run_p2p(ops, grouped) : ncclSuccess;
}

// A checked operation: queued in the open group, or run at once as a group of its own.
ncclResult_t submit(const Op& o) {
  if (t_depth > 0) {
    t_ops.push_back(o);
    return ncclSuccess;
  }
  return run_ops({o}, /*grouped=*/false);
}

ncclResult_t check_p2p(const char* fn, const void* buf, size_t count, ncclDataType_t type, int peer,
                       ncclComm* comm) {
  if (ncclResult_t r = check_comm(comm, fn)) return r;
  if (!valid_type(type))
    return fail(ncclInvalidArgument, "%s: invalid datatype %d (valid: 0..%d)", fn,
                static_cast<int>(type), static_cast<int>(ncclNumTypes) - 1);
  if (peer < 0 || peer >= comm->nranks)
    return fail(ncclInvalidArgument, "%s: peer %d is not in [0, %d) (rank %d of %d)", fn, peer,
                comm->nranks, comm->rank, comm->nranks);
  return check_buffer(comm, buf, count, fn, fn[4] == 'S' ? "sendbuff" : "recvbuff");
}

// ---- unique ids ----
constexpr uint64_t kIdMagic = 0x4c43434e454b4146ull;  // "FAKENCCL"
struct IdFields {
  uint64_t magic;
  uint64_t nonce;
  int32_t root;        // world rank of the process that made it
  int32_t world_size;  // of the job it was made in
  uint64_t check;
};
static_assert(sizeof(IdFields) <= sizeof(ncclUniqueId), "unique id layout");

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t id_check(const IdFields& f) {
  return mix(f.magic ^ mix(f.nonce ^ mix((static_cast<uint64_t>(static_cast<uint32_t>(f.root)) << 32) |
                                         static_cast<uint32_t>(f.world_size))));
}

std::set<uint64_t> g_made;  // nonces this process made (ncclGetUniqueId)
std::set<uint64_t> g_used;  // nonces this process, as their root, made a communicator of

struct Join {
  uint64_t nonce;
  int32_t nranks, rank, world_rank, pad;
};
std::vector<Join> g_stash;  // joins for other ids, received while collecting one

struct Reply {
  uint64_t nonce;
  int32_t status;  // ncclResult_t
  int32_t nranks;
  char msg[512];
  // followed by nranks int32: the world rank of each NCCL rank
};

ncclResult_t mpi_ready(const char* fn) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return fail(ncclInvalidUsage,
                "%s: MPI is %s (the fake NCCL runs over the host program's MPI, between MPI_Init "
                "and MPI_Finalize)",
                fn, fin ? "finalized" : "not initialised");
  return ncclSuccess;
}

// The root's side: collects the nranks joins of `nonce` (its own included), checks them and
// answers every member. On success *members = the world rank of each NCCL rank.
ncclResult_t root_collect(const Join& mine, std::vector<int>* members) {
  const uint64_t nonce = mine.nonce;
  const int nranks = mine.nranks;
  std::vector<Join> joined{mine};
  for (auto it = g_stash.begin(); it != g_stash.end();) {
    if (it->nonce == nonce) {
      joined.push_back(*it);
      it = g_stash.erase(it);
    } else {
      ++it;
    }
  }
  Pacer pace;
  bool timed_out = false;
  while (static_cast<int>(joined.size()) < nranks) {
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Iprobe(MPI_ANY_SOURCE, kTagJoin, MPI_COMM_WORLD, &flag, &st);
    if (rc == MPI_SUCCESS && flag) {
      Join j{};
      rc = MPI_Recv(&j, sizeof j, MPI_BYTE, st.MPI_SOURCE, kTagJoin, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclCommInitRank: MPI_Recv of a join: %s", mpi_error(rc).c_str());
      if (j.nonce == nonce) {
        joined.push_back(j);
      } else {
        g_stash.push_back(j);
        info("ncclCommInitRank: kept world rank %d's join for another unique id", j.world_rank);
      }
      pace.progressed();
      continue;
    }
    if (rc != MPI_SUCCESS)
      return fail(ncclSystemError, "ncclCommInitRank: MPI_Iprobe: %s", mpi_error(rc).c_str());
    if (pace.expired()) {
      timed_out = true;
      break;
    }
    pace.idle();
  }
  ncclResult_t status = ncclSuccess;
  std::string why;
  char b[512];
  if (!g_made.count(nonce)) {
    status = ncclInvalidArgument;
    std::snprintf(b, sizeof b,
                  "ncclCommInitRank: the unique id names world rank %d as its maker, which never "
                  "made it with ncclGetUniqueId (forged or corrupted)",
                  mine.world_rank);
    why = b;
  } else if (g_used.count(nonce)) {
    status = ncclInvalidUsage;
    why = "ncclCommInitRank: this unique id was already used for a communicator; call "
          "ncclGetUniqueId once per communicator";
  } else if (timed_out) {
    status = ncclInvalidUsage;
    std::string who;
    for (const Join& j : joined) who += (who.empty() ? "" : ", ") + std::to_string(j.world_rank);
    std::snprintf(b, sizeof b,
                  "ncclCommInitRank: only %zu of %d ranks joined the unique id made by world rank "
                  "%d within %g s (FAKE_NCCL_TIMEOUT_S; joined: world ranks %s): did every rank "
                  "pass the same id, and the same nranks?",
                  joined.size(), nranks, mine.world_rank, timeout_s(), who.c_str());
    why = b;
  } else {
    std::vector<int> by_rank(static_cast<size_t>(nranks), -1);
    for (const Join& j : joined) {
      if (j.nranks != nranks) {
        std::snprintf(b, sizeof b,
                      "ncclCommInitRank: world rank %d passed nranks %d, world rank %d passed %d "
                      "for the same unique id",
                      mine.world_rank, nranks, j.world_rank, j.nranks);
        status = ncclInvalidUsage;
        why = b;
        break;
      }
      if (by_rank[static_cast<size_t>(j.rank)] >= 0) {
        std::snprintf(b, sizeof b,
                      "ncclCommInitRank: world ranks %d and %d both passed rank %d of %d for the "
                      "same unique id",
                      by_rank[static_cast<size_t>(j.rank)], j.world_rank, j.rank, nranks);
        status = ncclInvalidUsage;
        why = b;
        break;
      }
      by_rank[static_cast<size_t>(j.rank)] = j.world_rank;
    }
    if (status == ncclSuccess) *members = by_rank;
  }
  g_used.insert(nonce);
  // Answer every member but this process, with the same outcome.
  std::vector<unsigned char> out(sizeof(Reply) + sizeof(int32_t) * static_cast<size_t>(nranks));
  Reply r{};
  r.nonce = nonce;
  r.status = status;
  r.nranks = nranks;
  std::snprintf(r.msg, sizeof r.msg, "%s", why.c_str());
  std::memcpy(out.data(), &r, sizeof r);
  if (status == ncclSuccess)
    for (int i = 0; i < nranks; ++i)
      std::memcpy(out.data() + sizeof r + sizeof(int32_t) * static_cast<size_t>(i),
                  &(*members)[static_cast<size_t>(i)], sizeof(int32_t));
  for (const Join& j : joined) {
    if (j.world_rank == mine.world_rank) continue;
    const int rc = MPI_Send(out.data(), static_cast<int>(out.size()), MPI_BYTE, j.world_rank,
                            kTagReply, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
      return fail(ncclSystemError, "ncclCommInitRank: MPI_Send of the reply: %s", mpi_error(rc).c_str());
  }
  if (status != ncclSuccess) return fail(status, "%s", why.c_str());
  return ncclSuccess;
}

// A member's side: joins the root of the id and waits for its answer.
ncclResult_t member_join(const Join& mine, int root, std::vector<int>* members) {
  // On the heap: a join the root never takes stays posted (and this copy alive) after a timeout.
  auto* join = new Join(mine);
  MPI_Request req;
  int rc = MPI_Isend(join, sizeof *join, MPI_BYTE, root, kTagJoin, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS)
    return fail(ncclSystemError, "ncclCommInitRank: MPI_Isend of the join: %s", mpi_error(rc).c_str());
  Pacer pace;
  bool sent = false;
  for (;;) {
    if (!sent) {
      int flag = 0;
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      sent = flag != 0;
    }
    int flag = 0;
    MPI_Status st;
    rc = MPI_Iprobe(root, kTagReply, MPI_COMM_WORLD, &flag, &st);
    if (rc != MPI_SUCCESS)
      return fail(ncclSystemError, "ncclCommInitRank: MPI_Iprobe: %s", mpi_error(rc).c_str());
    if (flag) {
      int n = 0;
      MPI_Get_count(&st, MPI_BYTE, &n);
      std::vector<unsigned char> in(static_cast<size_t>(std::max(n, 0)));
      rc = MPI_Recv(in.data(), n, MPI_BYTE, root, kTagReply, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(ncclSystemError, "ncclCommInitRank: MPI_Recv of the reply: %s", mpi_error(rc).c_str());
      Reply r{};
      if (in.size() < sizeof r) continue;
      std::memcpy(&r, in.data(), sizeof r);
      if (r.nonce != mine.nonce) continue;  // a late answer for an id this rank gave up on
      if (!sent) MPI_Wait(&req, MPI_STATUS_IGNORE);
      delete join;
      r.msg[sizeof r.msg - 1] = '\0';
      if (r.status != ncclSuccess)
        return fail(static_cast<ncclResult_t>(r.status), "%s (answered by world rank %d)", r.msg, root);
      if (r.nranks != mine.nranks ||
          in.size() != sizeof r + sizeof(int32_t) * static_cast<size_t>(r.nranks))
        return fail(ncclInternalError, "ncclCommInitRank: a malformed answer from world rank %d", root);
      members->assign(static_cast<size_t>(r.nranks), -1);
      for (int i = 0; i < r.nranks; ++i)
        std::memcpy(&(*members)[static_cast<size_t>(i)],
                    in.data() + sizeof r + sizeof(int32_t) * static_cast<size_t>(i), sizeof(int32_t));
      return ncclSuccess;
    }
    if (pace.expired()) {
      if (sent) delete join;
      else MPI_Request_free(&req);  // still posted: `join` stays allocated
      return fail(ncclInvalidUsage,
                  "ncclCommInitRank: rank %d of %d got no answer within %g s (FAKE_NCCL_TIMEOUT_S) "
                  "from world rank %d, which made the unique id: did every rank pass the same id, "
                  "and does the rank that called ncclGetUniqueId take part in this communicator "
                  "(the fake NCCL needs it to)?",
                  mine.rank, mine.nranks, timeout_s(), root);
    }
    pace.idle();
  }
}

uint64_t host_hash() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  uint64_t x = 1469598103934665603ull;  // FNV-1a
  for (const char* p = h; *p; ++p) x = (x ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  return x;
}

}  // namespace

// ---- the API ----

FAKE_API const char* moetrain_fake_nccl() {
  return "moetrain's fake NCCL over MPI for the emulated CUDA device (tests/fake_nccl)";
}

FAKE_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKE_API const char* ncclGetErrorString(ncclResult_t r) {
  if (r != ncclSuccess && r == t_last_code && !t_last_msg.empty()) {
    t_string = std::string(short_string(r)) + ": " + t_last_msg;
    return t_string.c_str();
  }
  return base_string(r);
}

FAKE_API const char* ncclGetLastError(ncclComm_t) { return t_last_msg.c_str(); }

FAKE_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  if (ncclResult_t r = mpi_ready("ncclGetUniqueId")) return r;
  IdFields f{};
  f.magic = kIdMagic;
  std::random_device rd;
  do {
    f.nonce = mix((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                  (static_cast<uint64_t>(getpid()) << 17) ^ g_made.size());
  } while (f.nonce == 0 || g_made.count(f.nonce));
  MPI_Comm_rank(MPI_COMM_WORLD, &f.root);
  MPI_Comm_size(MPI_COMM_WORLD, &f.world_size);
  f.check = id_check(f);
  std::memset(id, 0, sizeof *id);
  std::memcpy(id->internal, &f, sizeof f);
  g_made.insert(f.nonce);
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  const char* fn = "ncclCommInitRank";
  if (!out) return fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  *out = nullptr;
  if (nranks < 1) return fail(ncclInvalidArgument, "%s: invalid nranks %d (at least 1)", fn, nranks);
  if (rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "%s: rank %d is not in [0, %d)", fn, rank, nranks);
  for (const Op& o : t_ops)
    if (o.kind == Op::kAllReduce)
      return fail(ncclInvalidUsage,
                  "%s inside a group that holds a collective: NCCL allows either in a group, not "
                  "both together",
                  fn);
  if (ncclResult_t r = mpi_ready(fn)) return r;
  IdFields f{};
  std::memcpy(&f, id.internal, sizeof f);
  if (f.magic != kIdMagic)
    return fail(ncclInvalidArgument,
                "%s: the unique id was not made by ncclGetUniqueId (no magic): was it sent to "
                "every rank?",
                fn);
  bool tail_zero = true;
  for (size_t i = sizeof f; i < sizeof id.internal; ++i) tail_zero &= id.internal[i] == 0;
  if (f.check != id_check(f) || !tail_zero)
    return fail(ncclInvalidArgument, "%s: the unique id is corrupted (its checksum does not match)", fn);
  int me = 0, world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (f.world_size != world || f.root < 0 || f.root >= world)
    return fail(ncclInvalidArgument,
                "%s: the unique id was made by world rank %d of a job of %d ranks, not this job "
                "of %d",
                fn, f.root, f.world_size, world);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(ncclUnhandledCudaError, "%s: cudaGetDevice: %s", fn, cudaGetErrorString(e));
  }
  const Join mine{f.nonce, nranks, rank, me, 0};
  std::vector<int> members;
  ncclResult_t r = f.root == me ? root_collect(mine, &members) : member_join(mine, f.root, &members);
  if (r != ncclSuccess) return r;

  // The members alone form the communicator (collective over them, not the world).
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, members.data(), &group);
  MPI_Comm mpi = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, 1000 + static_cast<int>(f.nonce % 30000),
                                 &mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS)
    return fail(ncclSystemError, "%s: MPI_Comm_create_group: %s", fn, mpi_error(rc).c_str());
  MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
  int got = -1;
  MPI_Comm_rank(mpi, &got);
  if (got != rank) {
    MPI_Comm_free(&mpi);
    return fail(ncclInternalError, "%s: MPI rank %d for NCCL rank %d", fn, got, rank);
  }
  // Every member checks the others: the same id, a GPU each.
  struct Card {
    unsigned char id[sizeof(ncclUniqueId)];
    uint64_t host;
    int32_t device, nranks;
  };
  Card card{};
  std::memcpy(card.id, id.internal, sizeof card.id);
  card.host = host_hash();
  card.device = device;
  card.nranks = nranks;
  std::vector<Card> cards(static_cast<size_t>(nranks));
  rc = MPI_Allgather(&card, sizeof card, MPI_BYTE, cards.data(), sizeof card, MPI_BYTE, mpi);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&mpi);
    return fail(ncclSystemError, "%s: MPI_Allgather: %s", fn, mpi_error(rc).c_str());
  }
  for (int a = 0; a < nranks; ++a) {
    const Card& x = cards[static_cast<size_t>(a)];
    if (std::memcmp(x.id, card.id, sizeof card.id) != 0 || x.nranks != nranks) {
      MPI_Comm_free(&mpi);
      return fail(ncclInvalidUsage, "%s: rank %d of %d passed another unique id or nranks than rank 0",
                  fn, a, nranks);
    }
    for (int b = a + 1; b < nranks; ++b) {
      const Card& y = cards[static_cast<size_t>(b)];
      if (x.host == y.host && x.device == y.device) {
        MPI_Comm_free(&mpi);
        return fail(ncclInvalidUsage,
                    "%s: Duplicate GPU detected: rank %d and rank %d both on CUDA device %d of one "
                    "host (NCCL needs a GPU per rank)",
                    fn, a, b, x.device);
      }
    }
  }
  auto* c = new ncclComm;
  c->mpi = mpi;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->nonce = f.nonce;
  c->world_ranks = members;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.insert(c);
  }
  std::string who;
  for (int w : members) who += (who.empty() ? "" : ",") + std::to_string(w);
  info("ncclCommInitRank: comm %p rank %d of %d on CUDA device %d, world ranks [%s]",
       static_cast<void*>(c), rank, nranks, device, who.c_str());
  *out = c;
  return ncclSuccess;
}

namespace {
ncclResult_t destroy(ncclComm_t c, const char* fn, bool check_group) {
  if (ncclResult_t r = check_comm(c, fn)) return r;
  if (check_group) {
    size_t pending = 0;
    for (const Op& o : t_ops) pending += o.comm == c;
    if (pending > 0)
      return fail(ncclInvalidUsage,
                  "%s: %zu operations on this communicator wait in an open group (ncclGroupEnd "
                  "not called)",
                  fn, pending);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_live.erase(c);
  }
  info("%s: comm %p rank %d of %d: %lld all-reduces, %lld sends (%lld bytes), %lld receives "
       "(%lld bytes)",
       fn, static_cast<void*>(c), c->rank, c->nranks, c->allreduces, c->sends,
       c->bytes_sent, c->recvs, c->bytes_received);
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}
}  // namespace

FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;  // NCCL: destroying NULL is a no-op
  return destroy(c, "ncclCommDestroy", true);
}

FAKE_API ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  return destroy(c, "ncclCommAbort", false);
}

FAKE_API ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
  if (ncclResult_t r = check_comm(c, "ncclCommCount")) return r;
  if (!count) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  *count = c->nranks;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
  if (ncclResult_t r = check_comm(c, "ncclCommUserRank")) return r;
  if (!rank) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  *rank = c->rank;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* device) {
  if (ncclResult_t r = check_comm(c, "ncclCommCuDevice")) return r;
  if (!device) return fail(ncclInvalidArgument, "ncclCommCuDevice: device is NULL");
  *device = c->device;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* err) {
  if (ncclResult_t r = check_comm(c, "ncclCommGetAsyncError")) return r;
  if (!err) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL");
  *err = ncclSuccess;  // the fake is synchronous: errors are returned by the calls
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  const char* fn = "ncclAllReduce";
  if (ncclResult_t r = check_comm(comm, fn)) return group_fail(r);
  if (!valid_type(type))
    return group_fail(fail(ncclInvalidArgument, "%s: invalid datatype %d (valid: 0..%d)", fn,
                           static_cast<int>(type), static_cast<int>(ncclNumTypes) - 1));
  if (static_cast<int>(op) < 0 || op >= ncclNumOps)
    return group_fail(fail(ncclInvalidArgument,
                           "%s: invalid reduction operation %d (valid: 0..%d; the fake has no "
                           "custom operations)",
                           fn, static_cast<int>(op),
                           static_cast<int>(ncclNumOps) - 1));
  if (mpi_type(type) == MPI_DATATYPE_NULL)
    return group_fail(fail(ncclInternalError, "%s: the fake NCCL does not reduce %s (%s)", fn,
                           type_name(type), op_name(op)));
  if (count > static_cast<size_t>(INT_MAX))
    return group_fail(fail(ncclInternalError, "%s: the fake NCCL reduces at most %d elements (got %zu)",
                           fn, INT_MAX, count));
  if (ncclResult_t r = check_buffer(comm, sendbuff, count, fn, "sendbuff")) return group_fail(r);
  if (ncclResult_t r = check_buffer(comm, recvbuff, count, fn, "recvbuff")) return group_fail(r);
  return submit(Op{Op::kAllReduce, comm, sendbuff, recvbuff, count, type, op, -1, stream});
}

FAKE_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t type, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_p2p("ncclSend", sendbuff, count, type, peer, comm)) return group_fail(r);
  return submit(Op{Op::kSend, comm, sendbuff, nullptr, count, type, ncclSum, peer, stream});
}

FAKE_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t type, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  if (ncclResult_t r = check_p2p("ncclRecv", recvbuff, count, type, peer, comm)) return group_fail(r);
  return submit(Op{Op::kRecv, comm, nullptr, recvbuff, count, type, ncclSum, peer, stream});
}

FAKE_API ncclResult_t ncclGroupStart() {
  ++t_depth;
  return ncclSuccess;
}

FAKE_API ncclResult_t ncclGroupEnd() {
  if (t_depth == 0)
    return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart (the group depth is 0)");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(t_ops);
  if (t_group_err != ncclSuccess) {
    const ncclResult_t r = t_group_err;
    const std::string why = t_group_err_msg;
    t_group_err = ncclSuccess;
    t_group_err_msg.clear();
    return fail(r, "ncclGroupEnd: the group was aborted by a failed call in it (%s); none of its %zu "
                   "queued operations ran",
                why.c_str(), ops.size());
  }
  return run_ops(ops, /*grouped=*/true);
}
