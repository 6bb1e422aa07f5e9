#include "train/mfu_peak.h"

#include "kernels/gemm.h"
#include "kernels/peak_rate.h"

namespace moe::train {

MfuPeak MfuPeak::find(const DeviceOptions& device, const RunSetup& setup) {
  MfuPeak p;
  p.precision = name(setup.precision);
  p.source = device.peak_gflops > 0 ? "--peak-gflops" : "measured";
  // clang-format off
  if (device.peak_gflops > 0)
    p.gflops = device.peak_gflops;
  else
#ifdef MOETRAIN_HAVE_CUDA
  if (setup.device == Device::kCuda)
    p.gflops = kernels::cuda::measure_gemm_gflops(4096, 3, setup.precision == Precision::kBf16);
  else
#endif
  if (setup.auto_fp32_peak > 0)  // --precision auto measured both already
    p.gflops = setup.precision == Precision::kBf16 ? setup.auto_bf16_peak : setup.auto_fp32_peak;
  else
    p.gflops = kernels::measure_peak_gflops(setup.precision);
  // clang-format on
  return p;
}

std::string MfuPeak::describe(bool cpu_bf16) const {
  return str_cat(cpu_bf16 ? std::string("oneDNN bf16") : precision, " GEMM",
                 source == "measured" ? std::string() : str_cat(", given by ", source));
}

}  // namespace moe::train
