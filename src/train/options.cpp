// The run's options on their own: the --time-budget duration format and validate_options
// (train/trainer.h), and the built-in corpus's default location.
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "kernels/gemm_bf16_cpu.h"
#include "train/run_setup.h"
#include "train/trainer.h"
#include "train/value_ranges.h"

namespace moe::train {

std::string default_corpus_path() {
  if (std::filesystem::exists("data/kjv.txt")) return "data/kjv.txt";
  return std::string(MOETRAIN_SOURCE_DIR) + "/data/kjv.txt";
}

double parse_duration_s(const std::string& text, const char* flag) {
  // A number (no sign, no exponent, no inf/nan), then an optional unit.
  size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  const std::string number = text.substr(0, end), unit = text.substr(end);
  const bool one_point = number.find('.') == number.rfind('.');
  const bool digit = number.find_first_of("0123456789") != std::string::npos;
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  MOE_CHECK(digit && one_point && scale > 0, flag, " must be a duration: seconds, or a number with the unit "
                                                   "s, m or h (300, 90s, 5m, 1.5h), got '",
            text, "'");
  const double seconds = std::strtod(number.c_str(), nullptr) * scale;
  MOE_CHECK(seconds > 0 && seconds <= 1e7, flag, " must be more than 0 and at most 1e7 seconds, got '", text, "'");
  return seconds;
}

void validate_options(const TrainOptions& o) {
  auto finite = [](double v) { return std::isfinite(v); };
  // Every number's own range, from the one table (train/value_ranges.h); then what ties flags.
  // clang-format off
  const std::pair<const char*, double> values[] = {
      {"--steps", o.steps}, {"--batch", o.data.batch}, {"--seq-len", o.data.seq_len},
      {"--threads", o.device.threads}, {"--peak-gflops", o.device.peak_gflops},
      {"--vocab-size", o.model.vocab_size}, {"--eval-batches", o.data.eval_batches},
      {"--eval-every", o.data.eval_every}, {"--lr", o.optim.lr}, {"--min-lr", o.optim.min_lr},
      {"--warmup", o.optim.warmup_steps}, {"--weight-decay", o.optim.weight_decay},
      {"--grad-clip", o.optim.grad_clip}, {"--capacity-factor", o.model.moe.capacity_factor},
      {"--micro-batches", o.parallel.micro_batches}, {"--checkpoint.keep", o.checkpoint.keep},
      {"--checkpoint.every", o.checkpoint.every}, {"--max-bad-steps", o.faults.max_bad_steps},
      {"--balance.migrate-every", o.balance.migrate_every}, {"--balance.threshold", o.balance.threshold},
      {"--comm.timeout", o.faults.comm_timeout_s}, {"--topo.ranks-per-node", o.parallel.topo_ranks_per_node},
      {"--topo.nodes-per-group", o.parallel.topo_nodes_per_group}, {"--pp", o.parallel.dims.pp},
      {"--dp", o.parallel.dims.dp}, {"--ep", o.parallel.dims.ep}, {"--tp", o.parallel.dims.tp}};
  // clang-format on
  for (const auto& [name, v] : values) check_value(name, v);
  for (int s : o.faults.nan_steps) check_value("--fault.nan-steps", s);
  for (int s : o.faults.inf_weight_steps) check_value("--fault.inf-weight-steps", s);
  for (int n : o.parallel.pp_layers) check_value("--pp.layers", n);
  if (o.balance.bias_rate) check_value("--balance.bias-rate", *o.balance.bias_rate);
  MOE_CHECK(o.time_budget_s == 0 || (finite(o.time_budget_s) && o.time_budget_s > 0 && o.time_budget_s <= 1e7),
            "--time-budget must be more than 0 and at most 1e7 seconds, got ", o.time_budget_s);
  MOE_CHECK(o.time_budget_s == 0 || o.optim.warmup_steps >= kTimeBudgetMinWarmup,
            "--time-budget chooses the step count from the warm-up steps' time (their learning rates do not depend "
            "on it), so it needs --warmup >= ",
            kTimeBudgetMinWarmup, ", got ", o.optim.warmup_steps);
  const OptimConfig& c = o.optim;
  MOE_CHECK(c.min_lr <= c.lr, "--min-lr ", c.min_lr, " is above --lr ", c.lr,
            " (the cosine schedule decays from --lr to --min-lr)");
  // Decoupled decay multiplies each weight by 1 - lr·wd: at lr·wd >= 1 it zeroes or flips them.
  MOE_CHECK(static_cast<double>(c.lr) * c.weight_decay < 1, "--weight-decay ", c.weight_decay, " with --lr ",
            c.lr, ": lr * weight decay = ", static_cast<double>(c.lr) * c.weight_decay,
            " >= 1 would zero or flip the weights every step");
  MOE_CHECK(o.data.batch % o.parallel.micro_batches == 0, "--batch ", o.data.batch, " is not divisible by --micro-batches ",
            o.parallel.micro_batches);
  MOE_CHECK(o.device.precision != Precision::kBf16 || o.device.type == Device::kCuda || kernels::bf16_cpu_available(),
            "--precision bf16 --device cpu: ", kernels::bf16_cpu_unavailable_reason());
  MOE_CHECK(o.balance.migrate_every == 0 || !o.parallel.zero1, "--balance.migrate-every with --zero1: moving experts with a "
                                                               "sharded AdamW state is not supported; use one of them");
  MOE_CHECK(o.balance.migrate_every == 0 || !o.model.moe.padded, "--balance.migrate-every with --padded: migration needs "
                                                                 "the padding-free layout");
  MOE_CHECK(!o.out_dir.empty(), "--out must not be empty");
}

}  // namespace moe::train
