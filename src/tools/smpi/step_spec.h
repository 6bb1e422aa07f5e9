// The simulated training step's work, from the planner (moetrain_smpi_step, SMPI build): for a
// model, a cluster profile, a world size and tokens per rank, the layout (given, or the planner's
// own search's best), and for every pipeline stage what one rank of it computes and sends in one
// step, priced by the same time model that `moetrain plan` prints (plan/time_model.h):
//   per layer and micro-batch  the compute of its attention and FFN passes, forward and backward
//                              (estimate_time's per-stage compute, split over the stage's layers
//                              in proportion to each layer's own passes: the embedding, head and
//                              recomputation go with them), and for an MoE layer its exchanges
//   per step                   the gradient all-reduces, one per contiguous span of one kind
//                              (replicated tensors over the data group, routed experts over dp:
//                              parallel/grid.cpp's calls, the planner's gradient_sync), and the
//                              optimizer's time for the stage's local parameters
// Tensor parallelism is refused (the step runs PP x DP x EP layouts; the search runs with tp = 1).
#pragma once
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/plan_model.h"
#include "plan/time_model.h"

namespace moe::smpi {

struct StepRequest {
  std::string model = "xmoe-small";  // a planner preset or a Hugging Face config.json
  std::string cluster = "frontier";  // the profile matching the simulated platform
  int world = 0;                     // ranks
  long long tokens_per_rank = 0;     // global tokens per step / world (weak scaling: fixed)
  int seq_len = 0;                   // 0: the model's training length
  std::string layout;                // "pp=..,dp=..,ep=..,mb=..,a2a=.." or empty: the search's best
  // >= 0: the profile's per-message time of every link class, for the search and the prediction
  // (the simulated platform's: both ends' overhead); < 0: the profile's own.
  double per_message_s = -1;
};

// One layer's injected compute per micro-batch (seconds on one rank).
struct LayerWork {
  bool moe = false;
  double attn_fwd = 0, ffn_fwd = 0, attn_bwd = 0, ffn_bwd = 0;
};

// One gradient all-reduce: `bytes` per rank over the dp group (routed experts) or the data group.
struct GradCall {
  bool experts = false;
  double bytes = 0;
};

struct StageSpec {
  int first_layer = 0;
  std::vector<LayerWork> layers;
  std::vector<GradCall> grads;  // in the order the trainer issues them
  double grad_predicted_s = 0;  // the planner's ring time of these calls
  double optimizer_s = 0;
};

struct StepSpec {
  plan::PlanModel model;
  plan::ClusterProfile cluster;
  plan::Layout layout;
  plan::TrainShape shape;
  plan::RankShape rank;   // per data rank: sequences, micro-batch, tokens N
  bool searched = false;  // the layout is the planner's choice (else given)
  int row_floats = 0;     // an exchanged row's bytes / 4: H activation elements
  double p2p_floats = 0;  // a pipeline message (N x H activations) / 4 bytes
  std::vector<StageSpec> stages;
  plan::TimeBreakdown predicted;  // the planner's step
};

// Throws moe::Error naming the option at fault (tokens that do not make whole sequences, a layout
// that does not fit the world, tp > 1, a model the planner refuses).
StepSpec make_step_spec(const StepRequest& r);

}  // namespace moe::smpi
