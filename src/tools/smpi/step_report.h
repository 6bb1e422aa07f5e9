// moetrain_smpi_step's result: every rank's simulated times, the slowest rank's parts, and the
// planner's prediction of the same step beside them (JSON and a table).
#pragma once
#include <cstdint>
#include <string>

#include "comm/group.h"
#include "tools/smpi/step_spec.h"

namespace moe::smpi {

// One rank's simulated seconds in one step (MPI_Wtime). The parts are where the rank spent them:
//   compute    injected (the planner's compute of this rank's work)
//   a2a        inside the exchanges (plan, dispatch, combine, forward and backward): transfers
//              plus waiting for the slowest rank of the EP group (exposed: nothing overlaps)
//   p2p        waiting for pipeline messages (the transfer and the bubble)
//   allreduce  the gradient all-reduces; optimizer: injected
struct StepTimes {
  double step = 0, compute = 0, a2a = 0, p2p = 0, allreduce = 0, optimizer = 0;
  int64_t wrong = 0;      // plan counts that are not exact (must be 0)
  int64_t exchanges = 0;  // dispatches + combines this rank ran
};

struct StepResult {
  const StepSpec* spec = nullptr;
  int ranks = 0;
  double overhead_us = 0;
  StepTimes slowest;  // the rank whose step took longest
  int slowest_rank = 0;
  double grad_predicted_s = 0;     // the planner's ring time of the slowest rank's stage's all-reduces
  double compute_predicted_s = 0;  // the planner's compute of that stage: M x (fwd + bwd)
  int64_t wrong = 0;               // over all ranks
  int64_t exchanges = 0;           // over all ranks
  double tokens_per_s = 0;         // global tokens / simulated step
};

// Collective over `world`: every rank's times; the result is complete on every rank.
StepResult gather_step(const StepSpec& sp, const comm::Group& world, const StepTimes& mine, double overhead_us);
std::string step_json(const StepResult& r);
std::string step_table(const StepResult& r);

}  // namespace moe::smpi
