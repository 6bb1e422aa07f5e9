// Communication micro-benchmarks. See calibrate.h.
#include "comm/calibrate.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/bench_a2a.h"
#include "core/error.h"
#include "core/timer.h"

namespace moe::comm {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> sizes(double lo, double hi) {
  std::vector<double> s;
  for (double b = lo; b <= hi * 1.0001; b *= 4) s.push_back(b);
  return s;
}

// Median over iterations of the slowest rank's time of `op`, all ranks of `world` together.
template <class Op>
double timed(const Group& world, int iters, Op op) {
  op();  // warm-up
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    world.barrier();
    const double t0 = now_seconds();
    op();
    double dt = now_seconds() - t0;
    world.allreduce_max(&dt, 1);
    t[i] = dt;
  }
  return median(t);
}

}  // namespace

void quiet_barrier() {
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
                                         const std::vector<std::string>& algos, double min_bytes,
                                         double max_bytes, int hidden, int topk, int iters) {
  MOE_CHECK(group >= 2 && world.size() % group == 0, "calibrate: a2a group ", group,
            " does not divide the ", world.size(), " ranks");
  Group g = world.split(world.rank() / group, world.rank());
  A2aBenchOptions o;
  o.min_bytes = static_cast<int64_t>(min_bytes);
  o.max_bytes = static_cast<int64_t>(max_bytes);
  o.factor = 4;
  o.hidden = hidden;
  o.topk = topk;
  o.experts = std::max(8, group);
  while (o.experts % group != 0) ++o.experts;
  o.iters = iters;
  o.warmup = 2;
  o.algorithms.clear();
  for (const std::string& a : algos) o.algorithms.push_back(parse_a2a_algorithm(a));
  A2aBenchResult r = run_a2a_bench(g, topo, o);
  // Every group measured at once; report the slowest group's time.
  std::vector<CommMeasurement> out;
  for (const std::string& a : algos) {
    CommMeasurement m;
    m.op = "a2a";
    m.algo = a;
    m.world = world.size();
    m.group = group;
    m.ranks_per_node = topo.ranks_per_node;
    for (const A2aBenchRow& row : r.rows) {
      if (a2a_algorithm_name(row.algo) != a) continue;
      double t = row.time_us * 1e-6;
      world.allreduce_max(&t, 1);
      m.bytes.push_back(static_cast<double>(row.size));
      m.seconds.push_back(t);
    }
    out.push_back(m);
  }
  return out;
}

CommMeasurement measure_p2p(const Group& world, double min_bytes, double max_bytes, int iters) {
  CommMeasurement m;
  m.op = "p2p";
  m.world = world.size();
  m.group = 2;
  m.ranks_per_node = 0;
  const int me = world.rank();
  const int peer = (me % 2 == 0) ? me + 1 : me - 1;
  const bool active = peer < world.size();
  for (double b : sizes(min_bytes, max_bytes)) {
    const int64_t n = static_cast<int64_t>(b / 4);
    std::vector<float> buf(static_cast<size_t>(n), 1.0f);
    double t = timed(world, iters, [&] {
      if (!active) return;
      if (me % 2 == 0) {
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
