// Memory a training run will need, checked before anything large is allocated: the planner's
// memory model (plan/memory_model.h, built on the trainer's own size functions in
// model/memory_sizes.h) per rank, plus the data the trainer holds outside its trackers (the
// corpus bytes, the global batch and the held-out batches), against what this host has free.
// `moetrain train --batch 100000` then fails in milliseconds naming both numbers instead of
// ending in std::bad_alloc half a minute later.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace moe::train {

struct TrainOptions;

// Bytes one rank will hold, by kind (the breakdown the error message prints).
struct RankMemory {
  double state = 0;        // parameters + gradients + AdamW m and v
  double activations = 0;  // kept by the in-flight micro-batches + workspace peak + pipeline buffers
  double data = 0;         // corpus + global batch tokens + held-out batches
  double total() const { return state + activations + data; }
};

// One entry per world rank (`world_size` of them; each rank's pipeline stage decides its share).
// `corpus_bytes`: what the data loader keeps resident (io::corpus_resident_bytes: a text file
// whole; an mmapped indexed dataset only its per-sequence tables). Throws moe::Error when the layout and shape disagree.
std::vector<RankMemory> estimate_run_memory(const model::ModelConfig& cfg, const TrainOptions& opts,
                                            int world_size, double corpus_bytes);

// Memory this process may still use: MemAvailable (/proc/meminfo; sysconf's available pages
// where that is missing), lowered to the cgroup's limit minus its usage when that is smaller.
struct AvailableMemory {
  double bytes = 0;
  std::string source;  // "MemAvailable in /proc/meminfo", "cgroup memory.max - memory.current", ...
};
AvailableMemory available_memory();

// Throws moe::Error when the ranks placed on this host (`ranks_here`, world ranks) need more than
// `avail`: "not enough memory on HOST: this run needs X (...), Y available (source)". The test
// hook MOETRAIN_MEMORY_AVAILABLE (bytes) replaces the measured figure.
void check_memory_fits(const std::vector<RankMemory>& per_rank, const std::vector<int>& ranks_here,
                       const AvailableMemory& avail, const TrainOptions& opts);

// "41.3 GB" / "812.0 MB" / "4.0 KB" (powers of 10, as free(1) -h --si).
std::string format_bytes(double bytes);

}  // namespace moe::train
