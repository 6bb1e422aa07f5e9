// MFU's denominator: GFLOP/s per rank at the run's GEMM precision. Given by --peak-gflops (e.g. a
// calibrated profile's peak_flops / 1e9: no noise at all), else measured at start on the run's
// device: on a GPU a large GEMM, on the CPU the best of several short sgemm runs
// (kernels/peak_rate.h), or the peaks --precision auto measured already.
#pragma once
#include <string>

#include "train/run_setup.h"
#include "train/step_record.h"

namespace moe::train {

struct MfuPeak {
  double gflops = 0;
  std::string precision;  // fp32 | bf16: the run's GEMM precision
  std::string source;     // "measured" or "--peak-gflops"

  // On the run's execution context (train/run_device.h: its device and GEMM precision).
  static MfuPeak find(const DeviceOptions& device, const RunSetup& setup);
  // Model FLOPs per second over what `ranks` ranks could do.
  double mfu(double flops, double seconds, int ranks) const { return flops / seconds / (gflops * 1e9 * ranks); }
  StepRecord::MfuPeak record() const { return {gflops, precision, source}; }
  // For the run's header: "fp32 GEMM" / "oneDNN bf16 GEMM", and who gave the figure.
  std::string describe(bool cpu_bf16) const;
};

}  // namespace moe::train
