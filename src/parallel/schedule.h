// Pipeline schedules (1F1B, GPipe) as plain op lists, with no communication: the executor
// (parallel/pipeline.cpp) runs them, the planner (plan/) simulates and sizes them.
#pragma once
#include <string>
#include <vector>

#include "core/modes.h"

namespace moe::parallel {

// The schedule (1f1b, gpipe) is core/modes.h's Schedule.

struct PipeOp {
  bool forward = true;  // false: backward
  int micro_batch = 0;
};

// The ops of `stage` (0-based) of `num_stages` over M micro-batches.
//   GPipe: F0..F(M-1), then B0..B(M-1).
//   1F1B:  w = min(num_stages - stage - 1, M) warm-up forwards; then M - w pairs (F, B);
//          then w cool-down backwards. Backwards run in micro-batch order.
// Errors (naming the numbers) for num_stages < 1, stage outside [0, num_stages), M < 1.
std::vector<PipeOp> make_schedule(Schedule s, int num_stages, int stage, int M);

// Largest number of micro-batches whose forward has run and whose backward has not, at any point
// of the op list (the activations a stage holds at once): min(num_stages - stage, M) for 1F1B.
int max_in_flight(const std::vector<PipeOp>& ops);

// Retiring sends without polling. When the neighbour's message for micro-batch j arrives, the
// neighbour had already completed every receive that precedes that op in its own op list; our
// sends it received are therefore done. The neighbour receives our messages in micro-batch order,
// so "done" is a prefix: per j, how many of our sends are implied complete by its message j.
// neighbour_sends_fwd: whether it sends to us from its forward ops (the previous stage) or its
// backward ops (the next stage).
std::vector<int> implied_done(const std::vector<PipeOp>& neighbour_ops, bool neighbour_sends_fwd, int M);

}  // namespace moe::parallel
