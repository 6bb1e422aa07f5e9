#include "train/fault_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/device.h"
#include "kernels/device_select.h"

namespace moe::train {

void BadStepPolicy::after_step(int step, bool skipped, bool loss_finite, const Checkpointer& checkpoints) {
  if (!skipped) {
    in_a_row_ = 0;
    return;
  }
  ++total_;
  ++in_a_row_;
  if (report_)
    std::fprintf(stderr, "%sstep %d: non-finite %s, update skipped (%d in a row, %d in all)\n", tty_ ? "\n" : "",
                 step + 1, loss_finite ? "gradient" : "loss", in_a_row_, total_);
  // The loss and the norm are global: every rank stops here together, one reports.
  if (in_a_row_ >= max_in_a_row_)
    throw SetupError(str_cat(in_a_row_, " non-finite steps in a row (--max-bad-steps ", max_in_a_row_,
                             "): stopping; the last good checkpoint is ", checkpoints.last_or_none()),
                     report_);
}

namespace {

bool listed(const std::vector<int>& steps, int step) {
  return std::find(steps.begin(), steps.end(), step + 1) != steps.end();
}

// x[0] = value on x's device.
void set_first(float* x, float value) {
  device_copy(kernels::active_device(), x, Device::kCpu, &value, sizeof(float));
}

}  // namespace

void FaultInjector::before_update(int step, float* grads) const {
  if (listed(nan_steps_, step)) set_first(grads, NAN);
}

void FaultInjector::after_update(int step, float* params) const {
  if (listed(inf_weight_steps_, step)) set_first(params, INFINITY);
}

}  // namespace moe::train
