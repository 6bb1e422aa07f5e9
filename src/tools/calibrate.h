// `moetrain calibrate`: measures this machine for the planner and writes a cluster profile
// (plan/cluster.h). Run it once alone, then under mpirun at each rank count you plan for:
//   moetrain calibrate -o profile.json                          GEMM by (m, n, k) for the three
//       forms a linear layer uses, attention by (T, head_dim), memory-bound work per activation
//       element (a probe model's step minus its GEMM and attention time), optimizer per
//       parameter, sgemm peak, memory bandwidth
//   mpirun -np N moetrain calibrate --append -o profile.json    with N ranks sharing the machine:
//       per-rank compute speed (the same probe step on every rank at once, against one rank
//       alone), all-to-all (flat, rbd, halo) by size for every EP group size dividing N, p2p,
//       all-reduce by size and group
// Collective over MPI_COMM_WORLD; rank 0 writes the file.
#pragma once
#include <string>

namespace moe::train {

struct CalibrateOptions {
  std::string out = "profile.json";
  bool append = false;     // extend an existing profile with this rank count's measurements
  int ranks_per_node = 0;  // topology of the exchange benchmarks (0 = from the launcher)
  int nodes_per_group = 0;
  bool quick = false;   // small grids and few iterations (tests)
  int threads = 1;      // BLAS threads per rank
  bool verbose = true;  // summary on stderr
};

void run_calibrate(const CalibrateOptions& opts);

}  // namespace moe::train
