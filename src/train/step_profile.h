// --profile: the MoE layers' step times of every training step (moe/step_times.h: the model's
// MoE layers record for forward and backward only, not validation), their totals over the run
// beside the rest of the step, and the summary printed at the end (rank 0's view).
#pragma once
#include <optional>

#include "model/model.h"
#include "moe/step_times.h"
#include "train/step_record.h"

namespace moe::train {

// The model's MoE layers record into `times` for the recorder's lifetime.
class MoeStepRecorder {
 public:
  MoeStepRecorder(model::Model& model, mixture::MoeStepTimes* times) : model_(model) {
    model_.record_step_times(times);
  }
  ~MoeStepRecorder() { model_.record_step_times(nullptr); }
  MoeStepRecorder(const MoeStepRecorder&) = delete;
  MoeStepRecorder& operator=(const MoeStepRecorder&) = delete;

 private:
  model::Model& model_;
};

class StepProfile {
 public:
  explicit StepProfile(bool on) : on_(on) {}
  bool on() const { return on_; }
  // A recorder of the model's MoE layers into `times` for one step's forward and backward
  // (empty when off).
  void record(std::optional<MoeStepRecorder>& recorder, model::Model& model, mixture::MoeStepTimes* times) const {
    if (on_) recorder.emplace(model, times);
  }
  // One step's figures: its MoE step times, the pipeline's compute, the optimizer, the gradient
  // sync, the whole step, and this rank's time inside the exchange.
  void add(const mixture::MoeStepTimes& moe, double compute, double optimizer, double sync, double step,
           double a2a);
  // The summary on stderr: the steps' seconds split into the MoE layers' steps, the rest of
  // forward + backward (attention, dense GEMMs, norms, embedding, loss), the gradient sync and
  // the optimizer.
  void print() const;
  // A step's MoE step times as the metrics' time_s.moe (only when on).
  void add_to_record(const mixture::MoeStepTimes& moe, StepRecord& rec) const;

 private:
  const bool on_;
  mixture::MoeStepTimes moe_;
  double compute_ = 0, optimizer_ = 0, sync_ = 0, steps_ = 0, a2a_ = 0;
};

}  // namespace moe::train
