// The metrics schema (train/step_record.h): a record with every field set writes exactly the
// paths the field list (docs/metrics.md) names, reads back to the same JSON, and an older line
// with only "step" reads with every other field absent; wrong types are errors naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "train/step_record.h"

namespace {

using moe::train::StepRecord;
using nlohmann::json;

StepRecord full_record() {
  StepRecord r;
  r.step = 7;
  r.loss = 5.5, r.ce_loss = 5.4, r.aux_loss = 0.1, r.mtp_loss = 0.2, r.lr = 1e-3, r.grad_norm = 1.25, r.tokens = 512;
  r.tokens_per_s = 1000, r.mfu = 0.01;
  r.mfu_peak = {100.0, "fp32", "measured"};
  r.step_time_s = 0.5, r.elapsed_s = 3.5, r.bubble_fraction = 0.25;
  r.time_s = {0.4, 0.3, 0.1, 0.05, 0.02, 0.01, {{"route", 0.001}, {"dispatch", 0.002}}};
  r.a2a_rank_s = {0.01, 0.02};
  r.ranks_per_node = 1;
  r.a2a_bytes = {1, 2, 3, 4};
  r.activation_peak_bytes = 4096;
  r.optimizer_bytes = {10, 10};
  r.moe_dispatch_bytes = {20, 20};
  r.stages = {{0, 2, 0.3, 0.1, 0.01, 0.4, 100, 200, 2}};
  r.expert_loads = {{1, 2, 3, 4}, {4, 3, 2, 1}};
  r.expert_loads_layers = {1, 2};
  r.rank_loads = {{3, 7}, {7, 3}};
  r.load_imbalance = {1.4, 1.4};
  r.migration = moe::train::MigrationRecord{{{1, 2, 1.4, 1.0}}, 4096, 0.01};
  r.time_budget = moe::train::TimeBudgetRecord{60, 0.5, 3, 4, 100};
  r.val_loss = 5.3, r.val_loss_nats_per_byte = 1.3, r.val_loss_start = 5.6;
  return r;
}

// Every path of j: "a", "a.b", "a[].b" (lists of objects); the inside of a map field is not walked.
void collect(const json& j, const std::string& prefix, const std::set<std::string>& maps, std::set<std::string>& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string p = prefix.empty() ? k : prefix + "." + k;
    out.insert(p);
    if (maps.count(p)) continue;
    if (v.is_object()) collect(v, p, maps, out);
    if (v.is_array() && !v.empty() && v[0].is_object()) collect(v[0], p + "[]", maps, out);
  }
}

TEST(StepRecord, WritesExactlyTheDocumentedFields) {
  std::set<std::string> documented, maps, written;
  for (const auto& f : moe::train::step_record_fields()) {
    EXPECT_TRUE(documented.insert(f.path).second) << "listed twice: " << f.path;
    if (std::string(f.type).rfind("object:", 0) == 0) maps.insert(f.path);
  }
  collect(to_json(full_record()), "", maps, written);
  EXPECT_EQ(written, documented);
}

TEST(StepRecord, RoundTrip) {
  const json j = to_json(full_record());
  EXPECT_EQ(to_json(moe::train::step_record_from_json(j, "t")), j);
  // A skipped step: the non-finite loss and norm are written as null and read back as NaN.
  StepRecord r = full_record();
  r.loss = NAN, r.grad_norm = NAN;
  const json k = to_json(r);
  EXPECT_NE(k.dump().find("\"loss\":null"), std::string::npos);
  const StepRecord back = moe::train::step_record_from_json(k, "t");
  EXPECT_TRUE(std::isnan(back.loss) && std::isnan(back.grad_norm));
  EXPECT_EQ(to_json(back).dump(), k.dump());  // NaN != NaN: compare the text written
}

TEST(StepRecord, OlderLinesLackFields) {
  const StepRecord r = moe::train::step_record_from_json(json{{"step", 3}, {"loss", 2.0}}, "t");
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.loss, 2.0);
  EXPECT_TRUE(std::isnan(r.mfu) && std::isnan(r.time_s.compute) && std::isnan(r.a2a_bytes[0]));
  EXPECT_TRUE(r.stages.empty() && r.expert_loads.empty() && r.load_imbalance.empty());
  EXPECT_FALSE(r.migration.has_value());
  EXPECT_FALSE(r.time_budget.has_value());
  EXPECT_EQ(r.ranks_per_node, 0);
}

TEST(StepRecord, WrongTypesNameTheField) {
  auto error = [](const json& j) {
    try {
      moe::train::step_record_from_json(j, "m.jsonl: line 3");
    } catch (const moe::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error({{"step", 1}, {"loss", "high"}}).find("line 3: \"loss\" must be a number"), std::string::npos);
  EXPECT_NE(error({{"loss", 1.0}}).find("no \"step\""), std::string::npos);
  EXPECT_NE(error({{"step", 1}, {"load_imbalance", {1.0}}, {"rank_loads", {{1, 2}, {3, 4}}}}).find("\"rank_loads\""),
            std::string::npos);
  EXPECT_NE(error({{"step", 1}, {"migration", {{"layers", {{{"layer", 1}}}}}}}).find("\"swaps\""), std::string::npos);
}

TEST(StepRecord, DocListsEveryField) {
  const std::string page = moe::train::metrics_doc_markdown();
  for (const auto& f : moe::train::step_record_fields())
    EXPECT_NE(page.find(std::string("| `") + f.path + "` |"), std::string::npos) << f.path;
}

}  // namespace
