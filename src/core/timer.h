// Wall-clock timing for the progress line, metrics and benchmarks.
// Under SimGrid SMPI (-DMOETRAIN_SMPI=ON) the clock is the simulated one: steady_clock would
// read the host's time, which says nothing about the simulated network.
#pragma once
#include <chrono>
#ifdef MOETRAIN_SMPI
#include <mpi.h>
#endif

namespace moe {

inline double now_seconds() {
#ifdef MOETRAIN_SMPI
  return MPI_Wtime();
#else
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
#endif
}

// Adds the time between construction and destruction to a running total: { ScopedTimer t(acc); ... }
class ScopedTimer {
 public:
  explicit ScopedTimer(double& total) : total_(total), start_(now_seconds()) {}
  ~ScopedTimer() { total_ += now_seconds() - start_; }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& total_;
  double start_;
};

}  // namespace moe
