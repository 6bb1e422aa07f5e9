// The table of sane ranges. See value_ranges.h.
#include "train/value_ranges.h"

#include <cmath>
#include <cstring>
#include <iterator>

#include "core/error.h"

namespace moe::train {
namespace {

constexpr double kMaxSteps = 1e9;     // a billion optimizer steps: centuries of the tiny model
constexpr double kMaxDegree = 65536;  // ranks along one parallel dimension
// Below-range wording is what these flags have always said (tests/cli_errors.sh matches it).
// clang-format off
const ValueRange kRanges[] = {
    // name                      lo     hi      lo_open zero_ok low                                         high
    {"--steps",                  1,     kMaxSteps, false, false, "positive",                               "a billion steps"},
    {"--batch",                  1,     1 << 24, false, false, "positive",                                 "2^24 sequences per step"},
    {"--seq-len",                2,     1 << 24, false, false, "at least 2",                               "2^24 tokens per sequence"},
    {"--threads",                1,     1024,  false, false, "in [1, 1024]",                               ""},
    {"--peak-gflops",            0,     1e7,   true,  true,  "a GFLOP/s figure in (0, 1e7] (or 0: measure it)", ""},
    {"--vocab-size",             1,     1 << 24, false, true,  "in [1, 2^24] (0 = the model's)",            ""},
    {"--eval-batches",           1,     1e6,   false, false, "positive",                                   "a million batches per evaluation"},
    {"--eval-every",             0,     kMaxSteps, false, false, ">= 0 (0 = only at the end)",             "a billion steps"},
    {"--lr",                     0,     1,     true,  false, "a number in (0, 1]",                         ""},
    {"--min-lr",                 0,     1,     false, false, "a number >= 0",                              "a learning rate"},
    {"--warmup",                 0,     kMaxSteps, false, false, ">= 0",                                   "a billion steps"},
    {"--weight-decay",           0,     100,   false, false, "a number >= 0",                              "AdamW decays each weight by lr * weight decay per step"},
    {"--grad-clip",              0,     1e9,   false, false, "a number >= 0 (0 = off)",                    "a gradient norm"},
    {"--capacity-factor",        0,     1e4,   false, false, ">= 0 (0 = dropless)",                        "buffers of capacity factor x tokens x k rows per expert"},
    {"--micro-batches",          1,     1 << 24, false, false, ">= 1",                                     "2^24 micro-batches"},
    {"--checkpoint.keep",        0,     1e6,   false, false, ">= 0",                                       "a million checkpoints"},
    {"--checkpoint.every",       0,     kMaxSteps, false, false, ">= 0",                                   "a billion steps"},
    {"--max-bad-steps",          1,     1e6,   false, false, ">= 1",                                       "a million non-finite steps in a row"},
    {"--fault.nan-steps",        1,     kMaxSteps, false, false, "a step counted from 1",                  "a billion steps"},
    {"--fault.inf-weight-steps", 1,     kMaxSteps, false, false, "a step counted from 1",                  "a billion steps"},
    {"--balance.migrate-every",  0,     kMaxSteps, false, false, ">= 0 (0 = never)",                       "a billion steps"},
    {"--balance.threshold",      1,     1e6,   true,  false, "a max/mean rank load > 1 (1 is perfect balance)", "a max/mean load ratio"},
    {"--balance.bias-rate",      0,     1,     false, false, "a finite number >= 0",                       "the selection bias moves by the rate each step; scores are in [0, 1]"},
    {"--comm.timeout",           0,     1e9,   false, false, "a number of seconds >= 0 (0 = wait forever)", "seconds"},
    // Parallel degrees, topology sizes and stage layer counts: only an upper bound here; below
    // their least value ParallelDims::validate, Topology::detect and split_layers name them with
    // the rest of the layout.
    {"--topo.ranks-per-node",    -2147483648.0, kMaxDegree, false, false, ">= 0 (0 = from the launcher)",          "ranks"},
    {"--topo.nodes-per-group",   -2147483648.0, kMaxDegree, false, false, ">= 0 (0 = one group)",                  "nodes"},
    {"--pp",                     -2147483648.0, kMaxDegree, false, false, ">= 1",                                  "ranks along one dimension"},
    {"--dp",                     -2147483648.0, kMaxDegree, false, false, ">= 1",                                  "ranks along one dimension"},
    {"--ep",                     -2147483648.0, kMaxDegree, false, false, ">= 1",                                  "ranks along one dimension"},
    {"--tp",                     -2147483648.0, kMaxDegree, false, false, ">= 1",                                  "ranks along one dimension"},
    {"--pp.layers",              -2147483648.0, 1 << 20, false, false, "a layer count >= 1 per stage",   "layers"},
    // moetrain generate (train/generate.cpp).
    {"--tokens",                 0,     1 << 24, false, false, ">= 0",                                    "2^24 new tokens"},
    {"--temperature",            0,     1000,  false, false, "a finite number >= 0 (0 = greedy)",         "logits are divided by it: far above 1 every token is as likely"},
    {"--top-k",                  0,     1 << 24, false, false, ">= 0 (0 = every token)",                  "vocabularies hold at most 2^24 tokens"},
    // What a checkpoint's manifest.json stores (train/checkpoint_manifest.cpp).
    {"field \"step\"",           0,     kMaxSteps, false, false, "an integer >= 0",                        "--steps is at most a billion"},
    {"field \"bad_steps\"",      0,     kMaxSteps, false, false, "an integer >= 0",                        "--steps is at most a billion"},
    {"field \"time_budget_steps\"", 0,  100'000'000, false, false, "an integer >= 0",                      "the most steps --time-budget chooses"},
    {"router_bias value",        -1e4,  1e4,   false, false, "a finite number >= -10000",                  "a selection bias added to scores in [0, 1]"},
};
// clang-format on

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return str_cat(v);
}

}  // namespace

const ValueRange* value_ranges_begin() { return std::begin(kRanges); }
const ValueRange* value_ranges_end() { return std::end(kRanges); }

const ValueRange& value_range(const std::string& name) {
  for (const ValueRange& r : kRanges)
    if (name == r.name) return r;
  throw Error(str_cat("internal: no range for ", name, " in train/value_ranges.cpp"));
}

void check_value(const std::string& name, double v, const std::string& where) {
  const ValueRange& r = value_range(name);
  const std::string at = where.empty() ? "" : where + ": ";
  if (r.zero_ok && v == 0) return;
  const bool low = std::isnan(v) || (r.lo_open ? v <= r.lo : v < r.lo);
  if (low) throw Error(str_cat(at, r.name, " must be ", r.low, ", got ", number(v)));
  if (v <= r.hi) return;
  if (*r.high == '\0') throw Error(str_cat(at, r.name, " must be ", r.low, ", got ", number(v)));
  throw Error(str_cat(at, r.name, " must be at most ", number(r.hi), " (", r.high, "), got ", number(v)));
}

}  // namespace moe::train
