#include "train/step_figures.h"

#include <algorithm>

#include "parallel/schedule.h"

namespace moe::train {

double data_mean(const parallel::Grid& g, double v) {
  if (g.tokens.size() > 1) g.tokens.allreduce_sum(&v, 1);
  return v / g.tokens.size();
}

model::LossParts global_loss(const parallel::Grid& g, model::LossParts loss) {
  loss.ce = data_mean(g, loss.ce);
  loss.aux = data_mean(g, loss.aux);
  loss.mtp = data_mean(g, loss.mtp);
  if (g.pp.size() > 1) {
    // (the MTP module and its weight live on the last stage: the sum over stages is its value)
    double parts[4] = {loss.ce, loss.aux, loss.mtp, loss.mtp_weight};
    g.pp.allreduce_sum(parts, 4);
    loss.ce = parts[0];
    loss.aux = parts[1];
    loss.mtp = parts[2];
    loss.mtp_weight = parts[3];
  }
  loss.total = loss.ce + loss.aux + loss.mtp_weight * loss.mtp;
  return loss;
}

std::vector<StageStats> gather_stage_stats(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                           double a2a_seconds, model::Model& model,
                                           std::vector<double>& a2a_by_rank) {
  const int kStat = 7;
  std::vector<double> mine = {pt.compute_s, pt.wait_s, a2a_seconds, pt.total_s,
                              static_cast<double>(model.activation_memory().peak()),
                              static_cast<double>(model.total_memory().peak()),
                              static_cast<double>(pt.max_in_flight)};
  std::vector<double> everyone(static_cast<size_t>(kStat) * grid.world.size());
  if (grid.world.size() > 1)
    grid.world.allgather(mine.data(), everyone.data(), kStat);
  else
    everyone = mine;
  std::vector<StageStats> stages(grid.dims.pp);
  a2a_by_rank.assign(grid.world.size(), 0.0);
  for (int r = 0; r < grid.world.size(); ++r) {
    StageStats& st = stages[parallel::coords_of(grid.dims, r).pp];
    const double* v = everyone.data() + static_cast<size_t>(r) * kStat;
    a2a_by_rank[r] = v[2];
    st.compute_s = std::max(st.compute_s, v[0]);
    st.bubble_s = std::max(st.bubble_s, v[1]);
    st.a2a_s = std::max(st.a2a_s, v[2]);
    st.step_s = std::max(st.step_s, v[3]);
    st.activation_peak_bytes = std::max(st.activation_peak_bytes, v[4]);
    st.total_peak_bytes = std::max(st.total_peak_bytes, v[5]);
    st.max_in_flight = std::max(st.max_in_flight, static_cast<int>(v[6]));
  }
  return stages;
}

StepFigures gather_step_figures(const parallel::Grid& grid, const parallel::PipelineTimes& pt,
                                const comm::TrafficStats& traffic, model::Model& model, double dispatch_bytes) {
  StepFigures f;
  for (int c = 0; c < comm::kNumLinkClasses; ++c) f.bytes.push_back(static_cast<int64_t>(traffic.bytes[c]));
  if (grid.world.size() > 1) grid.world.allreduce_sum(f.bytes.data(), static_cast<int64_t>(f.bytes.size()));
  f.stages = gather_stage_stats(grid, pt, traffic.seconds, model, f.a2a_by_rank);
  for (const StageStats& st : f.stages) {
    f.a2a_s = std::max(f.a2a_s, st.a2a_s);
    f.bubble = std::max(f.bubble, st.step_s > 0 ? st.bubble_s / st.step_s : 0.0);
  }
  f.dispatch_bytes.assign(grid.world.size(), dispatch_bytes);
  if (grid.world.size() > 1) grid.world.allgather(&dispatch_bytes, f.dispatch_bytes.data(), 1);
  return f;
}

void add_to_record(const StepFigures& f, const std::vector<int>& layers_per_stage, StepRecord& rec) {
  rec.bubble_fraction = f.bubble;
  rec.time_s.all_to_all = f.a2a_s;
  rec.a2a_rank_s = f.a2a_by_rank;
  for (int c = 0; c < 4; ++c) rec.a2a_bytes[c] = static_cast<double>(f.bytes[c]);
  rec.moe_dispatch_bytes = f.dispatch_bytes;
  for (size_t i = 0; i < f.stages.size(); ++i) {
    const StageStats& st = f.stages[i];
    rec.stages.push_back({static_cast<int>(i), static_cast<double>(layers_per_stage[i]), st.compute_s, st.bubble_s,
                          st.a2a_s, st.step_s, st.activation_peak_bytes, st.total_peak_bytes,
                          static_cast<double>(st.max_in_flight)});
  }
}

}  // namespace moe::train
