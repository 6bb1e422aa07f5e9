// Pipeline schedules as op lists. See schedule.h.
#include "parallel/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace moe::parallel {

std::vector<PipeOp> make_schedule(Schedule s, int num_stages, int stage, int M) {
  MOE_CHECK(num_stages >= 1, "pipeline: num_stages = ", num_stages, " (must be >= 1)");
  MOE_CHECK(stage >= 0 && stage < num_stages, "pipeline: stage ", stage, " outside [0, ",
            num_stages, ")");
  MOE_CHECK(M >= 1, "pipeline: micro-batches M = ", M, " (must be >= 1)");
  std::vector<PipeOp> ops;
  ops.reserve(2 * static_cast<size_t>(M));
  if (s == Schedule::kGPipe) {
    for (int m = 0; m < M; ++m) ops.push_back({true, m});
    for (int m = 0; m < M; ++m) ops.push_back({false, m});
    return ops;
  }
  // 1F1B: stage i runs w = min(PP - i - 1, M) forwards ahead, so that the last stage can start its
  // first backward as early as possible; then alternates; then drains the w open backwards.
  const int w = std::min(num_stages - stage - 1, M);
  for (int m = 0; m < w; ++m) ops.push_back({true, m});
  for (int i = 0; i < M - w; ++i) {
    ops.push_back({true, w + i});
    ops.push_back({false, i});
  }
  for (int m = M - w; m < M; ++m) ops.push_back({false, m});
  return ops;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  int open = 0, peak = 0;
  for (const PipeOp& op : ops) {
    open += op.forward ? 1 : -1;
    peak = std::max(peak, open);
  }
  return peak;
}

std::vector<int> implied_done(const std::vector<PipeOp>& neighbour_ops, bool neighbour_sends_fwd, int M) {
  std::vector<int> done(M, 0);
  int received = 0;
  for (const PipeOp& op : neighbour_ops) {
    if (op.forward == neighbour_sends_fwd) {
      done[op.micro_batch] = received;
    } else {
      ++received;
    }
  }
  return done;
}

}  // namespace moe::parallel
