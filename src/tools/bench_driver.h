// What every moetrain benchmark and calibration shares, in nccl-tests' conventions: message sizes
// swept from -b to -e by a factor -f, warm-up iterations untimed, each timed iteration's time
// taken as its slowest rank's, the median over iterations reported, and a command run on every
// MPI rank so that an error on one rank ends the whole job with one line naming that rank.
// (Each benchmark's own table and --json rows stay with it: their columns differ.)
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/group.h"

namespace moe::tools {

// Median of v (the mean of the middle two for an even count); v must not be empty.
double median(std::vector<double> v);

// Each iteration's slowest rank (an all-reduce max over the group, in place), then their median.
double slowest_rank_median(const comm::Group& group, std::vector<double> per_iteration);

// lo, lo*factor, lo*factor^2, ... up to hi (inclusive, to a relative 1e-9); just lo when lo == hi.
std::vector<double> size_sweep(double lo, double hi, double factor);

// "4096", "64K", "8M", "1G" -> bytes (binary units); the error names the flag and the text.
// Sizes beyond 1 TiB per rank are refused.
int64_t parse_size(const std::string& flag, const std::string& text);

// Starts MPI, runs body(world) and returns 0. An error is printed as "PROGRAM: error: ..." with
// exit code 1 on a world of one; on more ranks as "PROGRAM: error (rank r of n): ..." and every
// rank is stopped (the others may be waiting in a collective).
int run_on_ranks(int* argc, char*** argv, const char* program,
                 const std::function<void(comm::Group& world)>& body);

}  // namespace moe::tools
