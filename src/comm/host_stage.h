// A host view of a buffer that may live on the GPU, for the MPI paths of comm/ (MPI here is not
// CUDA-aware, and the exchange packs rows on the host): the buffer itself when it is host memory;
// otherwise a host copy, filled from the device when asked, and written back by store(). Which one
// is decided by the pointer (device_of), so callers pass device buffers as they pass host ones.
// Internal to comm/.
#pragma once
#include <cstddef>
#include <memory>

#include "core/device.h"

namespace moe::comm {

class HostStage {
 public:
  // `bytes` from `p`; fill: copy the device bytes to the host copy now (inputs, and outputs that
  // are accumulated into). Host memory (or bytes == 0) is used in place and never copied.
  HostStage(const void* p, size_t bytes, bool fill) : dev_(const_cast<void*>(p)), bytes_(bytes) {
    if (bytes == 0 || device_of(p) != Device::kCuda) return;
    host_.reset(new char[bytes]);
    if (fill) device_copy(Device::kCpu, host_.get(), Device::kCuda, p, bytes);
  }
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

  bool staged() const { return host_ != nullptr; }
  void* get() const { return host_ ? static_cast<void*>(host_.get()) : dev_; }
  template <class T>
  T* as() const { return static_cast<T*>(get()); }
  // The host copy back to the device buffer (outputs); nothing for host memory.
  void store() const {
    if (host_) device_copy(Device::kCuda, dev_, Device::kCpu, host_.get(), bytes_);
  }

 private:
  void* dev_;
  size_t bytes_;
  std::unique_ptr<char[]> host_;
};

}  // namespace moe::comm
