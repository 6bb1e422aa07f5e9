// MPI init/finalize. See mpi_runtime.h.
#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace moe::comm {
namespace {
bool g_local_world = false;  // set while an MpiRuntime with local_ lives
}  // namespace

bool MpiRuntime::started_by_launcher() {
  // Open MPI's mpirun (ORTE, PRRTE), PMIx and PMI-1/2 launchers (srun, hydra), MVAPICH's mpirun_rsh.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMIX_NAMESPACE",
                          "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT", "MPI_LOCALRANKID",
                          "MV2_COMM_WORLD_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return true;
  }
  return false;
}

bool MpiRuntime::local_world() { return g_local_world; }

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  // MPI_Initialized and MPI_Finalized may be called at any time, before MPI_Init too (MPI 4.0,
  // section 11.2.1): they start nothing.
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  MOE_CHECK(!fin, "MpiRuntime: MPI was already finalised; it cannot be initialised again");
#ifndef MOETRAIN_SMPI
  const char* force = std::getenv("MOETRAIN_MPI_SINGLETON");
  if (!init && !started_by_launcher() && !(force && std::string(force) == "1")) {
    MOE_CHECK(!g_local_world, "MpiRuntime: a world of one is already alive");
    local_ = true;
    g_local_world = true;
    thread_level_ = MPI_THREAD_FUNNELED;
    return;
  }
#endif
  if (!init) {
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) throw Error(str_cat("MPI_Init_thread failed (error code ", rc, ")"));
    owns_ = true;
    thread_level_ = provided;
  } else {
    MPI_Query_thread(&thread_level_);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
}

MpiRuntime::~MpiRuntime() {
  if (local_) g_local_world = false;
  if (!owns_) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

int MpiRuntime::world_rank() const {
  if (local_) return 0;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiRuntime::world_size() const {
  if (local_) return 1;
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

bool MpiRuntime::initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void MpiRuntime::abort(int exit_code) {
  if (initialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::exit(exit_code);
}

}  // namespace moe::comm
