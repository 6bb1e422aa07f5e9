// The MoE layer's step clock: wall seconds of each named step of moe_forward / moe_backward
// (route, layout, dispatch, experts, combine, ...), added up into the recorder a layer's MoeConfig
// names (moe_layer.h's step_times). train --profile and bench moe-layer --breakdown read it.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "kernels/swiglu_mlp.h"

namespace moe::mixture {

// Wall seconds of each named step of moe_forward / moe_backward, added up while a layer names it
// (benchmarks and profiling only).
// experts/experts_bwd include expert_parts (the routed experts' GEMMs and SwiGLU elementwise,
// kernels::MlpStepTimes); buffers/buffers_bwd are the expert-row buffers' allocation and zeroing
// (forward: outside dispatch; backward: the scratch rows of combine', experts' and dispatch').
struct MoeStepTimes {
  double route = 0, layout = 0, buffers = 0, dispatch = 0, experts = 0, combine = 0,
         shared = 0;  // forward
  double route_bwd = 0, dispatch_bwd = 0, experts_bwd = 0, combine_bwd = 0, shared_bwd = 0,
         buffers_bwd = 0;
  kernels::MlpStepTimes expert_parts;
  // --comm.overlap (moe_layer.h): the shared experts' work done on a second thread beside the
  // token exchange, and the exchange time it hid (per overlap window, the smaller of the window's
  // exchange wall time and the work's). Neither is in forward()/backward(), which are the calling
  // thread's time; what of the work the exchange did not cover is in shared and shared'.
  double overlap_work = 0, a2a_hidden = 0;
  double forward() const { return route + layout + buffers + dispatch + experts + combine + shared; }
  double backward() const {
    return route_bwd + dispatch_bwd + experts_bwd + combine_bwd + shared_bwd + buffers_bwd;
  }
};
// Every step and expert part by name ("route", ..., "gate+up gemm", ..., "route'"), in step
// order, in milliseconds: the breakdown's rows (bench moe-layer --breakdown, train --profile).
std::vector<std::pair<std::string, double>> moe_step_times_ms(const MoeStepTimes& times);
// a += b, field by field.
void add_step_times(MoeStepTimes& a, const MoeStepTimes& b);

// Every step's field (and the expert parts), as named in the breakdown, in step order; an expert
// part's name is indented by two spaces.
struct NamedStep {
  const char* name;
  double MoeStepTimes::*field;
  double kernels::MlpStepTimes::*part;  // set for an expert part (field is then null)
};
const std::vector<NamedStep>& named_steps();
double step_seconds(const MoeStepTimes& t, const NamedStep& s);
double& step_field(MoeStepTimes& t, const NamedStep& s);

}  // namespace moe::mixture
