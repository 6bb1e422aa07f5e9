// Memory a run will need against what the host has. See run_memory.h.
#include "train/run_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "parallel/parallel_dims.h"
#include "plan/layout.h"
#include "plan/memory_model.h"
#include "plan/plan_model.h"
#include "train/trainer.h"

namespace moe::train {

std::vector<RankMemory> estimate_run_memory(const model::ModelConfig& cfg, const TrainOptions& opts,
                                            int world_size, double corpus_bytes) {
  const std::string name = opts.model.config_path.empty() ? opts.model.preset : opts.model.config_path;
  const plan::PlanModel pm = plan::from_model_config(cfg, name, "");
  plan::Layout lay;
  lay.pp = opts.parallel.dims.pp;
  lay.dp = opts.parallel.dims.dp;
  lay.ep = opts.parallel.dims.ep;
  lay.tp = opts.parallel.dims.tp;
  lay.micro_batches = opts.parallel.micro_batches;
  lay.recompute = opts.model.recompute;
  lay.a2a = opts.parallel.a2a.value_or(A2a::kFlat);  // the memory model does not depend on it
  lay.schedule = opts.parallel.schedule;
  plan::TrainShape shape;
  shape.seq_len = opts.data.seq_len;
  shape.global_batch = static_cast<long long>(opts.data.batch) * lay.data_ranks();
  shape.precision = Precision::kFp32;
  // The CPU trainer's accounting: fp32 weights, gradients, Adam m and v; fp32 activations; fused
  // attention (no probabilities kept); no communication library buffers.
  plan::MemoryOptions mo;
  mo.weight_bytes = 4;
  mo.grad_bytes = 4;
  mo.optimizer_bytes = 8;
  mo.act_bytes = 4;
  mo.attention_s2 = false;
  mo.a2a_buffers = false;
  mo.padded = opts.model.moe.padded;
  if (opts.model.moe.capacity_factor > 0) mo.capacity_factor = opts.model.moe.capacity_factor;
  const plan::MemoryEstimate est = plan::estimate_memory(pm, lay, shape, mo);

  // Outside the trackers: the corpus as loaded (text: one byte per token; an indexed dataset:
  // its tables, the mmapped tokens are page cache), the global batch drawn every step
  // (int32, B_global · (T + 1)), the held-out batches (eval_batches of them) and the GEMM probe.
  const double rows = static_cast<double>(shape.global_batch) * (opts.data.seq_len + 1.0) * 4.0;
  const double data = corpus_bytes + rows * (1.0 + opts.data.eval_batches) + 3.0 * 1024 * 1024 * 4;
  std::vector<RankMemory> out(world_size);
  for (int r = 0; r < world_size; ++r) {
    // An explicit --pp.layers split is not the planner's even one: take the largest stage.
    const int stage = opts.parallel.pp_layers.empty() ? parallel::coords_of(opts.parallel.dims, r).pp : est.worst;
    const plan::StageMemory& st = est.stages.at(stage);
    out[r].state = st.params + st.grads + st.optimizer;
    out[r].activations = st.activations + st.workspace + st.comm;
    out[r].data = data;
  }
  return out;
}

namespace {

// A number from the first line of a file ("max" or unreadable: none).
bool read_number_file(const std::string& path, double& v) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return false;
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(x) || x < 0) return false;
  v = x;
  return true;
}

}  // namespace

AvailableMemory available_memory() {
  AvailableMemory a;
  if (const char* hook = std::getenv("MOETRAIN_MEMORY_AVAILABLE"); hook && *hook) {
    a.bytes = std::strtod(hook, nullptr);
    a.source = "MOETRAIN_MEMORY_AVAILABLE";
    return a;
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream is(line.substr(13));
    double kb = 0;
    if (is >> kb) {
      a.bytes = kb * 1024;
      a.source = "MemAvailable in /proc/meminfo";
    }
  }
  if (a.source.empty()) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      a.bytes = static_cast<double>(pages) * page;
      a.source = "available physical pages (sysconf)";
    }
  }
  // A container's limit is often far below the host's free memory: cgroup v2, then v1.
  double limit = 0, used = 0;
  if (read_number_file("/sys/fs/cgroup/memory.max", limit)) {
    read_number_file("/sys/fs/cgroup/memory.current", used);
    if (a.source.empty() || limit - used < a.bytes) {
      a.bytes = std::max(0.0, limit - used);
      a.source = "cgroup memory.max - memory.current";
    }
  } else if (read_number_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", limit) && limit < 1e18) {
    read_number_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", used);
    if (a.source.empty() || limit - used < a.bytes) {
      a.bytes = std::max(0.0, limit - used);
      a.source = "cgroup memory.limit_in_bytes - memory.usage_in_bytes";
    }
  }
  return a;
}

std::string format_bytes(double b) {
  char buf[32];
  const char* unit[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (std::fabs(b) >= 1000 && u < 6) {
    b /= 1000;
    ++u;
  }
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return buf;
}

namespace {
std::string whole(double b) {  // exact up to 2^53, and never overflows an integer type
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", b);
  return buf;
}
}  // namespace

void check_memory_fits(const std::vector<RankMemory>& per_rank, const std::vector<int>& ranks_here,
                       const AvailableMemory& avail, const TrainOptions& opts) {
  if (avail.source.empty()) return;  // nothing measurable: no check rather than a wrong one
  RankMemory sum;
  for (int r : ranks_here) {
    sum.state += per_rank.at(r).state;
    sum.activations += per_rank.at(r).activations;
    sum.data += per_rank.at(r).data;
  }
  if (sum.total() <= avail.bytes) return;
  char host[256] = "this host";
  gethostname(host, sizeof host - 1);
  const double need = sum.total();
  throw Error(str_cat(
      "not enough memory on ", host, ": this run needs ", format_bytes(need), " (",
      whole(need), " bytes", ranks_here.size() > 1 ? str_cat(" for ", ranks_here.size(), " ranks") : "",
      ": ", format_bytes(sum.state), " weights, gradients and AdamW state, ",
      format_bytes(sum.activations), " activations and workspace at --batch ", opts.data.batch,
      " --seq-len ", opts.data.seq_len, " --micro-batches ", opts.parallel.micro_batches, ", ",
      format_bytes(sum.data), " data), ", format_bytes(avail.bytes), " (",
      whole(avail.bytes), " bytes) available (", avail.source,
      sum.state > avail.bytes
          ? "); the model's state alone does not fit: split it over more ranks (--ep, --pp) or hosts"
          : "); use a smaller --batch or --seq-len, more --micro-batches, --recompute, or more ranks"));
}

}  // namespace moe::train
