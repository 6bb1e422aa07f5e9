// The collective timeout (CommTimeout, group.h): the watchdog thread, the UDP heartbeats between
// ranks and OpScope, the record of the operation this rank waits in. Nothing here calls MPI off the
// main thread.
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
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "comm/group.h"
#include "comm/group_internal.h"
#include "comm/mpi_runtime.h"
#include "core/error.h"

namespace moe::comm {
namespace detail {
namespace {

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
  uint64_t host = 0;                  // hash of the host name
  uint32_t ip[kHeartbeatAddrs] = {};  // network order; 0 = none
  uint16_t port = 0;                  // network order; 0 = no heartbeat socket
  uint16_t pad[3] = {};
};
struct Heartbeat {
  int fd = -1;
  int me = -1;
  std::vector<PeerAddress> peers;             // by world rank
  std::vector<int> watched;                   // world ranks this rank sends to and listens for
  std::vector<Clock::time_point> last_heard;  // by world rank (start time until one arrives)
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

}  // namespace

struct Watch {
  std::mutex mu;
  std::condition_variable cv;
  bool quit = false;
  bool in_op = false;
  bool warned = false;  // this op's wait was reported as long (it may still complete)
  Clock::time_point op_start;
  char op[512] = {0};  // "MPI_Allreduce(max) on group rank 0 of 4 (world ranks 0-3)"
  double timeout_s = 0, grace_s = 0;
  const volatile std::sig_atomic_t* stop_flag = nullptr;
  int world_rank = -1, world_size = 0;
  Heartbeat heartbeat;
  std::thread thread;
};
namespace {
std::atomic<Watch*> g_watch{nullptr};
}  // namespace

OpScope::OpScope(const char* op, int rank, int size, const std::string& members, int peer,
                 int peer_world, int tag) {
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

OpScope::~OpScope() {
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

namespace {

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
}  // namespace
}  // namespace detail

using detail::g_watch;
using detail::mpi_alive;
using detail::Watch;
using detail::watchdog_loop;

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

}  // namespace moe::comm
