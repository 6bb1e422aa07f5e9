// --time-budget (TrainOptions::time_budget_s): the run's step count, chosen once after the warm-up
// from the median time of its timed steps, so that the training steps fill the budget. Steps
// 0..warmup run at learning rates that do not depend on the count; from the choice on the count
// (and with it the cosine schedule) is fixed, so `--steps N` with the chosen N repeats the run.
// Without a budget it holds --steps and does nothing. Also the duration formats of the progress
// lines (format_duration, format_budget).
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "train/step_record.h"
#include "train/trainer.h"

namespace moe::train {

// "1m05s" / "2h03m".
std::string format_duration(double s);
// A budget or a time measured against it: under a minute in seconds ("0.5s", "42.3s"), else as
// format_duration.
std::string format_budget(double s);

class TimeBudget {
 public:
  // report: print the choice on stderr (the root rank with --progress); tty: stderr is a terminal.
  TimeBudget(const TrainOptions& opts, bool report, bool tty);
  bool active() const { return budget_s_ > 0; }
  bool pending() const { return pending_; }  // the count is not chosen yet
  int total_steps() const { return total_steps_; }
  double budget_s() const { return budget_s_; }
  double train_s() const { return train_s_; }  // seconds inside the steps of this process
  // A resumed run at step0 whose checkpoint's run chose `chosen` steps (0: none): a count chosen
  // before the checkpoint stays (the schedule must not move); a checkpoint of the warm-up lets this
  // run choose it; a budget for a run past its warm-up that chose none is a SetupError (reported
  // by `root`). Prints what it kept when `report`.
  void resume(int step0, int chosen, const std::string& resume_path, bool root);
  // After each step of this process: its seconds count on the budget's clock; after the warm-up's
  // last step, the count is chosen (collective over `world`: every rank chooses the same). True
  // when it chose (the optimizer's schedule must then be told the new total).
  bool after_step(int step, double step_seconds, const comm::Group& world);
  // The choice, once, for the metrics line of the step that made it.
  std::optional<TimeBudgetRecord> take_record() { return std::exchange(record_, std::nullopt); }
  // The count a checkpoint keeps (0 while pending or without a budget).
  int checkpoint_steps() const { return active() && !pending_ ? total_steps_ : 0; }
  // Seconds left: before the choice the budget left, after it `elapsed` scaled to the steps left.
  double eta(int step, int step0, double elapsed) const;
  // "N steps", or before the choice "steps to fill a 5m00s time budget (at most N)".
  std::string steps_text() const;

 private:
  const double budget_s_;
  const int max_steps_, warmup_steps_;
  const bool report_, tty_;
  int total_steps_;
  bool pending_;
  int step0_ = 0;
  std::vector<double> warmup_times_;  // the timed warm-up steps of this process
  double train_s_ = 0;
  std::optional<TimeBudgetRecord> record_;
};

}  // namespace moe::train
