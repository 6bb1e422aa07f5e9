// The device mode of the op table (op_table.h): host <-> device copies and the Checker that
// compares a CUDA kernel's outputs with the CPU kernel's. Only moetrain_cuda_tests includes it
// (it compiles op_table.cpp with MOETRAIN_OP_DEVICE); no GoogleTest. Error = normalised mean
// squared error (ggml's NMSE), nmse = Σ (gpu - cpu)² / Σ cpu², the bound stated per check; index
// outputs must match exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "test_inputs.h"
#include "kernels/attention.h"
#include "kernels/cuda/context.h"
#include "kernels/gemm.h"
#include "kernels/device_select.h"

namespace moe::ops {

template <class T>
Buffer<T> dev(const std::vector<T>& h) {
  Buffer<T> b(h.size(), nullptr, Device::kCuda);
  device_copy(Device::kCuda, b.data(), Device::kCpu, h.data(), h.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> host(const Buffer<T>& b) {
  kernels::cuda::synchronize("test_cuda_ops");
  std::vector<T> h(b.size());
  device_copy(Device::kCpu, h.data(), Device::kCuda, b.data(), b.bytes());
  return h;
}

using test_util::uniform;  // tests/test_inputs.h

// The kernels of one scope on `device` with the GEMM precision: an execution context of their own
// (kernels/exec_context.h); when the scope ends, an exception included, the thread is back on the
// context it had before (a failed check must not leave the next case on the device).
class DeviceScope {
 public:
  DeviceScope(Device device, bool bf16) : ctx_(device, bf16), on_(ctx_) {}
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  kernels::ExecContext ctx_;
  kernels::ContextScope on_;
};

// The CUDA attention's saved state is sized by the CUDA path of attention_saved_floats.
inline size_t cuda_saved_floats(int B, int T, int nh, int hd) {
  const DeviceScope on_device(Device::kCuda, false);
  return kernels::attention_saved_floats(B, T, nh, hd);
}

struct Checker {
  double worst = 0.0;  // largest NMSE over the float outputs
  bool exact_ok = true;
  std::string note;

  void close(const char* what, const std::vector<float>& gpu, const std::vector<float>& cpu) {
    if (gpu.size() != cpu.size()) return mismatch(what, "size differs");
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      const double d = static_cast<double>(gpu[i]) - cpu[i];
      num += d * d;
      den += static_cast<double>(cpu[i]) * cpu[i];
    }
    record(what, den > 0.0 ? num / den : num);
  }
  void scalar(const char* what, double gpu, double cpu) {
    const double d = gpu - cpu;
    record(what, cpu != 0.0 ? d * d / (cpu * cpu) : d * d);
  }
  template <class T>
  void same(const char* what, const std::vector<T>& gpu, const std::vector<T>& cpu) {
    if (gpu.size() != cpu.size()) return mismatch(what, "size differs");
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < cpu.size(); ++i)
      if (!(gpu[i] == cpu[i]) && bad++ == 0) first = i;
    if (bad)
      mismatch(what,
               str_cat(bad, " differ, first [", first, "] gpu ", gpu[first], " cpu ", cpu[first]));
  }
  void mismatch(const char* what, const std::string& why) {
    exact_ok = false;
    note += str_cat(" ", what, ": ", why, ";");
  }

 private:
  void record(const char* what, double e) {
    if (!(e <= worst)) {  // NaN sticks
      worst = e;
      if (std::isnan(e)) note += str_cat(" ", what, ": NaN;");
    }
  }
};

}  // namespace moe::ops
