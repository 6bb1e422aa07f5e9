// The planner's measured-imbalance input (`moetrain plan --loads metrics.jsonl`): the expert
// compute and exchange of an expert-parallel layout are those of its busiest EP rank, so a
// loads file with skewed routing must raise the predicted step time, balanced loads must leave
// it exactly as the balanced assumption, the rank placement (contiguous, as moetrain train starts)
// decides what counts as skew, and the plan's output names the imbalance it used. The expected
// imbalances are summed here by hand from the loads, not by the planner's code.
// No MPI: plan/ is arithmetic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "core/error.h"
#include "plan/cluster.h"
#include "plan/plan_model.h"
#include "plan/report.h"
#include "plan/routing.h"
#include "plan/search.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

using test_util::error_of;

// A metrics.jsonl of `steps` identical steps whose every MoE layer has `loads`.
plan::RoutingStats loads_file(const std::string& name, const std::vector<double>& loads, int layers = 3,
                              int steps = 2) {
  const fs::path p = moe::test_util::scratch_path("plan_loads", name);
  std::ofstream f(p);
  for (int s = 1; s <= steps; ++s) {
    nlohmann::json layer_list = nlohmann::json::array();
    for (int l = 0; l < layers; ++l) layer_list.push_back(loads);
    f << nlohmann::json{{"step", s}, {"loss", 3.0}, {"expert_loads", layer_list}}.dump() << "\n";
  }
  f.close();
  return plan::read_routing_stats(p.string());
}

struct TinyPlan {
  plan::PlanModel model = plan::plan_preset("tiny");  // E = 8, k = 2, 3 MoE layers
  plan::ClusterProfile cluster = plan::resolve_cluster("dgx-h100");
  plan::TrainShape shape{128, 16, Precision::kBf16};  // seq 128, global batch 16 (the default job)

  plan::Candidate eval(const std::string& layout, const plan::RoutingStats* r, double imbalance = 1.0) const {
    return plan::evaluate_layout(model, cluster, plan::parse_layout(layout), shape, r, imbalance);
  }
};

const char* kEp4 = "pp=1,dp=1,ep=4,mb=1,recompute=none,a2a=flat";
const char* kEp1 = "pp=1,dp=4,ep=1,mb=1,recompute=none,a2a=flat";

}  // namespace

// Experts 0,1 hot: at ep 4 rank 0 holds {0,1} = 80 of 120 rows (mean 30), max/mean 8/3.
TEST(PlanLoads, SkewedLoadsRaiseTheStepTimeOfAnExpertParallelLayout) {
  const TinyPlan s;
  const plan::RoutingStats skewed = loads_file("skewed.jsonl", {40, 40, 10, 10, 10, 10, 0, 0});
  const plan::Candidate balanced = s.eval(kEp4, nullptr);
  const plan::Candidate measured = s.eval(kEp4, &skewed);
  EXPECT_NEAR(measured.imbalance_time, 80.0 / 30, 1e-12);
  EXPECT_NEAR(measured.imbalance_memory, 3 * 80.0 / (3 * 30), 1e-12);
  EXPECT_GT(measured.time.step, balanced.time.step);
  EXPECT_GT(measured.time.compute, balanced.time.compute);  // the busiest rank's expert GEMMs
  EXPECT_GT(measured.time.a2a, balanced.time.a2a);          // and its rows in the exchange
  // The same mechanism as the manual factor: the loads only choose the number.
  const plan::Candidate manual = s.eval(kEp4, nullptr, 80.0 / 30);
  EXPECT_DOUBLE_EQ(measured.time.step, manual.time.step);
  // More skew, slower: expert 0 alone takes the 120 rows (max/mean 4 at ep 4).
  const plan::RoutingStats worse = loads_file("worse.jsonl", {120, 0, 0, 0, 0, 0, 0, 0});
  const plan::Candidate w = s.eval(kEp4, &worse);
  EXPECT_NEAR(w.imbalance_time, 4.0, 1e-12);
  EXPECT_GT(w.time.step, measured.time.step);
}

TEST(PlanLoads, BalancedLoadsAndNoExpertParallelismLeaveThePredictionUnchanged) {
  const TinyPlan s;
  const plan::RoutingStats balanced = loads_file("balanced.jsonl", {15, 15, 15, 15, 15, 15, 15, 15});
  const plan::Candidate none = s.eval(kEp4, nullptr);
  const plan::Candidate measured = s.eval(kEp4, &balanced);
  EXPECT_EQ(measured.imbalance_time, 1.0);
  EXPECT_EQ(measured.time.step, none.time.step);
  EXPECT_EQ(measured.memory.worst_stage().total, none.memory.worst_stage().total);
  // Without EP every rank holds every expert: skew does not make one rank the slowest.
  const plan::RoutingStats skewed = loads_file("skewed-ep1.jsonl", {120, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_EQ(s.eval(kEp1, &skewed).time.step, s.eval(kEp1, nullptr).time.step);
  EXPECT_EQ(s.eval(kEp1, &skewed).imbalance_time, 1.0);
}

// Skew inside a rank is no skew between ranks: experts {2i, 2i+1} sum to 20 on every rank at ep 4,
// but at ep 8 the even experts' ranks hold 20 rows each against a mean of 10.
TEST(PlanLoads, ThePlacementDecidesWhatIsSkew) {
  const TinyPlan s;
  const plan::RoutingStats r = loads_file("alternating.jsonl", {20, 0, 20, 0, 20, 0, 20, 0});
  EXPECT_EQ(plan::routing_imbalance(r, 4).time, 1.0);
  EXPECT_EQ(plan::routing_imbalance(r, 8).time, 2.0);
  EXPECT_EQ(plan::routing_imbalance(r, 2).time, 1.0);
  EXPECT_EQ(s.eval(kEp4, &r).time.step, s.eval(kEp4, nullptr).time.step);
  EXPECT_GT(s.eval("pp=1,dp=1,ep=8,mb=2,recompute=none,a2a=flat", &r).time.step,
            s.eval("pp=1,dp=1,ep=8,mb=2,recompute=none,a2a=flat", nullptr).time.step);
}

// The imbalance is in every output: --evaluate's text, the search table's imb column, the JSON.
TEST(PlanLoads, ThePlanReportsTheImbalanceItUsed) {
  const TinyPlan s;
  const plan::RoutingStats skewed = loads_file("report.jsonl", {40, 40, 10, 10, 10, 10, 0, 0});
  plan::ReportContext ctx{&s.model, &s.cluster, s.shape, 4, &skewed};
  const plan::Candidate c = s.eval(kEp4, &skewed);
  const std::string text = plan::format_evaluation(ctx, c);
  EXPECT_NE(text.find("routing: measured expert loads of " + skewed.source + " (2 steps, 3 MoE layers, E=8)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("routing imbalance (busiest EP rank's rows / mean): 2.667 per step and layer"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("(measured, --loads)"), std::string::npos) << text;
  const nlohmann::json j = plan::candidate_json(ctx, c);
  EXPECT_NEAR(j["routing_imbalance"]["time"].get<double>(), 80.0 / 30, 1e-12);

  plan::SearchOptions so;
  so.gpus = 4;
  so.shape = s.shape;
  so.top = 1000;
  so.routing = &skewed;
  const plan::SearchResult r = plan::search_plans(s.model, s.cluster, so);
  bool saw_ep4 = false;
  for (const plan::Candidate& k : r.best) {
    EXPECT_NEAR(k.imbalance_time, k.layout.ep == 4 ? 80.0 / 30 : (k.layout.ep == 2 ? 100.0 / 60 : 1.0), 1e-12)
        << k.layout.describe();
    saw_ep4 |= k.layout.ep == 4;
  }
  EXPECT_TRUE(saw_ep4);
  const std::string table = plan::format_plans(ctx, r);
  EXPECT_NE(table.find(" imb | worst stage"), std::string::npos) << table;
  EXPECT_NE(table.find(" 2.67 | "), std::string::npos) << table;
  const nlohmann::json sj = plan::search_json(ctx, r, false);
  EXPECT_EQ(sj["loads"]["file"], skewed.source);
  EXPECT_EQ(sj["loads"]["experts"], 8);

  const plan::Candidate assumed = s.eval(kEp4, nullptr);
  plan::ReportContext plain{&s.model, &s.cluster, s.shape, 4};
  EXPECT_NE(plan::format_evaluation(plain, assumed).find("1.000 per step and layer"), std::string::npos);
  EXPECT_NE(plan::format_evaluation(plain, assumed).find("(assumed balanced"), std::string::npos);
}

TEST(PlanLoads, LoadsOfAnotherExpertCountAreOneLineNamingBoth) {
  const TinyPlan s;
  const plan::RoutingStats e4 = loads_file("e4.jsonl", {5, 3, 2, 1});
  const std::string want = e4.source + ": the expert loads have 4 experts per MoE layer, model tiny has 8 "
                                       "(loads of another model?)";
  EXPECT_EQ(error_of([&] { s.eval(kEp4, &e4); }), want);
  plan::SearchOptions so;
  so.gpus = 2;  // ep 2 divides both 4 and 8: only the count check can catch it
  so.shape = s.shape;
  so.routing = &e4;
  EXPECT_EQ(error_of([&] { plan::search_plans(s.model, s.cluster, so); }), want);
  const plan::RoutingStats e6 = loads_file("e6.jsonl", {1, 1, 1, 1, 1, 1});
  EXPECT_EQ(error_of([&] { plan::routing_imbalance(e6, 4); }),
            e6.source + ": ep(4) does not divide the 6 experts of the expert loads");
}

// The measured H200 profile is launch-bound at the tiny model's expert GEMMs (~14 µs for any m,
// with ±1 µs of noise): a busier rank must not come out faster there (at ep 8 it did, by 2.6% of
// the compute, before the balanced rank's expert time became the floor), and its exchange carries
// more rows. The loads: max/mean 2.8 at ep 8 and 1.9 at ep 4, as in the first 100 steps of
// `--preset tiny-noaux` (docs/balance.md).
TEST(PlanLoads, MeasuredH200ProfileBusierRankIsNotFaster) {
  TinyPlan s;
  s.cluster = plan::resolve_cluster(MOETRAIN_SOURCE_DIR "/profiles/dgx-h200-measured.json");
  const plan::RoutingStats skewed = loads_file("h200.jsonl", {42, 15, 15, 15, 15, 6, 6, 6});
  for (const char* l : {kEp4, "pp=1,dp=1,ep=8,mb=2,recompute=none,a2a=flat"}) {
    const plan::Candidate bal = s.eval(l, nullptr), busy = s.eval(l, &skewed);
    EXPECT_GE(busy.time.compute, bal.time.compute) << l;
    EXPECT_GT(busy.time.a2a, bal.time.a2a) << l;
    EXPECT_GT(busy.time.step, bal.time.step) << l;
  }
}
