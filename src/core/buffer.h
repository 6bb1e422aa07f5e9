// Owned, 64-byte aligned arrays whose bytes are counted by a MemTracker. Activations kept for
// backward live in Buffers charged to the model's activation tracker, so the peak bytes held are an
// exact high-water mark, not an estimate (the planner's memory model is checked against it).
// A Buffer lives on a Device (host by default) and allocates through core/device.h, so host and
// GPU bytes are charged alike; element access (operator[]) is for host buffers only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/device.h"
#include "core/error.h"

namespace moe {

// Bytes currently held and the high-water mark of one class of memory (activations, params, ...).
// A tracker may have a parent that sees every byte too (e.g. activations and workspace both
// count toward a rank's total), so the parent's peak is the exact peak of the sum.
class MemTracker {
 public:
  explicit MemTracker(MemTracker* parent = nullptr) : parent_(parent) {}
  void set_parent(MemTracker* parent) { parent_ = parent; }
  // Moves this tracker, with the bytes it holds now, under another parent (nullptr: none).
  void reparent(MemTracker* parent) {
    if (parent_) parent_->sub(current_);
    parent_ = parent;
    if (parent_) parent_->add(current_);
  }
  MemTracker* parent() const { return parent_; }
  void add(size_t bytes) {
    current_ += bytes;
    if (current_ > peak_) peak_ = current_;
    if (parent_) parent_->add(bytes);
  }
  void sub(size_t bytes) {
    current_ -= bytes;
    if (parent_) parent_->sub(bytes);
  }
  size_t current() const { return current_; }
  size_t peak() const { return peak_; }
  void reset_peak() { peak_ = current_; }

 private:
  MemTracker* parent_ = nullptr;
  size_t current_ = 0;
  size_t peak_ = 0;
};

template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n, MemTracker* tracker = nullptr, Device device = Device::kCpu) {
    resize(n, tracker, device);
  }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      tracker_ = std::exchange(o.tracker_, nullptr);
      device_ = std::exchange(o.device_, Device::kCpu);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Reallocates to n zeroed elements on `device` (contents are not kept). The element count is
  // checked before it becomes a byte count, so a wrapped size never reaches the allocator.
  void resize(size_t n, MemTracker* tracker = nullptr, Device device = Device::kCpu) {
    allocate(n, tracker, device, /*zeroed=*/true);
  }
  // The same for a buffer its first use writes whole (see device_alloc_uninit): no zeroing.
  void resize_for_overwrite(size_t n, MemTracker* tracker = nullptr, Device device = Device::kCpu) {
    allocate(n, tracker, device, /*zeroed=*/false);
  }
  void release() {
    if (data_) {
      device_free(device_, data_);
      if (tracker_) tracker_->sub(size_ * sizeof(T));
    }
    data_ = nullptr;
    size_ = 0;
  }
  // Moves this buffer's bytes from its tracker to another (e.g. workspace -> kept activations).
  void set_tracker(MemTracker* tracker) {
    if (tracker == tracker_) return;
    if (data_ && tracker_) tracker_->sub(bytes());
    tracker_ = tracker;
    if (data_ && tracker_) tracker_->add(bytes());
  }
  void zero() { device_memset_zero(device_, data_, size_ * sizeof(T)); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  Device device() const { return device_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  void allocate(size_t n, MemTracker* tracker, Device device, bool zeroed) {
    release();
    tracker_ = tracker;
    device_ = device;
    if (n == 0) return;
    MOE_CHECK(n <= (SIZE_MAX - 64) / sizeof(T), "buffer of ", n, " elements of ", sizeof(T),
              " bytes overflows a byte count");
    data_ = static_cast<T*>(zeroed ? device_alloc_zeroed(device, n * sizeof(T))
                                   : device_alloc_uninit(device, n * sizeof(T)));
    size_ = n;
    if (tracker_) tracker_->add(n * sizeof(T));
  }

  T* data_ = nullptr;
  size_t size_ = 0;
  MemTracker* tracker_ = nullptr;
  Device device_ = Device::kCpu;
};

}  // namespace moe
