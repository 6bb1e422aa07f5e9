// Shared by the multi-rank tests: a per-rank pass/fail counter with a CHECK macro that names the
// failed condition (the first 30 per rank), and the job-wide tally printed by rank 0.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "comm/group.h"
#include "core/error.h"

namespace moe::mpitest {

struct Checker {
  int rank = 0;
  int64_t passed = 0, failed = 0;
  void check(bool ok, const std::string& what) {
    if (ok) {
      ++passed;
    } else {
      ++failed;
      if (failed <= 30) std::fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what.c_str());
    }
  }
  // Sums the counts over `g`, rank 0 prints "P passed, F failed"; returns the exit code (0: none
  // failed anywhere).
  int report(const comm::Group& g) const {
    int64_t counts[2] = {passed, failed};
    g.allreduce_sum(counts, 2);
    if (g.rank() == 0)
      std::printf("%lld passed, %lld failed\n", static_cast<long long>(counts[0]), static_cast<long long>(counts[1]));
    return counts[1] == 0 ? 0 : 1;
  }
};

inline Checker ck;

}  // namespace moe::mpitest

#define CHECK(cond, ...) ::moe::mpitest::ck.check((cond), ::moe::str_cat(__VA_ARGS__))
