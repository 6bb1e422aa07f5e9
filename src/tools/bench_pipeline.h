// `moetrain bench pipeline`: the pipeline executor (parallel/pipeline.h) over the world group, with
// stages of known, equal cost, measuring the bubble of 1F1B and GPipe against the theoretical
// (PP − 1)/(M + PP − 1). Activations are stamped with (step, stage, micro-batch, index), so every
// stage checks that what it receives is what its neighbour wrote (#wrong, nccl-tests style).
// Timing caveat: a rank waiting for a neighbour busy-polls inside MPI_Wait. With fewer free cores
// than ranks (oversubscription, or other jobs on the machine) the poller competes for a core with
// the stage that just woke up, and each hop between stages gains scheduling delay that shows up
// as bubble; OMPI_MCA_mpi_yield_when_idle=1 (set before MPI_Init) makes waiting ranks yield.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/modes.h"

namespace moe::parallel {

struct PipelineBenchOptions {
  std::vector<int> micro_batches{1, 2, 4, 8, 16};      // M values, one row each
  std::optional<Schedule> schedule = Schedule::k1F1B;  // one schedule, or std::nullopt: both
  double forward_ms = 20;                              // per micro-batch and stage; backward = 2×
  size_t activation_floats = 64 * 1024;                // one micro-batch's stage output
  int warmup = 1, iters = 3;                           // steps per row: warmup unmeasured, then iters
  // "sleep": each callback waits a fixed wall time (balanced stages, whatever the core count;
  // an oversubscribed machine would otherwise time-share cores and distort the bubble).
  // "gemm": sgemm loops calibrated to the same duration (honest only with one core per rank).
  std::string mode = "sleep";
};

struct PipelineBenchRow {
  std::string schedule;
  int pp = 1, M = 1;
  double step_ms = 0;              // wall time of the step: max over stages of run_pipeline's total_s
  double ideal_ms = 0;             // (M + PP − 1)·(tf + tb)
  double bubble = 0;               // measured (see bubble_definition())
  double bubble_wait = 0;          // mean over stages of wait_s / step (time blocked in receives)
  double bubble_theory = 0;        // (PP − 1)/(M + PP − 1)
  double ratio = 0;                // bubble / bubble_theory (0 when theory is 0)
  std::vector<int> max_in_flight;  // [pp]
  // [pp] of the reported iteration
  std::vector<double> compute_ms, wait_ms, total_ms;
  std::vector<int64_t> comm_bytes;  // [pp]
  int64_t wrong = 0;                // received elements unlike the neighbour's stamp (all steps)
};

struct PipelineBenchResult {
  PipelineBenchOptions opts;
  int pp = 1;
  double backward_ms = 0;     // 2 · forward_ms
  int gemm_n = 0;             // gemm mode: the square sgemm size of the loops
  int gemm_reps_forward = 0;  // gemm mode: sgemms per forward (backward: twice as many)
  unsigned cores = 0;         // hardware threads of rank 0's machine
  std::vector<PipelineBenchRow> rows;
};

// Collective over `world` (pp = world.size(), stage = world.rank()). Rank 0's result is complete
// (every stage's numbers); other ranks get the same rows.
PipelineBenchResult run_pipeline_bench(const comm::Group& world, const PipelineBenchOptions& opts);
// One line describing how the measured bubble is computed.
std::string bubble_definition();
std::string format_pipeline_table(const PipelineBenchResult& result);
std::string pipeline_bench_json(const PipelineBenchResult& result);

}  // namespace moe::parallel
