// Owned, 64-byte aligned arrays whose bytes are counted by a MemTracker. Activations kept for
// backward live in Buffers charged to the model's activation tracker, so the peak bytes held are an
// exact high-water mark, not an estimate (the planner's memory model is checked against it).
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"

namespace moe {

// Bytes currently held and the high-water mark of one class of memory (activations, params, ...).
// A tracker may have a parent that sees every byte too (e.g. activations and workspace both
// count toward a rank's total), so the parent's peak is the exact peak of the sum.
class MemTracker {
 public:
  explicit MemTracker(MemTracker* parent = nullptr) : parent_(parent) {}
  void set_parent(MemTracker* parent) { parent_ = parent; }
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
  explicit Buffer(size_t n, MemTracker* tracker = nullptr) { resize(n, tracker); }
  ~Buffer() { release(); }
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      tracker_ = std::exchange(o.tracker_, nullptr);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Reallocates to n zeroed elements (contents are not kept).
  void resize(size_t n, MemTracker* tracker = nullptr) {
    release();
    tracker_ = tracker;
    if (n == 0) return;
    size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
    size_ = n;
    if (tracker_) tracker_->add(n * sizeof(T));
  }
  void release() {
    if (data_) {
      std::free(data_);
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
  void zero() {
    if (data_) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  MemTracker* tracker_ = nullptr;
};

}  // namespace moe
