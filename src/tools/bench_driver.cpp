// The benchmarks' shared driver. See bench_driver.h.
#include "tools/bench_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include "comm/mpi_runtime.h"
#include "core/error.h"

namespace moe::tools {

double median(std::vector<double> v) {
  MOE_CHECK(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  return m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

double slowest_rank_median(const comm::Group& group, std::vector<double> per_iteration) {
  group.allreduce_max(per_iteration.data(), static_cast<int64_t>(per_iteration.size()));
  return median(std::move(per_iteration));
}

std::vector<double> size_sweep(double lo, double hi, double factor) {
  std::vector<double> sizes;
  for (double b = lo; b <= hi * (1 + 1e-9); b *= factor) {
    sizes.push_back(b);
    if (!(factor > 1)) break;
  }
  return sizes;
}

int64_t parse_size(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    throw Error(str_cat(flag, ": '", v, "' is not a size (e.g. 4096, 64K, 8M)"));
  }
  const std::string unit = v.substr(pos);
  const double mult = unit.empty()  ? 1
                      : unit == "K" ? 1024.0
                      : unit == "M" ? 1048576.0
                      : unit == "G" ? 1073741824.0
                                    : -1;
  MOE_CHECK(mult > 0 && std::isfinite(x) && x > 0, flag, ": '", v, "' is not a size (e.g. 4096, 64K, 8M)");
  MOE_CHECK(x * mult <= 1099511627776.0, flag, ": '", v, "' is beyond 1 TB per rank");
  return static_cast<int64_t>(x * mult);
}

int run_on_ranks(int* argc, char*** argv, const char* program,
                 const std::function<void(comm::Group& world)>& body) {
  comm::MpiRuntime mpi(argc, argv);
  try {
    comm::Group world = comm::Group::world();
    body(world);
  } catch (const std::exception& e) {
    if (mpi.world_size() == 1) {
      std::fprintf(stderr, "%s: error: %s\n", program, e.what());
      return 1;
    }
    std::fprintf(stderr, "%s: error (rank %d of %d): %s\n", program, mpi.world_rank(), mpi.world_size(), e.what());
    std::fflush(stderr);
    comm::MpiRuntime::abort(1);
  }
  return 0;
}

}  // namespace moe::tools
