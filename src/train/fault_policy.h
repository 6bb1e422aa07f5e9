// What a run does about non-finite steps (--max-bad-steps): a step whose loss or gradient norm is
// not finite (the same on every rank: both are global) skips its update; the policy counts such
// steps, says so on the root rank, and stops the run (a SetupError on every rank, one reports) after
// --max-bad-steps of them in a row. The count goes into checkpoints.
//
// FaultInjector is the test hook beside it (--fault.nan-steps, --fault.inf-weight-steps): it
// poisons one value on every rank at chosen steps, so the tests can drive the policy and the
// checkpoint guard; a run without those flags never touches it.
#pragma once
#include <vector>

#include "train/checkpointer.h"
#include "train/trainer.h"

namespace moe::train {

class BadStepPolicy {
 public:
  // report: the root rank (prints the skip lines, reports the stop); tty: stderr is a terminal.
  BadStepPolicy(int max_in_a_row, bool report, bool tty) : max_in_a_row_(max_in_a_row), report_(report), tty_(tty) {}
  void resume(int bad_steps) { total_ = at_start_ = bad_steps; }
  // After the update of (0-based) `step`: a skipped one is counted and named; the streak's
  // --max-bad-steps-th throws SetupError naming the last good checkpoint. A good one ends the streak.
  void after_step(int step, bool skipped, bool loss_finite, const Checkpointer& checkpoints);
  int total() const { return total_; }        // in the run, earlier processes included
  int in_a_row() const { return in_a_row_; }  // 0: the last step was good
  int this_process() const { return total_ - at_start_; }

 private:
  const int max_in_a_row_;
  const bool report_, tty_;
  int total_ = 0, in_a_row_ = 0, at_start_ = 0;
};

class FaultInjector {
 public:
  explicit FaultInjector(const FaultOptions& o) : nan_steps_(o.nan_steps), inf_weight_steps_(o.inf_weight_steps) {}
  // Before the update of (0-based) `step`: a NaN in the first gradient (a non-finite gradient norm).
  void before_update(int step, float* grads) const;
  // After it: an Inf in the first weight (an update that "overflowed").
  void after_update(int step, float* params) const;

 private:
  std::vector<int> nan_steps_, inf_weight_steps_;  // 1-based
};

}  // namespace moe::train
