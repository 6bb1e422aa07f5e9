// Pipeline schedules (pure logic, no MPI): the op lists of 1F1B and GPipe against a naive check of
// their shape, in-flight counts, and a global simulation of all stages (forward 1, backward 2,
// dependencies between neighbouring stages) whose step time must be the theoretical
// (M + PP − 1)·(tf + tb), i.e. a bubble of (PP − 1)/(M + PP − 1). Errors name the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/group.h"
#include "core/error.h"
#include "parallel/pipeline.h"
#include "test_util.h"

using namespace moe;
using namespace moe::parallel;

namespace {

using moe::test_util::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Step time of all stages running their op lists, each op as early as its dependencies allow:
// F(m) on s after F(m) on s−1; B(m) on s after B(m) on s+1 and after F(m) on s (and every op after
// the previous op of its stage). Returns -1 on a deadlock.
double simulate_step(Schedule sched, int PP, int M, double tf, double tb) {
  std::vector<std::vector<PipeOp>> ops(PP);
  for (int s = 0; s < PP; ++s) ops[s] = make_schedule(sched, PP, s, M);
  const double kNotYet = -1;
  std::vector<std::vector<double>> f_end(PP, std::vector<double>(M, kNotYet));
  std::vector<std::vector<double>> b_end(PP, std::vector<double>(M, kNotYet));
  std::vector<size_t> next(PP, 0);
  std::vector<double> clock(PP, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < PP; ++s) {
      while (next[s] < ops[s].size()) {
        const PipeOp& op = ops[s][next[s]];
        const int m = op.micro_batch;
        double ready = clock[s];
        if (op.forward) {
          if (s > 0) {
            if (f_end[s - 1][m] == kNotYet) break;
            ready = std::max(ready, f_end[s - 1][m]);
          }
          clock[s] = f_end[s][m] = ready + tf;
        } else {
          if (f_end[s][m] == kNotYet) break;
          if (s + 1 < PP) {
            if (b_end[s + 1][m] == kNotYet) break;
            ready = std::max(ready, b_end[s + 1][m]);
          }
          clock[s] = b_end[s][m] = ready + tb;
        }
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < PP; ++s)
    if (next[s] != ops[s].size()) return -1;
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace

TEST(PipelineSchedule, EveryMicroBatchOnceInOrder) {
  for (Schedule sched : {Schedule::k1F1B, Schedule::kGPipe})
    for (int PP = 1; PP <= 4; ++PP)
      for (int s = 0; s < PP; ++s)
        for (int M = 1; M <= 8; ++M) {
          SCOPED_TRACE(str_cat(name(sched), " PP=", PP, " stage=", s, " M=", M));
          std::vector<PipeOp> ops = make_schedule(sched, PP, s, M);
          ASSERT_EQ(ops.size(), 2u * M);
          std::vector<int> fwd_pos(M, -1), bwd_pos(M, -1);
          int next_f = 0, next_b = 0;
          for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
            const PipeOp& op = ops[i];
            ASSERT_TRUE(op.micro_batch >= 0 && op.micro_batch < M);
            if (op.forward) {
              EXPECT_EQ(op.micro_batch, next_f++);  // forwards in order, each once
              fwd_pos[op.micro_batch] = i;
            } else {
              EXPECT_EQ(op.micro_batch, next_b++);  // backwards in order, each once
              bwd_pos[op.micro_batch] = i;
            }
          }
          EXPECT_EQ(next_f, M);
          EXPECT_EQ(next_b, M);
          for (int m = 0; m < M; ++m) EXPECT_LT(fwd_pos[m], bwd_pos[m]) << "mb " << m;
        }
}

TEST(PipelineSchedule, OneFOneBShapeAndInFlight) {
  for (int PP = 1; PP <= 4; ++PP)
    for (int s = 0; s < PP; ++s)
      for (int M = 1; M <= 8; ++M) {
        SCOPED_TRACE(str_cat("PP=", PP, " stage=", s, " M=", M));
        std::vector<PipeOp> ops = make_schedule(Schedule::k1F1B, PP, s, M);
        // Naive expectation: w warm-up forwards, M − w (F, B) pairs, w cool-down backwards.
        const int w = std::min(PP - s - 1, M);
        std::vector<PipeOp> want;
        for (int m = 0; m < w; ++m) want.push_back({true, m});
        for (int i = 0; i < M - w; ++i) {
          want.push_back({true, w + i});
          want.push_back({false, i});
        }
        for (int m = M - w; m < M; ++m) want.push_back({false, m});
        ASSERT_EQ(ops.size(), want.size());
        for (size_t i = 0; i < ops.size(); ++i) {
          EXPECT_EQ(ops[i].forward, want[i].forward) << "op " << i;
          EXPECT_EQ(ops[i].micro_batch, want[i].micro_batch) << "op " << i;
        }
        // Forwards before the first backward: the warm-up plus the first pair's forward.
        int leading = 0;
        while (leading < static_cast<int>(ops.size()) && ops[leading].forward) ++leading;
        EXPECT_EQ(leading, std::min(PP - s, M));
        EXPECT_EQ(max_in_flight(ops), std::min(PP - s, M));
      }
}

TEST(PipelineSchedule, GPipeAllForwardsThenAllBackwards) {
  for (int PP = 1; PP <= 4; ++PP)
    for (int s = 0; s < PP; ++s)
      for (int M = 1; M <= 8; ++M) {
        std::vector<PipeOp> ops = make_schedule(Schedule::kGPipe, PP, s, M);
        for (int m = 0; m < M; ++m) {
          EXPECT_TRUE(ops[m].forward && ops[m].micro_batch == m);
          EXPECT_TRUE(!ops[M + m].forward && ops[M + m].micro_batch == m);
        }
        EXPECT_EQ(max_in_flight(ops), M);
      }
}

TEST(PipelineSchedule, MaxInFlightCountsOpenForwards) {
  EXPECT_EQ(max_in_flight({}), 0);
  EXPECT_EQ(max_in_flight({{true, 0}, {false, 0}, {true, 1}, {false, 1}}), 1);
  EXPECT_EQ(
      max_in_flight({{true, 0}, {true, 1}, {false, 0}, {true, 2}, {false, 1}, {false, 2}}), 2);
}

TEST(PipelineSchedule, GlobalSimulationGivesTheoreticalBubble) {
  const double tf = 1, tb = 2;
  for (Schedule sched : {Schedule::k1F1B, Schedule::kGPipe})
    for (int PP = 1; PP <= 4; ++PP)
      for (int M = 1; M <= 8; ++M) {
        SCOPED_TRACE(str_cat(name(sched), " PP=", PP, " M=", M));
        const double step = simulate_step(sched, PP, M, tf, tb);
        ASSERT_GE(step, 0) << "deadlock";
        EXPECT_DOUBLE_EQ(step, (M + PP - 1) * (tf + tb));
        // bubble = 1 − busy/step, busy = M·(tf + tb) on every stage
        const double bubble = 1.0 - M * (tf + tb) / step;
        EXPECT_NEAR(bubble, double(PP - 1) / (M + PP - 1), 1e-12);
      }
}

TEST(PipelineSchedule, ParseAndName) {
  EXPECT_EQ(parse_schedule("1f1b", "--pp.schedule"), Schedule::k1F1B);
  EXPECT_EQ(parse_schedule("gpipe", "--pp.schedule"), Schedule::kGPipe);
  EXPECT_STREQ(name(Schedule::k1F1B), "1f1b");
  EXPECT_STREQ(name(Schedule::kGPipe), "gpipe");
  std::string e = error_of([] { parse_schedule("zero-bubble", "--pp.schedule"); });
  EXPECT_TRUE(contains(e, "'zero-bubble'")) << e;
}

TEST(PipelineSchedule, ErrorsNameTheNumbers) {
  std::string e = error_of([] { make_schedule(Schedule::k1F1B, 0, 0, 4); });
  EXPECT_TRUE(contains(e, "num_stages = 0")) << e;
  e = error_of([] { make_schedule(Schedule::k1F1B, 2, 3, 4); });
  EXPECT_TRUE(contains(e, "stage 3") && contains(e, "[0, 2)")) << e;
  e = error_of([] { make_schedule(Schedule::kGPipe, 2, -1, 4); });
  EXPECT_TRUE(contains(e, "stage -1")) << e;
  e = error_of([] { make_schedule(Schedule::kGPipe, 2, 0, 0); });
  EXPECT_TRUE(contains(e, "M = 0")) << e;

  // run_pipeline checks its arguments before touching the group (no MPI needed here).
  comm::Group none;
  StageCallbacks cb;
  cb.forward = [](int, const float*, float*) {};
  cb.backward = [](int, const float*, float*) {};
  e = error_of([&] { run_pipeline(none, Schedule::k1F1B, 0, 16, cb, nullptr); });
  EXPECT_TRUE(contains(e, "M = 0")) << e;
  e = error_of([&] { run_pipeline(none, Schedule::k1F1B, 20000, 16, cb, nullptr); });
  EXPECT_TRUE(contains(e, "M = 20000")) << e;
  StageCallbacks no_bwd;
  no_bwd.forward = cb.forward;
  e = error_of([&] { run_pipeline(none, Schedule::k1F1B, 2, 16, no_bwd, nullptr); });
  EXPECT_TRUE(contains(e, "backward callback")) << e;
  e = error_of([&] { run_pipeline(none, Schedule::k1F1B, 2, 16, cb, nullptr); });
  EXPECT_TRUE(contains(e, "not valid")) << e;
}
