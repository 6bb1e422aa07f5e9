// Pipeline parallelism: the schedules (1F1B, GPipe) and the executor that runs one training step's
// schedule on one stage, moving activations forward and their gradients backward between
// neighbouring stages with non-blocking send/recv posted ahead of need. The model math is given
// as callbacks, so the same executor drives training and the bubble benchmark; with one stage it
// is plain gradient accumulation over micro-batches.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/buffer.h"
#include "parallel/schedule.h"

namespace moe::parallel {

struct StageCallbacks {
  // x_in: the previous stage's output for micro-batch mb ([activation_floats]; nullptr on the
  // first stage). x_out: where this stage writes its output (nullptr on the last stage).
  std::function<void(int mb, const float* x_in, float* x_out)> forward;
  // dy_out: the gradient of this stage's output (nullptr on the last stage). dx_in: where this
  // stage writes the gradient of its input (nullptr on the first stage).
  std::function<void(int mb, const float* dy_out, float* dx_in)> backward;
};

struct PipelineTimes {
  double total_s = 0;     // wall time of the step's schedule on this stage
  double compute_s = 0;   // inside the callbacks
  double wait_s = 0;      // blocked waiting for a neighbour's activation/gradient (the bubble)
  int max_in_flight = 0;  // micro-batches whose activations this stage held at once
  size_t comm_bytes = 0;  // bytes of the send/receive buffers this step (charged to comm_mem)
};

// Collective over `pp` (the ranks of one pipeline, ordered by stage: stage = pp.rank()).
// activation_floats: size of one micro-batch's stage output (B_mb · T · H). Receive buffers are
// posted before they are needed: the forward input of micro-batch m as soon as the previous
// forward starts, the backward input as soon as the matching forward has run. Send buffers stay
// alive until their sends complete; all sends complete before return. Buffers are charged to
// comm_mem (may be null), and live on `device` (the model's: the callbacks read and write them;
// a GPU's are staged through the host by comm::Group).
PipelineTimes run_pipeline(const comm::Group& pp, Schedule schedule, int M, size_t activation_floats,
                           const StageCallbacks& callbacks, MemTracker* comm_mem,
                           Device device = Device::kCpu);

}  // namespace moe::parallel
