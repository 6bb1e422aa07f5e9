#include "train/time_budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moe::train {

std::string format_duration(double s) {
  int t = static_cast<int>(std::lround(s));
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", t / 3600, (t / 60) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", t / 60, t % 60);
  return buf;
}

std::string format_budget(double s) {
  if (s >= 59.95) return format_duration(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3gs", s);
  return buf;
}

TimeBudget::TimeBudget(const TrainOptions& opts, bool report, bool tty)
    : budget_s_(opts.time_budget_s),
      max_steps_(opts.steps),
      warmup_steps_(opts.optim.warmup_steps),
      report_(report),
      tty_(tty),
      total_steps_(opts.steps),
      pending_(opts.time_budget_s > 0) {}

void TimeBudget::resume(int step0, int chosen, const std::string& resume_path, bool root) {
  step0_ = step0;
  if (active() && chosen > 0) {
    total_steps_ = std::min(chosen, max_steps_);
    pending_ = false;
    if (report_) std::fprintf(stderr, "--time-budget: keeping the %d steps the checkpoint's run chose\n", total_steps_);
  } else if (active() && step0 > warmup_steps_) {
    throw SetupError(str_cat("--time-budget: ", resume_path, " is at step ", step0, ", past the ", warmup_steps_,
                             " warm-up steps whose time chooses the step count, and its run did not use "
                             "--time-budget: resume it with --steps"),
                     root);
  } else if (!active() && chosen > 0 && chosen != max_steps_ && report_) {
    std::fprintf(stderr, "note: the checkpoint's run chose %d steps with --time-budget; this run's schedule ends "
                         "at --steps %d\n",
                 chosen, max_steps_);
  }
}

// The count is chosen after step `warmup` from the median time of this process's warm-up steps
// (its first two untimed: first-touch page faults, JIT kernels), the slowest rank's.
bool TimeBudget::after_step(int step, double step_seconds, const comm::Group& world) {
  train_s_ += step_seconds;
  if (!pending_) return false;
  if (step >= step0_ + 2) warmup_times_.push_back(step_seconds);
  if (step < warmup_steps_) return false;
  if (warmup_times_.empty()) warmup_times_.push_back(step_seconds);  // resumed at the warm-up's end
  std::vector<double> t = warmup_times_;
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  // Every rank must choose the same count: the slowest rank's median and clock decide.
  double agreed[2] = {t[t.size() / 2], train_s_};
  if (world.size() > 1) world.allreduce_max(agreed, 2);
  const double median = std::max(agreed[0], 1e-9);
  // Steps of an earlier process (a resumed run) count at the median.
  const double spent = agreed[1] + step0_ * median;
  const double more = std::floor(std::max(0.0, budget_s_ - spent) / median);
  total_steps_ = static_cast<int>(std::min<double>(max_steps_, step + 1 + more));
  pending_ = false;
  record_ = TimeBudgetRecord{budget_s_, median, spent, static_cast<int>(warmup_times_.size()), total_steps_};
  if (report_)
    std::fprintf(stderr, "%s--time-budget %s: %d steps (median step %.3g s over %d warm-up steps; `--steps %d` "
                         "repeats this run)\n",
                 tty_ ? "\n" : "", format_budget(budget_s_).c_str(), total_steps_, median,
                 static_cast<int>(warmup_times_.size()), total_steps_);
  return true;
}

double TimeBudget::eta(int step, int step0, double elapsed) const {
  if (pending_) return std::max(0.0, budget_s_ - train_s_);
  return elapsed / (step + 1 - step0) * (total_steps_ - step - 1);
}

std::string TimeBudget::steps_text() const {
  if (!pending_) return str_cat(total_steps_, " steps");
  return str_cat("steps to fill a ", format_budget(budget_s_), " time budget",
                 max_steps_ < kTimeBudgetMaxSteps ? str_cat(" (at most ", max_steps_, ")") : "");
}

}  // namespace moe::train
