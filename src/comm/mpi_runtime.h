// The MPI library's lifetime as an object: construct one at the top of main (before any Group),
// destroy it last. Works under mpirun/srun and as a single process started without a launcher
// (Open MPI singleton). Errors on MPI_COMM_WORLD return codes instead of aborting, so every comm/
// call can throw a moe::Error that names what failed.
#pragma once

namespace moe::comm {

class MpiRuntime {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED) unless MPI is already initialised (then this object
  // neither initialises nor finalises). argc/argv may be null.
  explicit MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~MpiRuntime();  // MPI_Finalize if this object initialised MPI
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  bool owns() const { return owns_; }  // this object called MPI_Init and will finalise
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided
  int world_rank() const;
  int world_size() const;

  static bool initialized();  // MPI_Init done and MPI_Finalize not yet
  // Ends every rank of the job (MPI_Abort on MPI_COMM_WORLD). For a fatal error on one rank of a
  // multi-rank run: the others would otherwise wait forever in their next collective.
  [[noreturn]] static void abort(int exit_code);

 private:
  bool owns_ = false;
  int thread_level_ = 0;
};

}  // namespace moe::comm
