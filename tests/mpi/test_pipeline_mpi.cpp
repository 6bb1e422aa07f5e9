// Multi-rank test of the pipeline executor (parallel/pipeline.h): the world is one pipeline, rank =
// stage. A tiny real model runs through it: stage s computes y = a_s ⊙ x + b_s per micro-batch
// (stage 0's input is f(mb)), the last stage's loss is sum(y ⊙ c); backward gives dy_in = a_s ⊙ dy
// and accumulates da_s += dy ⊙ x, db_s += dy. Every rank recomputes the whole composition serially
// and checks its stage's gradients and the loss bit for bit (same noinline arithmetic, same
// micro-batch order), that 1F1B and GPipe agree bit for bit, the measured in-flight counts, the
// buffer accounting and the argument errors. Plain main under mpirun (see pipeline.cmake): rank 0
// prints "N passed, M failed"; the exit code is non-zero on any failure.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "core/buffer.h"
#include "core/error.h"
#include "mpi_check.h"
#include "parallel/pipeline.h"

using namespace moe;
using namespace moe::parallel;

namespace {

using mpitest::ck;

// Parameters and inputs: exact small binary fractions, a function of (stage, index) / (mb, index).
float a_of(int s, int i) { return 0.5f + 0.0625f * ((s * 7 + i) % 13); }
float b_of(int s, int i) { return 0.125f * ((s + 3 * i) % 5) - 0.25f; }
float c_of(int i) { return 1.0f + 0.03125f * (i % 17); }
float input_of(int mb, int i) { return 0.125f * ((mb * 31 + i) % 23) - 1.0f; }

// The arithmetic of one stage; noinline so that the pipeline and the serial reference run the
// very same machine code (bit-identical results whatever the compiler's contraction choices).
__attribute__((noinline)) void stage_forward(int s, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = a_of(s, i) * x[i] + b_of(s, i);
}
// da += dy ⊙ x, db += dy; dx = a ⊙ dy (dx may be null on the first stage).
__attribute__((noinline)) void stage_backward(int s, const float* x, const float* dy, float* dx,
                                              float* da, float* db, int n) {
  for (int i = 0; i < n; ++i) {
    da[i] += dy[i] * x[i];
    db[i] += dy[i];
    if (dx) dx[i] = a_of(s, i) * dy[i];
  }
}
__attribute__((noinline)) double loss_of(const float* y, int n) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += double(y[i]) * double(c_of(i));
  return sum;
}

struct Grads {
  std::vector<float> da, db;
  double loss = 0;  // summed over micro-batches in order (the last stage's; 0 elsewhere)
};

// The whole composition on one rank: micro-batches in order, stages 0..PP−1 then back.
std::vector<Grads> serial_reference(int PP, int M, int n) {
  std::vector<Grads> g(PP);
  for (Grads& gs : g) gs.da.assign(n, 0.f), gs.db.assign(n, 0.f);
  std::vector<float> c(n);
  for (int i = 0; i < n; ++i) c[i] = c_of(i);
  for (int mb = 0; mb < M; ++mb) {
    std::vector<std::vector<float>> x(PP + 1, std::vector<float>(n));
    for (int i = 0; i < n; ++i) x[0][i] = input_of(mb, i);
    for (int s = 0; s < PP; ++s) stage_forward(s, x[s].data(), x[s + 1].data(), n);
    g[PP - 1].loss += loss_of(x[PP].data(), n);
    std::vector<float> dy = c, dx(n);
    for (int s = PP - 1; s >= 0; --s) {
      stage_backward(s, x[s].data(), dy.data(), s > 0 ? dx.data() : nullptr, g[s].da.data(),
                     g[s].db.data(), n);
      dy = dx;
    }
  }
  return g;
}

struct RunResult {
  Grads g;
  PipelineTimes times;
  int stash_peak = 0;  // inputs kept for backward at once, counted by the callbacks
  size_t mem_current = 0, mem_peak = 0;
};

RunResult run_once(const comm::Group& pp, Schedule sched, int M, int n) {
  const int s = pp.rank(), PP = pp.size();
  const bool first = s == 0, last = s == PP - 1;
  RunResult r;
  r.g.da.assign(n, 0.f);
  r.g.db.assign(n, 0.f);
  std::map<int, std::vector<float>> stash;  // mb -> this stage's input (kept for backward)
  std::vector<float> c(n), y(n);
  for (int i = 0; i < n; ++i) c[i] = c_of(i);
  const std::string where = str_cat(name(sched), " PP=", PP, " stage=", s, " M=", M,
                                    " n=", n);
  int next_fwd = 0, next_bwd = 0;

  StageCallbacks cb;
  cb.forward = [&](int mb, const float* x_in, float* x_out) {
    CHECK((x_in == nullptr) == first, where, ": x_in null iff first stage");
    CHECK((x_out == nullptr) == last, where, ": x_out null iff last stage");
    CHECK(mb == next_fwd++, where, ": forward of mb ", mb, " out of order");
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = first ? input_of(mb, i) : x_in[i];
    float* out = last ? y.data() : x_out;
    stage_forward(s, x.data(), out, n);
    if (last) r.g.loss += loss_of(y.data(), n);
    stash[mb] = std::move(x);
    r.stash_peak = std::max(r.stash_peak, static_cast<int>(stash.size()));
  };
  cb.backward = [&](int mb, const float* dy_out, float* dx_in) {
    CHECK((dy_out == nullptr) == last, where, ": dy_out null iff last stage");
    CHECK((dx_in == nullptr) == first, where, ": dx_in null iff first stage");
    CHECK(mb == next_bwd++, where, ": backward of mb ", mb, " out of order");
    auto it = stash.find(mb);
    CHECK(it != stash.end(), where, ": backward of mb ", mb, " before its forward");
    if (it == stash.end()) return;
    stage_backward(s, it->second.data(), last ? c.data() : dy_out, dx_in, r.g.da.data(),
                   r.g.db.data(), n);
    stash.erase(it);
  };

  MemTracker mem;
  r.times = run_pipeline(pp, sched, M, static_cast<size_t>(n), cb, &mem);
  r.mem_current = mem.current();
  r.mem_peak = mem.peak();
  CHECK(stash.empty() && next_fwd == M && next_bwd == M, where, ": every mb forward and backward");
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void test_case(const comm::Group& pp, int M, int n) {
  const int s = pp.rank(), PP = pp.size();
  const std::vector<Grads> ref = serial_reference(PP, M, n);
  std::vector<float> da_by_sched[2], db_by_sched[2];
  for (Schedule sched : {Schedule::k1F1B, Schedule::kGPipe}) {
    const std::string where = str_cat(name(sched), " PP=", PP, " stage=", s, " M=", M,
                                      " n=", n);
    RunResult r = run_once(pp, sched, M, n);
    const int k = sched == Schedule::k1F1B ? 0 : 1;
    CHECK(same_bits(r.g.da, ref[s].da), where, ": da equals the serial composition bit for bit");
    CHECK(same_bits(r.g.db, ref[s].db), where, ": db equals the serial composition bit for bit");
    double loss = r.g.loss;
    pp.allreduce_sum(&loss, 1);  // only the last stage's is non-zero: the sum is exact
    CHECK(loss == ref[PP - 1].loss, where, ": loss ", loss, " vs serial ", ref[PP - 1].loss);
    da_by_sched[k] = r.g.da;
    db_by_sched[k] = r.g.db;

    const int want = sched == Schedule::k1F1B ? std::min(PP - s, M) : M;
    CHECK(r.times.max_in_flight == want, where, ": max_in_flight ", r.times.max_in_flight,
          " expected ", want);
    CHECK(r.stash_peak == want, where, ": inputs stashed at once ", r.stash_peak, " expected ",
          want);
    CHECK(r.mem_current == 0, where, ": comm buffers freed (", r.mem_current, " bytes left)");
    CHECK(r.mem_peak == r.times.comm_bytes, where, ": comm_mem peak ", r.mem_peak,
          " == comm_bytes ", r.times.comm_bytes);
    const size_t act = static_cast<size_t>(n) * sizeof(float);
    if (PP == 1) {
      CHECK(r.times.comm_bytes == 0, where, ": one stage holds no comm buffers");
    } else {
      CHECK(r.times.comm_bytes >= act && r.times.comm_bytes % act == 0, where, ": comm_bytes ",
            r.times.comm_bytes);
      // Bounded by what is in flight (sends are retired as neighbours' messages prove them
      // received), not by M: at most 2 buffers per in-flight mb and direction, plus the posted-
      // ahead input and a retiring gradient send.
      const size_t bound = (4 * static_cast<size_t>(want) + 3) * act;
      CHECK(r.times.comm_bytes <= bound, where, ": comm_bytes ", r.times.comm_bytes / act,
            " activations > bound ", bound / act);
    }
    const PipelineTimes& t = r.times;
    CHECK(t.total_s > 0 && t.compute_s >= 0 && t.wait_s >= 0 &&
              t.compute_s + t.wait_s <= t.total_s * 1.0001 + 1e-6,
          where, ": times total ", t.total_s, " compute ", t.compute_s, " wait ", t.wait_s);
    if (ck.rank == 0 && n > 1000 && M == 8)
      std::printf("  %-5s PP=%d M=%d n=%d: comm buffers %zu activations on stage 0\n",
                  name(sched), PP, M, n, t.comm_bytes / act);
  }
  CHECK(same_bits(da_by_sched[0], da_by_sched[1]) && same_bits(db_by_sched[0], db_by_sched[1]),
        "PP=", PP, " stage=", s, " M=", M, " n=", n, ": 1f1b and gpipe gradients bit-identical");
}

void test_errors(const comm::Group& pp) {
  StageCallbacks cb;
  cb.forward = [](int, const float*, float*) {};
  cb.backward = [](int, const float*, float*) {};
  // Every rank throws before any communication, so the group stays usable.
  auto message = [&](int M, const StageCallbacks& c) -> std::string {
    try {
      run_pipeline(pp, Schedule::k1F1B, M, 8, c, nullptr);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  std::string e = message(0, cb);
  CHECK(e.find("M = 0") != std::string::npos, "M = 0 rejected: '", e, "'");
  e = message(-3, cb);
  CHECK(e.find("M = -3") != std::string::npos, "M = -3 rejected: '", e, "'");
  StageCallbacks no_fwd;
  no_fwd.backward = cb.backward;
  e = message(2, no_fwd);
  CHECK(e.find("forward callback") != std::string::npos, "unset forward rejected: '", e, "'");
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiRuntime mpi(&argc, &argv);
  int exit_code = 0;
  try {
    comm::Group pp = comm::Group::world();
    ck.rank = pp.rank();
    test_errors(pp);
    for (int n : {1, 37, 65536})  // 65536 floats: above the eager limit, rendezvous transfers
      for (int M : {1, 2, 3, 4, 5, 8})
        test_case(pp, M, n);
    pp.barrier();
    exit_code = ck.report(pp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", ck.rank, e.what());
    comm::MpiRuntime::abort(2);
  }
  return exit_code;
}
