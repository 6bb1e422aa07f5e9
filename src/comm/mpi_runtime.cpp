// MPI init/finalize. See mpi_runtime.h.
#include "comm/mpi_runtime.h"

#include <mpi.h>

#include <cstdlib>

#include "core/error.h"

namespace moe::comm {

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  MOE_CHECK(!fin, "MpiRuntime: MPI was already finalised; it cannot be initialised again");
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
  if (!owns_) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Finalize();
}

int MpiRuntime::world_rank() const {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int MpiRuntime::world_size() const {
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
