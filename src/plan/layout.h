// One candidate parallel layout and the training shape it runs: the vocabulary shared by the
// memory model, the time model, the search and the CLI (`--layout "pp=2,ep=2,mb=4,..."`).
#pragma once
#include <string>
#include <vector>

#include "parallel/schedule.h"

namespace moe::plan {

struct Layout {
  int pp = 1, dp = 1, ep = 1, tp = 1;
  int micro_batches = 1;  // M
  Recompute recompute = Recompute::kNone;
  A2a a2a = A2a::kFlat;
  bool zero1 = false;  // optimizer state sharded over the data ranks
  Schedule schedule = Schedule::k1F1B;

  int world() const { return pp * dp * ep * tp; }
  int data_ranks() const { return dp * ep; }  // ranks that read their own share of the batch
  std::string describe() const;               // "pp=2,dp=1,ep=2,tp=1,mb=4,recompute=moe,a2a=flat"
};

// "pp=2,ep=2,dp=1,mb=4,recompute=moe,a2a=flat" (keys: pp dp ep tp mb|micro-batches recompute a2a
// zero1 schedule; missing keys keep their defaults). Errors name the key or value at fault.
Layout parse_layout(const std::string& text);

struct TrainShape {
  int seq_len = 0;                         // s (tokens per sequence)
  long long global_batch = 0;              // sequences per optimizer step, all data ranks together
  Precision precision = Precision::kBf16;  // bf16 (mixed precision: 16 B/param, 2 B activations) | fp32
};

// The per-rank numbers a layout implies for a shape. Errors name the numbers that do not divide.
struct RankShape {
  long long batch_per_rank = 0;  // b = global / (dp · ep)   (sequences; `train --batch`)
  long long micro_batch = 0;     // b / M sequences
  long long tokens = 0;          // N = micro_batch · s tokens per micro-batch
};
RankShape rank_shape(const Layout& l, const TrainShape& s);

// Layers of each stage: an even split, the remainder on the first stages (as the trainer).
std::vector<int> split_stages(int layers, int pp);

// The ops of one stage of a pipeline schedule: parallel/schedule.h's, which
// the executor runs. pipeline_buffer_slots: the number of activation-sized pipeline buffers that
// stage's executor allocates (parallel/pipeline.cpp's dry pass over the same ops, reproduced here
// because plan/ does not link the communication layer; a unit test holds the two equal).
using PipeOpSpec = parallel::PipeOp;
using parallel::max_in_flight;
std::vector<PipeOpSpec> schedule_ops(Schedule schedule, int num_stages, int stage, int M);
int pipeline_buffer_slots(Schedule schedule, int num_stages, int stage, int M);

}  // namespace moe::plan
