// Figures of one step gathered over the ranks: means over the data ranks, and each pipeline
// stage's figures from its slowest rank (the metrics' "stages", StageStats in train/trainer.h).
#pragma once
#include <vector>

#include "comm/traffic.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "parallel/pipeline.h"
#include "train/step_record.h"
#include "train/trainer.h"

namespace moe::train {

// Mean over the tokens group (every rank of a stage holds as many tokens) of one value per rank.
double data_mean(const parallel::Grid& g, double v);

// The global batch's losses from this rank's micro-batch means: averaged over the ranks of a
// stage and summed over the stages (ce lives on the last stage, each stage has its own layers' aux
// losses); total = ce + aux. The same on every rank.
model::LossParts global_loss(const parallel::Grid& g, model::LossParts stage);

// Per-stage figures of a step: the worst rank of each stage (collective over the world).
// a2a_by_rank: each world rank's own exchange seconds (a slow node shows in its ranks').
std::vector<StageStats> gather_stage_stats(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                           double a2a_seconds, model::Model& model,
                                           std::vector<double>& a2a_by_rank);

// A step's exchange and pipeline figures over the ranks (collective over the world).
struct StepFigures {
  std::vector<int64_t> bytes;          // exchange bytes by link class, summed over the world
  std::vector<double> dispatch_bytes;  // per world rank: its largest micro-batch's (model.h: moe_dispatch_bytes)
  std::vector<StageStats> stages;      // each stage's slowest rank
  double a2a_s = 0, bubble = 0;        // the worst stage's exchange seconds and wait / step time
  std::vector<double> a2a_by_rank;     // each world rank's exchange seconds
};
StepFigures gather_step_figures(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                const comm::TrafficStats& traffic, model::Model& model, double dispatch_bytes);
// Their fields of the metrics line: bubble_fraction, time_s.all_to_all, a2a_rank_s, a2a_bytes,
// moe_dispatch_bytes, stages (layers_per_stage: the decoder layers of each).
void add_to_record(const StepFigures& f, const std::vector<int>& layers_per_stage, StepRecord& rec);

}  // namespace moe::train
