// Communication micro-benchmarks. See calibrate.h.
#include "tools/calibrate_exchange.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "tools/bench_a2a.h"
#include "comm/exchange.h"
#include "comm/mpi_runtime.h"
#include "core/rng.h"
#include "core/error.h"
#include "tools/bench_driver.h"
#include "core/timer.h"

namespace moe::comm {
namespace {

// Message sizes: from lo to hi by factors of 4.
std::vector<double> sizes(double lo, double hi) { return tools::size_sweep(lo, hi, 4.0); }

// Mean over iterations of the slowest rank's time of `op`, all ranks of `world` together. The
// mean, not the median: a step sums many such operations, occasional slow ones included (on a
// machine with more ranks than cores, a descheduled peer costs a scheduler tick).
// gaps: for an operation that training runs between stretches of compute (the exchange), each
// iteration first leaves the network idle for as long as the previous one took (at least 1 ms),
// sleeping. Back to back, a rate-limited link stays saturated: its queue fills, TCP loses packets
// and its congestion window, and a MiB-sized exchange took 1.3-1.6x the link's time on the
// namespace cluster, where training's exchanges (expert GEMMs between them) ran at the link's
// time (docs/cluster.md). On an idle shared-memory node the gap changes nothing.
template <class Op>
double timed(const Group& world, int iters, Op op, bool gaps = false) {
  op();  // warm-up
  double sum = 0, last = 1e-3;
  for (int i = 0; i < iters; ++i) {
    if (gaps) std::this_thread::sleep_for(std::chrono::duration<double>(std::max(1e-3, last)));
    world.barrier();
    const double t0 = now_seconds();
    op();
    double dt = now_seconds() - t0;
    world.allreduce_max(&dt, 1);
    sum += dt;
    last = dt;
  }
  return sum / iters;
}

}  // namespace

void quiet_barrier() {
  if (MpiRuntime::local_world()) return;  // a world of one without MPI: no one to wait for
  MPI_Request req;
  MOE_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS, "quiet_barrier: MPI_Ibarrier failed");
  int done = 0;
  while (true) {
    MOE_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS, "quiet_barrier: MPI_Test failed");
    if (done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<CommMeasurement> measure_a2a(const Group& world, const Topology& topo, int group,
                                         const std::vector<A2a>& algos, double min_bytes,
                                         double max_bytes, int hidden, int topk, int iters) {
  MOE_CHECK(group >= 2 && world.size() % group == 0, "calibrate: a2a group ", group,
            " does not divide the ", world.size(), " ranks");
  Group g = world.split(world.rank() / group, world.rank());
  const int H = hidden, k = topk;
  int E = std::max(8, group);
  while (E % group != 0) ++E;
  std::vector<CommMeasurement> out;
  for (A2a a : algos) {
    CommMeasurement m;
    m.op = "a2a";
    m.algo = a;
    m.world = world.size();
    m.group = group;
    m.ranks_per_node = topo.ranks_per_node;
    TokenExchange ex(g, topo, a, nullptr);
    for (double bytes : sizes(min_bytes, max_bytes)) {
      const int T = std::max(1, static_cast<int>(bytes / (static_cast<double>(k) * H * 4)));
      const A2aRouting r = make_a2a_routing(E, k, "uniform", T, group,
                                            derive_rng(17, static_cast<uint64_t>(world.rank()) * 64 + out.size()));
      std::vector<float> src(static_cast<size_t>(T) * H, 1.0f), back(src.size()), recv;
      // One dispatch (plan + rows out) and one combine (rows back, summed), each timed after an
      // idle gap as in training, where the experts run between them: one all-to-all is their mean.
      const int n_iters = bytes > (1 << 20) ? std::max(3, iters / 2) : iters;
      const ExchangePlan plan = ex.plan(T, static_cast<int>(r.src_row.size()), r.src_row.data(),
                                        r.dst.data(), r.tag.data(), r.value.data());
      recv.resize(static_cast<size_t>(plan.num_recv) * H);
      const double dispatch = timed(
          world, n_iters, [&] {
            ExchangePlan p = ex.plan(T, static_cast<int>(r.src_row.size()), r.src_row.data(), r.dst.data(),
                                     r.tag.data(), r.value.data());
            ex.multicast(p, src.data(), recv.data(), H);
          },
          /*gaps=*/true);
      const double combine = timed(
          world, n_iters, [&] { ex.reduce(plan, recv.data(), back.data(), H); },
          /*gaps=*/true);
      m.bytes.push_back(static_cast<double>(T) * k * H * 4);
      m.seconds.push_back((dispatch + combine) / 2);
    }
    out.push_back(m);
  }
  return out;
}

CommMeasurement measure_p2p(const Group& world, double min_bytes, double max_bytes, int iters, int stride) {
  MOE_CHECK(stride >= 1, "calibrate: p2p stride ", stride, " must be >= 1");
  CommMeasurement m;
  m.op = "p2p";
  m.world = world.size();
  m.group = 2;
  m.ranks_per_node = 0;
  const int me = world.rank();
  const bool first = (me / stride) % 2 == 0;
  const int peer = first ? me + stride : me - stride;
  const bool active = peer < world.size();
  for (double b : sizes(min_bytes, max_bytes)) {
    const int64_t n = static_cast<int64_t>(b / 4);
    std::vector<float> buf(static_cast<size_t>(n), 1.0f);
    double t = timed(world, iters, [&] {
      if (!active) return;
      if (first) {
        world.send(buf.data(), n, peer, 7);
        world.recv(buf.data(), n, peer, 8);
      } else {
        world.recv(buf.data(), n, peer, 7);
        world.send(buf.data(), n, peer, 8);
      }
    });
    m.bytes.push_back(b);
    m.seconds.push_back(t / 2);  // one direction
  }
  return m;
}

CommMeasurement measure_allreduce(const Group& world, int group, double min_bytes, double max_bytes,
                                  int iters) {
  MOE_CHECK(group >= 2 && world.size() % group == 0, "calibrate: all-reduce group ", group,
            " does not divide the ", world.size(), " ranks");
  Group g = world.split(world.rank() / group, world.rank());
  CommMeasurement m;
  m.op = "allreduce";
  m.world = world.size();
  m.group = group;
  m.ranks_per_node = 0;
  for (double b : sizes(min_bytes, max_bytes)) {
    std::vector<float> buf(static_cast<size_t>(b / 4), 1.0f);
    double t = timed(world, iters, [&] { g.allreduce_sum(buf.data(), static_cast<int64_t>(buf.size())); });
    m.bytes.push_back(b);
    m.seconds.push_back(t);
  }
  return m;
}

}  // namespace moe::comm
