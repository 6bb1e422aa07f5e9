// The pipeline bubble benchmark. Each stage's callbacks stamp what they send and check what they
// receive, then spend a fixed time "computing" (sleeping, or sgemm loops calibrated to the same
// time); the executor's own timers give the step time and each stage's compute time.
#include "tools/bench_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/gemm.h"
#include "parallel/pipeline.h"

namespace moe::parallel {

namespace {

// The value element i of micro-batch mb carries when stage s sends it in step k: a distinct
// integer below 2^24 (exact in fp32) for every (k mod 8, s mod 16, mb mod 2^14, i mod 8);
// gradients carry its negative, so a gradient can never pass for an activation.
float stamp(int64_t k, int s, int mb, size_t i) {
  return static_cast<float>((k % 8) * (1 << 21) + (s % 16) * (1 << 17) + (mb % (1 << 14)) * 8 +
                            static_cast<int64_t>(i % 8));
}

// "Compute" of a fixed duration: sleep until t0 + ms, or run the calibrated sgemm loop.
class Work {
 public:
  Work(const std::string& mode, int gemm_n) : sleep_(mode == "sleep"), n_(gemm_n) {
    if (!sleep_) {
      size_t nn = static_cast<size_t>(n_) * n_;
      a_.resize(nn), b_.resize(nn), c_.resize(nn);
      for (size_t i = 0; i < nn; ++i) a_[i] = 0.001f * (i % 97), b_[i] = 0.002f * (i % 89);
    }
  }
  void gemms(int reps) {
    for (int r = 0; r < reps; ++r)
      kernels::gemm(false, false, n_, n_, n_, 1.0f, a_.data(), 0, b_.data(), 0, 0.0f, c_.data(), 0);
  }
  // t0: when the callback began (its stamping and checking count towards the duration).
  void run(std::chrono::steady_clock::time_point t0, double ms, int reps) {
    if (sleep_) {
      std::this_thread::sleep_until(t0 + std::chrono::duration<double, std::milli>(ms));
    } else {
      gemms(reps);
    }
  }

 private:
  bool sleep_;
  int n_;
  Buffer<float> a_, b_, c_;
};

void validate(const PipelineBenchOptions& o) {
  MOE_CHECK(!o.micro_batches.empty(), "bench pipeline: no micro-batch counts given");
  for (int M : o.micro_batches)
    MOE_CHECK(M >= 1, "bench pipeline: micro-batch count ", M, " (must be >= 1)");
  MOE_CHECK(o.mode == "sleep" || o.mode == "gemm", "bench pipeline: mode '", o.mode,
            "' (expected sleep or gemm)");
  MOE_CHECK(o.forward_ms > 0, "bench pipeline: forward time ", o.forward_ms, " ms (must be > 0)");
  MOE_CHECK(o.activation_floats >= 1, "bench pipeline: activation size 0 floats");
  MOE_CHECK(o.iters >= 1, "bench pipeline: iters = ", o.iters, " (must be >= 1)");
  MOE_CHECK(o.warmup >= 0, "bench pipeline: warmup = ", o.warmup, " (must be >= 0)");
}

// Per-stage numbers of one step, as gathered to every rank.
constexpr int kFields = 6;  // total, compute, wait, max_in_flight, comm_bytes, wrong
struct StageStep {
  double total = 0, compute = 0, wait = 0;
  int in_flight = 0;
  int64_t comm_bytes = 0, wrong = 0;
};

}  // namespace

std::string bubble_definition() {
  return "bubble = mean over stages s of (1 - compute(s) / step), step = max over stages of the "
         "stage's run_pipeline wall time, compute(s) = time inside s's callbacks; reported for the "
         "iteration with the median step time";
}

PipelineBenchResult run_pipeline_bench(const comm::Group& world, const PipelineBenchOptions& opts) {
  validate(opts);
  MOE_CHECK(world.valid(), "bench pipeline: the world group is not valid");
  const int PP = world.size(), stage = world.rank();
  PipelineBenchResult res;
  res.opts = opts;
  res.pp = PP;
  res.backward_ms = 2 * opts.forward_ms;
  res.cores = std::thread::hardware_concurrency();
  const size_t n = opts.activation_floats;

  // gemm mode: reps of an n_g³ sgemm per forward, from the slowest rank's calibration (all ranks
  // calibrate at once, so an oversubscribed machine measures its shared cores).
  int reps_f = 0;
  if (opts.mode == "gemm") {
    res.gemm_n = 128;
    Work w(opts.mode, res.gemm_n);
    w.gemms(3);
    int probe = 0;  // sgemms for at least 0.25 s: long enough to average out clock ramp-up
    double t0 = now_seconds(), elapsed = 0;
    while (elapsed < 0.25) {
      w.gemms(8);
      probe += 8;
      elapsed = now_seconds() - t0;
    }
    double per_gemm = elapsed / probe;
    world.allreduce_max(&per_gemm, 1);
    reps_f = std::max(1, static_cast<int>(std::lround(opts.forward_ms * 1e-3 / per_gemm)));
    res.gemm_reps_forward = reps_f;
  }
  Work work(opts.mode, res.gemm_n);

  std::vector<Schedule> scheds;
  if (opts.schedule != Schedule::kGPipe) scheds.push_back(Schedule::k1F1B);
  if (opts.schedule != Schedule::k1F1B) scheds.push_back(Schedule::kGPipe);

  int64_t k = 0;  // step counter (same on every rank): stamps differ from step to step
  for (Schedule sched : scheds) {
    for (int M : opts.micro_batches) {
      PipelineBenchRow row;
      row.schedule = name(sched);
      row.pp = PP;
      row.M = M;
      const double tf = opts.forward_ms, tb = res.backward_ms;
      row.ideal_ms = (M + PP - 1) * (tf + tb);
      row.bubble_theory = double(PP - 1) / (M + PP - 1);

      int64_t wrong = 0;
      StageCallbacks cb;
      cb.forward = [&](int mb, const float* x_in, float* x_out) {
        auto t0 = std::chrono::steady_clock::now();
        if (x_in)
          for (size_t i = 0; i < n; ++i) wrong += x_in[i] != stamp(k, stage - 1, mb, i);
        if (x_out)
          for (size_t i = 0; i < n; ++i) x_out[i] = stamp(k, stage, mb, i);
        work.run(t0, tf, reps_f);
      };
      cb.backward = [&](int mb, const float* dy_out, float* dx_in) {
        auto t0 = std::chrono::steady_clock::now();
        if (dy_out)
          for (size_t i = 0; i < n; ++i) wrong += dy_out[i] != -stamp(k, stage + 1, mb, i);
        if (dx_in)
          for (size_t i = 0; i < n; ++i) dx_in[i] = -stamp(k, stage, mb, i);
        work.run(t0, tb, 2 * reps_f);
      };

      std::vector<std::vector<StageStep>> steps;  // [iter][stage]
      for (int it = 0; it < opts.warmup + opts.iters; ++it, ++k) {
        world.barrier();  // every stage starts the step together
        MemTracker mem;
        PipelineTimes t = run_pipeline(world, sched, M, n, cb, &mem);
        if (it < opts.warmup) continue;
        double mine[kFields] = {t.total_s, t.compute_s, t.wait_s, double(t.max_in_flight),
                                double(t.comm_bytes), 0};
        std::vector<double> all(static_cast<size_t>(kFields) * PP);
        world.allgather(mine, all.data(), kFields);
        std::vector<StageStep> per(PP);
        for (int s = 0; s < PP; ++s) {
          const double* f = &all[static_cast<size_t>(s) * kFields];
          per[s] = {f[0], f[1], f[2], static_cast<int>(f[3]), static_cast<int64_t>(f[4]), 0};
        }
        steps.push_back(per);
      }
      world.allreduce_sum(&wrong, 1);
      row.wrong = wrong;

      // The iteration with the median step time (step = the slowest stage's wall time).
      std::vector<double> step_s(steps.size());
      for (size_t i = 0; i < steps.size(); ++i)
        for (const StageStep& st : steps[i]) step_s[i] = std::max(step_s[i], st.total);
      std::vector<size_t> order(steps.size());
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return step_s[a] < step_s[b]; });
      const size_t pick = order[order.size() / 2];
      const double step = step_s[pick];
      row.step_ms = 1e3 * step;
      for (const StageStep& st : steps[pick]) {
        row.bubble += (1.0 - st.compute / step) / PP;
        row.bubble_wait += (st.wait / step) / PP;
        row.compute_ms.push_back(1e3 * st.compute);
        row.wait_ms.push_back(1e3 * st.wait);
        row.total_ms.push_back(1e3 * st.total);
        row.max_in_flight.push_back(st.in_flight);
        row.comm_bytes.push_back(st.comm_bytes);
      }
      row.ratio = row.bubble_theory > 0 ? row.bubble / row.bubble_theory : 0;
      res.rows.push_back(std::move(row));
    }
  }
  return res;
}

namespace {
template <class T>
std::string join(const std::vector<T>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}
}  // namespace

std::string format_pipeline_table(const PipelineBenchResult& r) {
  const PipelineBenchOptions& o = r.opts;
  std::ostringstream os;
  char line[400];
  std::snprintf(line, sizeof line,
                "# pipeline  PP=%d  tf=%.1f ms  tb=%.1f ms  activation=%zu floats (%.0f KiB)  "
                "iters=%d (+%d warm-up)\n",
                r.pp, o.forward_ms, r.backward_ms, o.activation_floats,
                o.activation_floats * 4.0 / 1024.0, o.iters, o.warmup);
  os << line;
  if (o.mode == "sleep") {
    os << "# mode=sleep: each callback waits a fixed wall time (balanced stages, independent of "
          "the core count)\n";
  } else {
    std::snprintf(line, sizeof line,
                  "# mode=gemm: %d x %d^3 sgemm per forward (x2 backward); honest only with one "
                  "core per rank (here %d ranks, %u hardware threads)\n",
                  r.gemm_reps_forward, r.gemm_n, r.pp, r.cores);
    os << line;
  }
  os << "# " << bubble_definition() << "; theory (PP-1)/(M+PP-1)\n";
  std::snprintf(line, sizeof line, "%-8s %4s %5s %10s %10s %9s %9s %7s  %-16s %8s\n", "schedule",
                "PP", "M", "step(ms)", "ideal(ms)", "bubble", "theory", "ratio", "max-in-flight",
                "#wrong");
  os << line;
  for (const PipelineBenchRow& row : r.rows) {
    std::snprintf(line, sizeof line, "%-8s %4d %5d %10.1f %10.1f %9.4f %9.4f %7.3f  %-16s %8lld\n",
                  row.schedule.c_str(), row.pp, row.M, row.step_ms, row.ideal_ms, row.bubble,
                  row.bubble_theory, row.ratio, join(row.max_in_flight).c_str(),
                  static_cast<long long>(row.wrong));
    os << line;
  }
  return os.str();
}

std::string pipeline_bench_json(const PipelineBenchResult& r) {
  const PipelineBenchOptions& o = r.opts;
  nlohmann::json j;
  j["bench"] = "pipeline";
  j["options"] = {{"pp", r.pp},
                  {"micro_batches", o.micro_batches},
                  {"schedule", o.schedule ? name(*o.schedule) : "both"},
                  {"forward_ms", o.forward_ms},
                  {"backward_ms", r.backward_ms},
                  {"activation_floats", o.activation_floats},
                  {"warmup", o.warmup},
                  {"iters", o.iters},
                  {"mode", o.mode}};
  if (o.mode == "gemm") {
    j["gemm_n"] = r.gemm_n;
    j["gemm_reps_forward"] = r.gemm_reps_forward;
  }
  j["cores"] = r.cores;
  j["bubble_definition"] = bubble_definition();
  j["rows"] = nlohmann::json::array();
  for (const PipelineBenchRow& row : r.rows) {
    j["rows"].push_back({{"schedule", row.schedule},
                         {"pp", row.pp},
                         {"M", row.M},
                         {"step_ms", row.step_ms},
                         {"ideal_ms", row.ideal_ms},
                         {"bubble", row.bubble},
                         {"bubble_wait", row.bubble_wait},
                         {"bubble_theory", row.bubble_theory},
                         {"ratio", row.ratio},
                         {"max_in_flight", row.max_in_flight},
                         {"compute_ms", row.compute_ms},
                         {"wait_ms", row.wait_ms},
                         {"total_ms", row.total_ms},
                         {"comm_bytes", row.comm_bytes},
                         {"wrong", row.wrong}});
  }
  return j.dump(2);
}

}  // namespace moe::parallel
