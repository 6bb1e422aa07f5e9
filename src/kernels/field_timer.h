// The step clocks' timer (MoeStepTimes, MlpStepTimes): adds the wall time of a scope to one field
// of a recorder (null: none). On a GPU the interval is closed by a device sync, and
// only while a recorder is installed: without one the timer costs nothing and syncs nothing.
#pragma once
#include "core/timer.h"
#include "kernels/device_select.h"

namespace moe::kernels {

template <class Times>
class FieldTimer {
 public:
  FieldTimer(Times* recorder, double Times::*field)
      : recorder_(recorder), field_(field), start_(recorder ? synced_now() : 0.0) {}
  ~FieldTimer() {
    if (recorder_) recorder_->*field_ += synced_now() - start_;
  }
  FieldTimer(const FieldTimer&) = delete;
  FieldTimer& operator=(const FieldTimer&) = delete;

  static double synced_now() {
    device_synchronize();
    return now_seconds();
  }

 private:
  Times* recorder_;
  double Times::*field_;
  double start_;
};

}  // namespace moe::kernels
