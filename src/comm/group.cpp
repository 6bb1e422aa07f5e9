// Group and Request over MPI. See group.h.
#include "comm/group.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "comm/host_stage.h"
#include "comm/mpi_runtime.h"
#include "comm/sim_overhead.h"
#include "comm/nccl.h"
#include "core/error.h"

namespace moe::comm {
namespace {

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

enum Dtype { kFloat = 0, kInt32 = 1, kDouble = 2, kInt64 = 3 };
MPI_Datatype mpi_type(int dtype) {
  switch (dtype) {
    case kFloat: return MPI_FLOAT;
    case kInt32: return MPI_INT32_T;
    case kDouble: return MPI_DOUBLE;
    default: return MPI_INT64_T;
  }
}

size_t dtype_bytes(int dtype) { return dtype == kFloat || dtype == kInt32 ? 4 : 8; }

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

// "MPI_Isend failed on group rank 2 of 8 (peer 5, tag 7): <MPI's message>"
[[noreturn]] void fail(const char* op, int rc, int rank, int size, int peer = -1, int tag = -1) {
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

// ---- Collective timeout (CommTimeout) ----
// The main thread records the operation it is about to wait in (OpScope); the watchdog thread
// reads the record under the same lock. Nothing here calls MPI off the main thread.
using Clock = std::chrono::steady_clock;

// Heartbeats: every watchdog tick each rank sends one small UDP datagram to its watched peers and
// notes when each peer's last one arrived, so a rank that times out can name the ranks it no
// longer hears from (a cut link, a dead or stopped node) apart from ranks that are alive but
// waiting elsewhere. Ranks on this rank's host are reached over 127.0.0.1; ranks on other hosts at
// the IPv4 addresses of their up, non-loopback interfaces (at most kHeartbeatAddrs). Peers watched:
// every rank up to kHeartbeatAllPeers ranks, else the kHeartbeatAllPeers / 2 on either side in the
// ring (bounded traffic at scale). Best effort: a rank whose socket could not be made sends and
// hears nothing, and the timeout line then says the heartbeats are off.
constexpr int kHeartbeatAddrs = 4;
constexpr int kHeartbeatAllPeers = 64;
constexpr uint32_t kHeartbeatMagic = 0x6d6f6862;  // "mohb"
struct PeerAddress {
  uint64_t host = 0;                    // hash of the host name
  uint32_t ip[kHeartbeatAddrs] = {};    // network order; 0 = none
  uint16_t port = 0;                    // network order; 0 = no heartbeat socket
  uint16_t pad[3] = {};
};
struct Heartbeat {
  int fd = -1;
  int me = -1;
  std::vector<PeerAddress> peers;                 // by world rank
  std::vector<int> watched;                       // world ranks this rank sends to and listens for
  std::vector<Clock::time_point> last_heard;      // by world rank (start time until one arrives)
  ~Heartbeat() {
    if (fd >= 0) close(fd);
  }
  // Collective over MPI_COMM_WORLD (main thread): the socket, then everyone's addresses.
  void start(int rank, int size) {
    me = rank;
    PeerAddress mine;
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    mine.host = std::hash<std::string>{}(host);
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (fd >= 0 && (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
                    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)) {
      close(fd);
      fd = -1;
    }
    if (fd >= 0) mine.port = a.sin_port;
    ifaddrs* ifs = nullptr;
    if (fd >= 0 && getifaddrs(&ifs) == 0) {
      int n = 0;
      for (ifaddrs* i = ifs; i && n < kHeartbeatAddrs; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
          mine.ip[n++] = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      freeifaddrs(ifs);
    }
    peers.resize(size);
    MPI_Allgather(&mine, sizeof mine, MPI_BYTE, peers.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    const int half = kHeartbeatAllPeers / 2;
    for (int r = 0; r < size; ++r) {
      const int ring = std::min((r - rank + size) % size, (rank - r + size) % size);
      if (r != rank && peers[r].port != 0 && (size <= kHeartbeatAllPeers || ring <= half)) watched.push_back(r);
    }
    last_heard.assign(size, Clock::now());
  }
  void send_all() const {
    if (fd < 0) return;
    const uint32_t msg[2] = {htonl(kHeartbeatMagic), htonl(static_cast<uint32_t>(me))};
    for (int r : watched) {
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = peers[r].port;
      if (peers[r].host == peers[me].host) {
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sendto(fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&to), sizeof to);
        continue;
      }
      for (uint32_t ip : peers[r].ip) {
        if (ip == 0) break;
        to.sin_addr.s_addr = ip;
        sendto(fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&to), sizeof to);
      }
    }
  }
  void receive_all(Clock::time_point now) {
    if (fd < 0) return;
    uint32_t msg[2];
    for (;;) {
      const ssize_t n = recv(fd, msg, sizeof msg, MSG_DONTWAIT);
      if (n < 0) break;
      if (n != sizeof msg || ntohl(msg[0]) != kHeartbeatMagic) continue;
      const uint32_t r = ntohl(msg[1]);
      if (r < last_heard.size()) last_heard[r] = now;
    }
  }
  // "; no heartbeat for at least S s from world ranks 2,3 (host of rank 2 ...)" or why none is named.
  std::string silent(Clock::time_point now, double quiet_s) const {
    if (fd < 0) return "; heartbeats off (no UDP socket), so the silent ranks are not known";
    std::vector<int> gone;
    double oldest = 0;
    for (int r : watched) {
      const double q = std::chrono::duration<double>(now - last_heard[r]).count();
      if (q >= quiet_s) gone.push_back(r), oldest = std::max(oldest, q);
    }
    if (gone.empty())
      return str_cat("; every watched rank's heartbeat is arriving (", watched.size(),
                     " ranks): they are alive, waiting in other operations");
    std::string list;
    for (size_t i = 0; i < gone.size(); ++i) list += (i ? "," : "") + std::to_string(gone[i]);
    return str_cat("; no heartbeat from world rank(s) ", list, " for ", static_cast<int>(oldest * 10) / 10.0,
                   " s (cut off, stopped or dead)");
  }
};

struct Watch {
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;
  bool in_op = false;
  bool warned = false;         // this op's wait was reported as long (it may still complete)
  Clock::time_point op_start;
  char op[512] = {0};          // "MPI_Allreduce(max) on group rank 0 of 4 (world ranks 0-3)"
  double timeout_s = 0, grace_s = 0;
  const volatile std::sig_atomic_t* stop_flag = nullptr;
  int world_rank = -1, world_size = 0;
  Heartbeat heartbeat;
  std::thread thread;
};
std::atomic<Watch*> g_watch{nullptr};
const std::string kNoMembers;

// RAII: marks this rank as waiting in one operation for as long as it lives.
class OpScope {
 public:
  OpScope(const char* op, int rank, int size, const std::string& members, int peer = -1,
          int peer_world = -1, int tag = -1) {
    Watch* w = g_watch.load(std::memory_order_acquire);
    if (!w) return;
    w_ = w;
    std::lock_guard<std::mutex> lock(w->mu);
    int n = std::snprintf(w->op, sizeof w->op, "%s on group rank %d of %d", op, rank, size);
    if (n > 0 && static_cast<size_t>(n) < sizeof w->op && !members.empty())
      n += std::snprintf(w->op + n, sizeof w->op - n, " (%s)", members.c_str());
    if (n > 0 && static_cast<size_t>(n) < sizeof w->op && peer >= 0)
      std::snprintf(w->op + n, sizeof w->op - n, ", peer %d (world rank %d), tag %d", peer, peer_world, tag);
    w->in_op = true;
    w->warned = false;
    w->op_start = Clock::now();
  }
  // A wait the watchdog reported as long says that it completed after all (a link that flapped).
  ~OpScope() {
    if (!w_) return;
    char op[sizeof w_->op];
    double waited = 0;
    bool warned;
    {
      std::lock_guard<std::mutex> lock(w_->mu);
      w_->in_op = false;
      warned = std::exchange(w_->warned, false);
      if (warned) {
        std::memcpy(op, w_->op, sizeof op);
        waited = std::chrono::duration<double>(Clock::now() - w_->op_start).count();
      }
    }
    if (warned) {
      std::fprintf(stderr, "moetrain: rank %d of %d: %s completed after %.1f s; the run goes on\n", w_->world_rank,
                   w_->world_size, op, waited);
      std::fflush(stderr);
    }
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  Watch* w_ = nullptr;
};

void watchdog_loop(Watch* w) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const auto interval = std::chrono::duration<double>(std::min(0.5, std::max(0.01, w->timeout_s / 20)));
  Clock::time_point stop_seen{};
  std::unique_lock<std::mutex> lock(w->mu);
  Clock::time_point last_tick = Clock::now();
  while (!w->quit) {
    w->cv.wait_for(lock, interval);
    if (w->quit) break;
    const Clock::time_point now = Clock::now();
    lock.unlock();  // the heartbeat is this thread's alone: the main thread's waits need not queue
    w->heartbeat.send_all();
    w->heartbeat.receive_all(now);
    lock.lock();
    if (w->quit) break;
    // A tick far later than asked for means this process itself was frozen (kill -STOP, a
    // suspended VM): that time is nobody else's fault, so it does not count as waiting. Without
    // this, a stopped rank that is resumed would blame its peers.
    const auto late = now - last_tick - std::chrono::duration_cast<Clock::duration>(interval);
    last_tick = now;
    if (late > std::chrono::seconds(1) && w->in_op) w->op_start += late;
    if (w->stop_flag && *w->stop_flag && stop_seen == Clock::time_point{}) stop_seen = now;
    if (!w->in_op) continue;
    const double waited = std::chrono::duration<double>(now - w->op_start).count();
    const bool stopping = stop_seen != Clock::time_point{} &&
                          std::chrono::duration<double>(now - std::max(stop_seen, w->op_start)).count() > w->grace_s;
    // A long wait, not yet the timeout: said once per operation, with the peers gone quiet (a link
    // that flaps comes back within --comm.timeout; the operation's end is then said too).
    const double warn_s = std::max(2.0, w->timeout_s / 5);
    if (!w->warned && !stopping && waited > warn_s && waited <= w->timeout_s) {
      w->warned = true;
      const std::string quiet = w->heartbeat.silent(now, std::max(3 * interval.count(), waited / 2));
      std::fprintf(stderr,
                   "moetrain: warning (rank %d of %d, pid %d on %s): waiting %.1f s in %s%s; "
                   "--comm.timeout ends the job at %g s\n",
                   w->world_rank, w->world_size, static_cast<int>(getpid()), host, waited, w->op, quiet.c_str(),
                   w->timeout_s);
      std::fflush(stderr);
    }
    if (waited <= w->timeout_s && !stopping) continue;
    // Quiet for a good share of the wait, and at least 3 ticks: not merely late.
    const std::string silent =
        w->heartbeat.silent(now, std::max(3 * interval.count(), std::min(waited, w->timeout_s) / 2));
    if (stopping)
      std::fprintf(stderr,
                   "moetrain: error (rank %d of %d, pid %d on %s): stop requested, but still waiting "
                   "after %.1f s in %s: a peer is stalled or has died%s; ending the job\n",
                   w->world_rank, w->world_size, static_cast<int>(getpid()), host, waited, w->op, silent.c_str());
    else
      std::fprintf(stderr,
                   "moetrain: error (rank %d of %d, pid %d on %s): no progress for %.1f s in %s "
                   "(--comm.timeout %g): a peer is stalled or has died%s; ending the job\n",
                   w->world_rank, w->world_size, static_cast<int>(getpid()), host, waited, w->op,
                   w->timeout_s, silent.c_str());
    std::fflush(stderr);
    // MPI_Abort may not be called from this thread (MPI_THREAD_FUNNELED), and the main thread is
    // blocked inside MPI: end the process; the launcher sees a rank fail and ends the others.
    _exit(1);
  }
}

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

// ---- A group of one without MPI (MpiRuntime::local_world) ----
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

namespace {
void local_check_count(size_t bytes, int dtype, int64_t count, int tag, const char* op) {
  const int64_t got = static_cast<int64_t>(bytes / dtype_bytes(dtype));
  MOE_CHECK(got == count, op, " on group rank 0 of 1 (peer 0, tag ", tag, "): expected ", count,
            " elements, received ", got);
}
void local_deliver(const std::vector<char>& b, void* dst) {
  if (!b.empty()) device_copy(device_of(dst), dst, Device::kCpu, b.data(), b.size());
}
void local_send(LocalBox& box, int dtype, const void* data, int64_t count, int tag) {
  std::vector<char> b(static_cast<size_t>(count) * dtype_bytes(dtype));
  if (!b.empty()) device_copy(Device::kCpu, b.data(), device_of(data), data, b.size());
  for (LocalBox::Pending& r : box.recvs) {
    if (r.done || r.tag != tag) continue;
    local_check_count(b.size(), r.dtype, r.count, tag, "MPI_Irecv");
    local_deliver(b, r.dst);
    r.done = true;
    return;
  }
  box.msgs.push_back({tag, std::move(b)});
}
// The oldest message of this tag into dst; false when there is none.
bool local_take(LocalBox& box, int dtype, void* dst, int64_t count, int tag, const char* op) {
  for (auto it = box.msgs.begin(); it != box.msgs.end(); ++it) {
    if (it->tag != tag) continue;
    local_check_count(it->bytes.size(), dtype, count, tag, op);
    local_deliver(it->bytes, dst);
    box.msgs.erase(it);
    return true;
  }
  return false;
}
[[noreturn]] void local_never(const char* op, int tag) {
  throw Error(str_cat(op, " on group rank 0 of 1 (peer 0, tag ", tag,
                      "): nothing was sent to it, so it would wait forever (a world of one)"));
}
// Forgets receive `id`; whether a message had reached it.
bool local_forget(LocalBox& box, uint64_t id) {
  for (auto it = box.recvs.begin(); it != box.recvs.end(); ++it) {
    if (it->id != id) continue;
    const bool done = it->done;
    box.recvs.erase(it);
    return done;
  }
  return true;
}
}  // namespace

CommTimeout::CommTimeout(double seconds, const volatile std::sig_atomic_t* stop_flag, double stop_grace_s) {
  MOE_CHECK(seconds > 0 && seconds < 1e9, "--comm.timeout must be a positive number of seconds, got ", seconds);
  MOE_CHECK(g_watch.load() == nullptr, "CommTimeout: only one may be alive at a time");
  auto* w = new Watch;
  w->timeout_s = seconds;
  w->grace_s = std::min(seconds, stop_grace_s);
  w->stop_flag = stop_flag;
  if (mpi_alive()) {
    MPI_Comm_rank(MPI_COMM_WORLD, &w->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->world_size);
    if (w->world_size > 1) w->heartbeat.start(w->world_rank, w->world_size);
  } else if (MpiRuntime::local_world()) {
    w->world_rank = 0;
    w->world_size = 1;
  }
  w->thread = std::thread(watchdog_loop, w);
  g_watch.store(w, std::memory_order_release);
}

CommTimeout::~CommTimeout() {
  Watch* w = g_watch.exchange(nullptr);
  if (!w) return;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    w->quit = true;
  }
  w->cv.notify_all();
  w->thread.join();
  delete w;
}

// ---- Request ----

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

void Group::allgather(const int32_t* send, int32_t* recv, int count_per_rank) const {
  MOE_CHECK(valid_, "MPI_Allgather on an invalid group");
  if (local_) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(std::max(count_per_rank, 0)) * sizeof(int32_t));
    return;
  }
  OpScope scope("MPI_Allgather", rank_, size_, members_);
  int rc = MPI_Allgather(send, count_per_rank, MPI_INT32_T, recv, count_per_rank, MPI_INT32_T,
                         unpack<MPI_Comm>(comm_));
  if (rc != MPI_SUCCESS) fail("MPI_Allgather", rc, rank_, size_);
}

void Group::allgather(const double* send, double* recv, int count_per_rank) const {
  MOE_CHECK(valid_, "MPI_Allgather on an invalid group");
  if (local_) {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(std::max(count_per_rank, 0)) * sizeof(double));
    return;
  }
  OpScope scope("MPI_Allgather", rank_, size_, members_);
  int rc = MPI_Allgather(send, count_per_rank, MPI_DOUBLE, recv, count_per_rank, MPI_DOUBLE,
                         unpack<MPI_Comm>(comm_));
  if (rc != MPI_SUCCESS) fail("MPI_Allgather", rc, rank_, size_);
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
