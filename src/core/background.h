// One piece of work on a second thread while the caller goes on: how a MoE layer computes its
// shared experts while its token exchange is on the network (moe/moe_layer.cpp). MPI stays on the
// calling thread (the process asks for MPI_THREAD_FUNNELED); the work must not communicate,
// allocate from a tracker the caller uses meanwhile, or touch what the caller writes.
#pragma once
#include <exception>
#include <functional>
#include <thread>
#include <utility>

#include "core/timer.h"

namespace moe {

class BackgroundWork {
 public:
  // Starts fn on a new thread.
  explicit BackgroundWork(std::function<void()> fn)
      : thread_([this, f = std::move(fn)] {
          const double t0 = now_seconds();
          try {
            f();
          } catch (...) {
            error_ = std::current_exception();
          }
          seconds_ = now_seconds() - t0;
        }) {}
  // Waits for the work; rethrows what it threw. Returns the work's own wall seconds.
  double join() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return seconds_;
  }
  // A caller that leaves by an exception still waits (the work reads the caller's buffers).
  ~BackgroundWork() {
    if (thread_.joinable()) thread_.join();
  }
  BackgroundWork(const BackgroundWork&) = delete;
  BackgroundWork& operator=(const BackgroundWork&) = delete;

 private:
  std::exception_ptr error_;
  double seconds_ = 0;
  std::thread thread_;  // last: starts once error_ and seconds_ exist
};

}  // namespace moe
