// The simulated step's result. See step_report.h.
#include "tools/smpi/step_report.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "parallel/parallel_dims.h"

namespace moe::smpi {
namespace {
constexpr int kFields = 8;

void pack(const StepTimes& t, double* v) {
  const double f[kFields] = {t.step, t.compute, t.a2a, t.p2p, t.allreduce, t.optimizer,
                             static_cast<double>(t.wrong), static_cast<double>(t.exchanges)};
  for (int i = 0; i < kFields; ++i) v[i] = f[i];
}

StepTimes unpack(const double* v) {
  StepTimes t;
  t.step = v[0];
  t.compute = v[1];
  t.a2a = v[2];
  t.p2p = v[3];
  t.allreduce = v[4];
  t.optimizer = v[5];
  t.wrong = static_cast<int64_t>(v[6]);
  t.exchanges = static_cast<int64_t>(v[7]);
  return t;
}
}  // namespace

StepResult gather_step(const StepSpec& sp, const comm::Group& world, const StepTimes& mine, double overhead_us) {
  const int n = world.size();
  double v[kFields];
  pack(mine, v);
  std::vector<double> all(static_cast<size_t>(n) * kFields);
  world.allgather(v, all.data(), kFields);
  StepResult r;
  r.spec = &sp;
  r.ranks = n;
  r.overhead_us = overhead_us;
  for (int i = 0; i < n; ++i) {
    const StepTimes t = unpack(&all[static_cast<size_t>(i) * kFields]);
    r.wrong += t.wrong;
    r.exchanges += t.exchanges;
    if (i == 0 || t.step > r.slowest.step) {
      r.slowest = t;
      r.slowest_rank = i;
    }
  }
  const parallel::ParallelDims d{sp.layout.pp, sp.layout.dp, sp.layout.ep, sp.layout.tp};
  const int stage = parallel::coords_of(d, r.slowest_rank).pp;
  r.grad_predicted_s = sp.stages[stage].grad_predicted_s;
  const plan::StageTime& st = sp.predicted.stages[stage];
  r.compute_predicted_s = sp.layout.micro_batches * (st.fwd_compute + st.bwd_compute);
  const double tokens = static_cast<double>(sp.shape.global_batch) * sp.shape.seq_len;
  r.tokens_per_s = r.slowest.step > 0 ? tokens / r.slowest.step : 0;
  return r;
}

std::string step_json(const StepResult& r) {
  const StepSpec& sp = *r.spec;
  const StepTimes& t = r.slowest;
  const plan::TimeBreakdown& p = sp.predicted;
  nlohmann::json j;
  j["benchmark"] = "step";
  j["ranks"] = r.ranks;
  j["model"] = sp.model.name;
  j["cluster"] = sp.cluster.name;
  j["layout"] = sp.layout.describe();
  j["layout_source"] = sp.searched ? "planner search" : "given";
  j["seq_len"] = sp.shape.seq_len;
  j["global_batch"] = sp.shape.global_batch;
  j["tokens_per_rank"] = static_cast<double>(sp.shape.global_batch) * sp.shape.seq_len / r.ranks;
  j["micro_batch_tokens"] = sp.rank.tokens;
  j["msg_overhead_us"] = r.overhead_us;
  // clang-format off
  j["simulated"] = {{"step_s", t.step},           {"compute_s", t.compute},     {"a2a_s", t.a2a},
                    {"p2p_wait_s", t.p2p},        {"allreduce_s", t.allreduce}, {"optimizer_s", t.optimizer},
                    {"slowest_rank", r.slowest_rank}, {"tokens_per_s", r.tokens_per_s}};
  j["predicted"] = {{"step_s", p.step},           {"compute_s", p.compute},     {"a2a_s", p.a2a},
                    {"p2p_s", p.p2p},             {"bubble_s", p.bubble},       {"allreduce_s", p.allreduce},
                    {"optimizer_s", p.optimizer}, {"tokens_per_s", p.tokens_per_s},
                    {"allreduce_stage_s", r.grad_predicted_s}, {"compute_stage_s", r.compute_predicted_s}};
  // clang-format on
  j["exchanges"] = r.exchanges;
  j["wrong"] = r.wrong;
  return j.dump(2);
}

std::string step_table(const StepResult& r) {
  const StepSpec& sp = *r.spec;
  const StepTimes& t = r.slowest;
  const plan::TimeBreakdown& p = sp.predicted;
  std::ostringstream os;
  char line[256];
  os << "# moetrain smpi step: " << sp.model.name << " on " << r.ranks << " simulated ranks of " << sp.cluster.name
     << ", layout " << sp.layout.describe() << " (" << (sp.searched ? "the planner's search" : "given") << ")\n";
  os << "# seq " << sp.shape.seq_len << ", global batch " << sp.shape.global_batch << " sequences, "
     << sp.rank.tokens << " tokens per micro-batch; per-message overhead " << r.overhead_us << " us\n";
  std::snprintf(line, sizeof line, "%-10s %10s %10s %10s %10s %10s %10s %12s\n", "", "step(s)", "compute",
                "a2a", "p2p+bubble", "allreduce", "optimizer", "tokens/s");
  os << line;
  std::snprintf(line, sizeof line, "%-10s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %12.4g\n", "simulated", t.step,
                t.compute, t.a2a, t.p2p, t.allreduce, t.optimizer, r.tokens_per_s);
  os << line;
  std::snprintf(line, sizeof line, "%-10s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %12.4g\n", "planner", p.step,
                p.compute, p.a2a, p.p2p + p.bubble, p.allreduce, p.optimizer, p.tokens_per_s);
  os << line;
  os << "# slowest rank " << r.slowest_rank << "; its stage's all-reduces by the planner's ring model: "
     << r.grad_predicted_s << " s; exchanges run " << r.exchanges << ", #wrong counts " << r.wrong << "\n";
  return os.str();
}

}  // namespace moe::smpi
