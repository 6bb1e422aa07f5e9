// Layout parsing, per-rank shapes, and the pipeline schedule bookkeeping. See layout.h.
#include "plan/layout.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "core/error.h"

namespace moe::plan {

std::string Layout::describe() const {
  std::string s = str_cat("pp=", pp, ",dp=", dp, ",ep=", ep, ",tp=", tp, ",mb=", micro_batches,
                          ",recompute=", recompute, ",a2a=", a2a);
  if (zero1) s += ",zero1=1";
  if (schedule != Schedule::k1F1B) s += str_cat(",schedule=", schedule);
  return s;
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::stringstream ss(text);
  std::string item;
  auto to_int = [&](const std::string& key, const std::string& v) {
    size_t pos = 0;
    int x = 0;
    try {
      x = std::stoi(v, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    MOE_CHECK(pos == v.size() && !v.empty(), "--layout: ", key, "=", v, " is not an integer");
    MOE_CHECK(x >= 1, "--layout: ", key, "=", v, " must be >= 1");
    return x;
  };
  // A mode's word: "--layout: a2a=ring (expected flat, rbd, halo or rbd-halo)".
  auto mode = [](const std::string& key, const std::string& v, auto type) {
    using E = decltype(type);
    const std::optional<E> m = find_mode<E>(v);
    MOE_CHECK(m, "--layout: ", key, "=", v, " (expected ", accepted_names<E>(), ")");
    return *m;
  };
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    MOE_CHECK(eq != std::string::npos, "--layout: '", item, "' is not key=value");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "pp") l.pp = to_int(key, v);
    else if (key == "dp") l.dp = to_int(key, v);
    else if (key == "ep") l.ep = to_int(key, v);
    else if (key == "tp") l.tp = to_int(key, v);
    else if (key == "mb" || key == "micro-batches" || key == "m") l.micro_batches = to_int(key, v);
    else if (key == "recompute") l.recompute = mode(key, v, Recompute());
    else if (key == "a2a") l.a2a = mode(key, v, A2a());
    else if (key == "zero1") {
      MOE_CHECK(v == "0" || v == "1" || v == "true" || v == "false", "--layout: zero1=", v,
                " (expected 0 or 1)");
      l.zero1 = v == "1" || v == "true";
    } else if (key == "schedule") {
      l.schedule = mode(key, v, Schedule());
    } else {
      throw Error(str_cat("--layout: unknown key '", key,
                          "' (keys: pp, dp, ep, tp, mb, recompute, a2a, zero1, schedule)"));
    }
  }
  return l;
}

RankShape rank_shape(const Layout& l, const TrainShape& s) {
  MOE_CHECK(s.seq_len > 0, "--seq-len must be positive, got ", s.seq_len);
  MOE_CHECK(s.global_batch > 0, "--global-batch must be positive, got ", s.global_batch);
  const long long D = l.data_ranks(), M = l.micro_batches;
  MOE_CHECK(s.global_batch % (D * M) == 0, "global batch ", s.global_batch,
            " is not divisible by dp(", l.dp, ") * ep(", l.ep, ") * micro-batches(", M, ") = ", D * M);
  RankShape r;
  r.batch_per_rank = s.global_batch / D;
  r.micro_batch = r.batch_per_rank / M;
  r.tokens = r.micro_batch * s.seq_len;
  return r;
}

std::vector<int> split_stages(int layers, int pp) {
  MOE_CHECK(pp >= 1 && pp <= layers, "pp(", pp, ") must be between 1 and the model's ", layers, " layers");
  std::vector<int> out(pp, layers / pp);
  for (int s = 0; s < layers % pp; ++s) out[s] += 1;
  return out;
}

std::vector<PipeOpSpec> schedule_ops(Schedule schedule, int num_stages, int stage, int M) {
  return parallel::make_schedule(schedule, num_stages, stage, M);
}

int pipeline_buffer_slots(Schedule schedule, int num_stages, int stage, int M) {
  // The executor's dry pass: every acquire/release of an activation-sized slot, in op order.
  const bool first = stage == 0, last = stage == num_stages - 1;
  if (first && last) return 0;
  const std::vector<PipeOpSpec> ops = schedule_ops(schedule, num_stages, stage, M);
  const std::vector<int> xout_done =
      last ? std::vector<int>() : parallel::implied_done(schedule_ops(schedule, num_stages, stage + 1, M), false, M);
  const std::vector<int> dx_done =
      first ? std::vector<int>() : parallel::implied_done(schedule_ops(schedule, num_stages, stage - 1, M), true, M);
  int count = 0;
  std::vector<int> free_slots;
  auto acquire = [&]() {
    if (!free_slots.empty()) {
      int id = free_slots.back();
      free_slots.pop_back();
      return id;
    }
    return count++;
  };
  auto release = [&](int id) {
    if (id >= 0) free_slots.push_back(id);
  };
  std::vector<int> x_in(M, -1), x_out(M, -1), dy(M, -1), dx(M, -1);
  int x_out_retired = 0, dx_retired = 0;
  auto retire = [&](std::vector<int>& bufs, int& retired, int upto) {
    for (; retired < upto; ++retired) {
      release(bufs[retired]);
      bufs[retired] = -1;
    }
  };
  if (!first) x_in[0] = acquire();
  for (const PipeOpSpec& op : ops) {
    const int m = op.micro_batch;
    if (op.forward) {
      if (!first) {
        if (m + 1 < M) x_in[m + 1] = acquire();
        retire(dx, dx_retired, dx_done[m]);
      }
      if (!last) x_out[m] = acquire();
      if (!first) {
        release(x_in[m]);
        x_in[m] = -1;
      }
      if (!last) dy[m] = acquire();
    } else {
      if (!last) retire(x_out, x_out_retired, xout_done[m]);
      if (!first) dx[m] = acquire();
      if (!last) {
        release(dy[m]);
        dy[m] = -1;
      }
    }
  }
  return count;
}

}  // namespace moe::plan
