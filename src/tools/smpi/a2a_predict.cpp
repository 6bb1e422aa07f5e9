// moetrain_a2a_predict: the planner's time for one token exchange (plan/time_model.cpp's
// a2a_seconds, the function `moetrain plan` charges per dispatch and combine) and for its plan
// (a2a_plan_seconds, once per MoE layer and micro-batch), for the SMPI scale study's
// planner-vs-simulation columns (scripts/scale_study.sh). Normal build; links only the planner.
//   moetrain_a2a_predict --cluster frontier [--per-message-us X] < points
// reads lines "ALGO WORLD EP BYTES K [PAIRS]" (BYTES per rank, flat dispatch bytes; PAIRS the
// (token, expert) pairs a rank sends) and prints "ALGO WORLD EP BYTES K SECONDS [PLAN_SECONDS]".
// --per-message-us replaces the profile's per-message cost of every link class (the study's
// calibrated overhead, or 0).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "plan/cluster.h"
#include "plan/time_model.h"

namespace {

struct Args {
  std::string cluster = "frontier";
  double per_message_us = -1;  // < 0: keep the profile's
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    MOE_CHECK(i + 1 < argc, "moetrain_a2a_predict: ", f, " needs a value");
    const std::string v = argv[++i];
    if (f == "--cluster") {
      a.cluster = v;
    } else if (f == "--per-message-us") {
      size_t pos = 0;
      try {
        a.per_message_us = std::stod(v, &pos);
      } catch (const std::exception&) {
        pos = 0;
      }
      MOE_CHECK(pos == v.size() && std::isfinite(a.per_message_us) && a.per_message_us >= 0,
                "moetrain_a2a_predict: --per-message-us '", v, "' is not a number >= 0");
    } else {
      throw moe::Error(moe::str_cat("moetrain_a2a_predict: unknown option '", f,
                                    "' (expected --cluster, --per-message-us)"));
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse_args(argc, argv);
    moe::plan::ClusterProfile c = moe::plan::resolve_cluster(a.cluster);
    if (a.per_message_us >= 0)
      c.intra_node.latency = c.inter_node.latency = c.inter_group.latency = a.per_message_us * 1e-6;
    std::string line;
    for (int n = 1; std::getline(std::cin, line); ++n) {
      if (line.empty()) continue;
      std::istringstream is(line);
      std::string algo;
      int world = 0, ep = 0, k = 0;
      double bytes = 0;
      MOE_CHECK(static_cast<bool>(is >> algo >> world >> ep >> bytes >> k) && world >= ep && ep >= 1 &&
                    k >= 1 && bytes >= 0,
                "moetrain_a2a_predict: stdin line ", n, " '", line, "' is not \"ALGO WORLD EP BYTES K [PAIRS]\"");
      double pairs = -1;
      if (!(is >> pairs)) {
        MOE_CHECK(is.eof(), "moetrain_a2a_predict: stdin line ", n, ": PAIRS in '", line, "' is not a number");
        pairs = -1;
      } else {
        MOE_CHECK(pairs >= 0, "moetrain_a2a_predict: stdin line ", n, ": PAIRS ", pairs, " is negative");
      }
      const std::optional<moe::A2a> a = moe::find_mode<moe::A2a>(algo);
      MOE_CHECK(a, "moetrain_a2a_predict: stdin line ", n, ": algorithm '", algo, "' (expected ",
                moe::accepted_names<moe::A2a>(), ")");
      std::printf("%s %d %d %.0f %d %.9g", algo.c_str(), world, ep, bytes, k,
                  moe::plan::a2a_seconds(c, *a, world, ep, 1, bytes, k, pairs));
      if (pairs >= 0) std::printf(" %.9g", moe::plan::a2a_plan_seconds(c, *a, world, ep, 1, pairs));
      std::printf("\n");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
