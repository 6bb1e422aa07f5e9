// The MPI library's lifetime as an object: construct one at the top of main (before any Group),
// destroy it last. Under mpirun/srun it initialises MPI; a single process that no launcher started
// gets a world of one without MPI at all (no singleton PMIx server, no session files: a world of
// one needs neither, and Open MPI's singleton start aborts under a small `ulimit -f`). Groups of
// that world copy locally (comm/group.cpp) and make no MPI call. Errors on MPI_COMM_WORLD return
// codes instead of aborting, so every comm/ call can throw a moe::Error that names what failed.
#pragma once

namespace moe::comm {

class MpiRuntime {
 public:
  // MPI_Init_thread(MPI_THREAD_FUNNELED) unless MPI is already initialised (then this object
  // neither initialises nor finalises) or no launcher started this process (then: a world of one,
  // local_world() true, no MPI call). MOETRAIN_MPI_SINGLETON=1 in the environment initialises MPI
  // for a lone process anyway (Open MPI's singleton). The SMPI build always initialises.
  // argc/argv may be null.
  explicit MpiRuntime(int* argc = nullptr, char*** argv = nullptr);
  ~MpiRuntime();  // MPI_Finalize if this object initialised MPI
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  bool owns() const { return owns_; }                 // this object called MPI_Init and will finalise
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* provided
  int world_rank() const;
  int world_size() const;

  static bool initialized();  // MPI_Init done and MPI_Finalize not yet
  // An MpiRuntime is alive that chose a world of one without MPI (Group::world is then local).
  static bool local_world();
  // A launcher's variables are in the environment (mpirun, srun, hydra, mpiexec of MVAPICH).
  static bool started_by_launcher();
  // Ends every rank of the job (MPI_Abort on MPI_COMM_WORLD). For a fatal error on one rank of a
  // multi-rank run: the others would otherwise wait forever in their next collective.
  [[noreturn]] static void abort(int exit_code);

 private:
  bool owns_ = false;
  bool local_ = false;  // a world of one without MPI
  int thread_level_ = 0;
};

}  // namespace moe::comm
