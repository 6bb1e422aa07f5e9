// The MoE layer's step clock. See step_times.h.
#include "moe/step_times.h"

namespace moe::mixture {

// Every step's field (and the expert parts), as named in the breakdown, in step order.
const std::vector<NamedStep>& named_steps() {
  using S = MoeStepTimes;
  using P = kernels::MlpStepTimes;
  // clang-format off
  static const std::vector<NamedStep> steps = {
      {"route", &S::route, nullptr},          {"layout", &S::layout, nullptr},
      {"buffers", &S::buffers, nullptr},      {"dispatch", &S::dispatch, nullptr},
      {"experts", &S::experts, nullptr},      {"  gate+up gemm", nullptr, &P::gate_up},
      {"  swiglu", nullptr, &P::swiglu},      {"  down gemm", nullptr, &P::down},
      {"combine", &S::combine, nullptr},      {"shared", &S::shared, nullptr},
      {"buffers'", &S::buffers_bwd, nullptr}, {"shared'", &S::shared_bwd, nullptr},
      {"combine'", &S::combine_bwd, nullptr}, {"experts'", &S::experts_bwd, nullptr},
      {"  down' gemms", nullptr, &P::down_bwd}, {"  swiglu'", nullptr, &P::swiglu_bwd},
      {"  gate+up' gemms", nullptr, &P::gate_up_bwd}, {"dispatch'", &S::dispatch_bwd, nullptr},
      {"route'", &S::route_bwd, nullptr},     {"shared beside a2a", &S::overlap_work, nullptr},
      {"a2a hidden", &S::a2a_hidden, nullptr}};
  // clang-format on
  return steps;
}
double step_seconds(const MoeStepTimes& t, const NamedStep& s) {
  return s.field ? t.*s.field : t.expert_parts.*s.part;
}

double& step_field(MoeStepTimes& t, const NamedStep& s) {
  return s.field ? t.*s.field : t.expert_parts.*s.part;
}

std::vector<std::pair<std::string, double>> moe_step_times_ms(const MoeStepTimes& t) {
  std::vector<std::pair<std::string, double>> out;
  for (const NamedStep& s : named_steps()) {
    std::string name = s.name;
    name.erase(0, name.find_first_not_of(' '));
    out.emplace_back(name, step_seconds(t, s) * 1e3);
  }
  return out;
}

void add_step_times(MoeStepTimes& a, const MoeStepTimes& b) {
  for (const NamedStep& s : named_steps()) step_field(a, s) += step_seconds(b, s);
}

}  // namespace moe::mixture
