// The all-to-all dispatch benchmark. See bench_a2a.h.
// Legend: n ranks, T tokens per rank, k experts per token, H hidden, E experts.
#include "tools/bench_a2a.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "balance/placement.h"
#include "core/buffer.h"
#include "core/error.h"
#include "tools/bench_driver.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/element_math.h"  // math::topk_row, GroupLimit: the router's selection

namespace moe::comm {
namespace {
using tools::median;

void check_node_limit(const A2aBenchOptions& o, int nodes) {
  if (o.routing != "node-limited") {
    MOE_CHECK(o.topk_group == 0, "bench a2a: --topk-group ", o.topk_group,
              " applies to --routing node-limited only (routing is ", o.routing, ")");
    return;
  }
  MOE_CHECK(o.topk_group >= 1 && o.topk_group <= nodes, "bench a2a: --routing node-limited needs ",
            "--topk-group in [1, ", nodes, " nodes], got ", o.topk_group);
  const int64_t candidates = static_cast<int64_t>(o.topk_group) * (o.experts / nodes);
  MOE_CHECK(candidates >= o.topk, "bench a2a: --topk-group ", o.topk_group, " nodes of ",
            o.experts / nodes, " experts cannot hold --topk ", o.topk);
}

void check_options(const A2aBenchOptions& o, int n, int nodes) {
  MOE_CHECK(o.hidden >= 1 && o.experts >= 1, "bench a2a: hidden=", o.hidden, " experts=", o.experts,
            " must be >= 1");
  MOE_CHECK(o.topk >= 1 && o.topk <= o.experts, "bench a2a: topk=", o.topk,
            " must be in [1, experts=", o.experts, "]");
  MOE_CHECK(o.experts % n == 0, "bench a2a: experts=", o.experts, " is not a multiple of the ", n,
            " ranks");
  MOE_CHECK(o.min_bytes >= 1 && o.max_bytes >= o.min_bytes, "bench a2a: -b ", o.min_bytes,
            " and -e ", o.max_bytes, " must satisfy 1 <= b <= e");
  MOE_CHECK(o.factor > 1.0 || o.min_bytes == o.max_bytes, "bench a2a: -f ", o.factor,
            " must be > 1");
  MOE_CHECK(o.iters >= 1 && o.warmup >= 0, "bench a2a: iters=", o.iters, " warmup=", o.warmup);
  MOE_CHECK(o.routing == "uniform" || o.routing == "skewed" || o.routing == "node-limited",
            "bench a2a: routing '", o.routing, "' (expected uniform, skewed or node-limited)");
  check_node_limit(o, nodes);
  MOE_CHECK(!o.algorithms.empty(), "bench a2a: no algorithm selected");
}

// Exactly representable stamp of (source world rank, token, column): an integer below 2^24.
float stamp(int world_rank, int64_t token, int c) {
  uint32_t v = static_cast<uint32_t>(world_rank) * 1000003u + static_cast<uint32_t>(token) * 7919u +
               static_cast<uint32_t>(c) * 104729u;
  return static_cast<float>(v & 0xFFFFFFu);
}

// k distinct experts drawn without replacement, each proportional to w among those left.
void choose_weighted(std::vector<int>& chosen, const std::vector<double>& w, int k,
                     std::vector<char>& taken, Rng& rng) {
  const int E = static_cast<int>(w.size());
  double left = 0;
  for (int e = 0; e < E; ++e) left += w[e];
  for (int j = 0; j < k; ++j) {
    double u = rng.uniform() * left;
    int pick = -1;
    for (int e = 0; e < E; ++e) {
      if (taken[e]) continue;
      pick = e;
      if (u < w[e]) break;
      u -= w[e];
    }
    taken[pick] = 1;
    left -= w[pick];
    chosen.push_back(pick);
  }
  for (int e : chosen) taken[e] = 0;
}

// The router's group-limited choice on iid uniform scores (DeepSeek-V3: groups by top-2 sum).
void choose_group_limited(std::vector<int>& chosen, int E, int k, const kernels::math::GroupLimit& gl,
                          std::vector<float>& scores, std::vector<float>& val,
                          std::vector<int32_t>& idx, Rng& rng) {
  for (float& s : scores) s = static_cast<float>(rng.uniform());
  kernels::math::topk_row(idx.data(), val.data(), scores.data(), E, k, nullptr, gl);
  chosen.assign(idx.begin(), idx.end());
}

}  // namespace

A2aRouting make_a2a_routing(int experts, int topk, const std::string& routing, int T, int n, Rng rng,
                            int n_group, int topk_group) {
  const int E = experts, k = topk;
  const balance::LayerPlacement placement = balance::LayerPlacement::contiguous(E, n);
  std::vector<double> w(E, 1.0);
  if (routing == "skewed")
    for (int e = 0; e < E; ++e) w[e] = 1.0 / std::pow(e + 1.0, 1.2);
  // Groups of E / n_group consecutive experts; top-2 sums need two experts a group.
  const kernels::math::GroupLimit gl{n_group, topk_group, E / n_group >= 2};
  std::vector<float> scores(E), val(k);
  std::vector<int32_t> idx(k);
  std::vector<std::vector<int32_t>> by_rank_t(n), by_rank_e(n);
  std::vector<char> taken(E, 0);
  std::vector<int> chosen;
  for (int t = 0; t < T; ++t) {
    chosen.clear();
    if (routing == "node-limited") {
      choose_group_limited(chosen, E, k, gl, scores, val, idx, rng);
    } else {
      choose_weighted(chosen, w, k, taken, rng);
    }
    std::sort(chosen.begin(), chosen.end());
    for (int e : chosen) {
      by_rank_t[placement.rank_of(e)].push_back(t);
      by_rank_e[placement.rank_of(e)].push_back(e);
    }
  }
  A2aRouting r;
  for (int d = 0; d < n; ++d)
    for (size_t i = 0; i < by_rank_t[d].size(); ++i) {
      r.src_row.push_back(by_rank_t[d][i]);
      r.dst.push_back(d);
      r.tag.push_back(by_rank_e[d][i]);
      r.value.push_back(static_cast<float>(by_rank_t[d][i]));
    }
  return r;
}

A2aBenchResult run_a2a_bench(const Group& group, const Topology& topo, const A2aBenchOptions& o) {
  const int n = group.size(), me = group.rank();
  check_options(o, n, topo.num_nodes());
  const int H = o.hidden, k = o.topk;
  const balance::LayerPlacement placement = balance::LayerPlacement::contiguous(o.experts, n);
  // node-limited: the groups are the nodes (n_group = nodes); otherwise no group limit.
  const bool limited = o.routing == "node-limited";
  const int n_group = limited ? topo.num_nodes() : 1, topk_group = limited ? o.topk_group : 1;
  const int64_t row_bytes = static_cast<int64_t>(k) * H * 4;  // per token, for flat
  A2aBenchResult res;
  res.opts = o;
  res.ranks = n;
  res.topology = topo.describe();
  const std::vector<double> sweep = tools::size_sweep(static_cast<double>(o.min_bytes),
                                                      static_cast<double>(o.max_bytes), o.factor);
  for (int size_index = 0; size_index < static_cast<int>(sweep.size()); ++size_index) {
    const double want = sweep[size_index];
    const int64_t T = std::max<int64_t>(1, static_cast<int64_t>(want) / row_bytes);
    MOE_CHECK(T < (1 << 24), "bench a2a: ", T, " tokens per rank is too many (max 2^24)");
    A2aRouting rt = make_a2a_routing(o.experts, o.topk, o.routing, static_cast<int>(T), n,
                                     derive_rng(o.seed, static_cast<uint64_t>(group.world_rank()) * 4096 + size_index),
                                     n_group, topk_group);
    // Buffers (calloc), not vectors: an SMPI run folds them with smpi/auto-shared-malloc-thresh.
    Buffer<float> src(static_cast<size_t>(T) * H);
    for (int64_t t = 0; t < T; ++t)
      for (int c = 0; c < H; ++c) src[t * H + c] = stamp(group.world_rank(), t, c);
    const int np = static_cast<int>(rt.dst.size());
    for (A2a algo : o.algorithms) {
      TrafficStats stats;
      TokenExchange ex(group, topo, algo, &stats);
#ifdef MOETRAIN_SMPI
      ex.keep_staging(true);  // simulated time does not see it; the simulator's page faults do
#endif
      Buffer<float> recv;
      auto dispatch = [&](double* plan_s, double* mc_s) {
        double t0 = now_seconds();
        ExchangePlan plan = ex.plan(static_cast<int>(T), np, rt.src_row.data(), rt.dst.data(),
                                    rt.tag.data(), rt.value.data());
        double t1 = now_seconds();
        const size_t need = static_cast<size_t>(plan.num_recv) * H;
        if (recv.size() != need) recv.resize(need);
        stats.reset();
        ex.multicast(plan, src.data(), recv.data(), H);
        double t2 = now_seconds();
        if (plan_s) *plan_s = t1 - t0;
        if (mc_s) *mc_s = t2 - t1;
        return plan;
      };
      for (int w = 0; w < o.warmup; ++w) dispatch(nullptr, nullptr);
      std::vector<double> tp(o.iters), tm(o.iters), tt(o.iters);
      for (int it = 0; it < o.iters; ++it) {
        group.barrier();
        dispatch(&tp[it], &tm[it]);
        tt[it] = tp[it] + tm[it];
      }

      // One more dispatch, verified row by row; its traffic is the row's traffic.
      ExchangePlan plan = dispatch(nullptr, nullptr);
      int64_t wrong = 0;
      for (int i = 0; i < plan.num_recv; ++i) {
        int64_t t = static_cast<int64_t>(plan.recv_value[i]);
        const int32_t e = plan.recv_tag[i];
        bool ok = e >= 0 && e < o.experts && placement.rank_of(e) == me && t >= 0 && t < T &&
                  static_cast<float>(t) == plan.recv_value[i];
        int ws = group.world_rank_of(plan.recv_src_rank[i]);
        for (int c = 0; ok && o.check_rows && c < H; ++c)
          ok = recv[static_cast<size_t>(i) * H + c] == stamp(ws, t, c);
        wrong += !ok;
      }
      int64_t sums[6] = {static_cast<int64_t>(stats.inter_node_bytes()),
                         static_cast<int64_t>(stats.row_bytes(LinkClass::kIntraNode)),
                         static_cast<int64_t>(stats.row_bytes(LinkClass::kSameRank)),
                         static_cast<int64_t>(stats.inter_node_messages()), wrong,
                         plan.num_recv};
      group.allreduce_sum(sums, 6);
      std::vector<int64_t> node_rows(topo.num_nodes(), 0);
      node_rows[topo.node_of(group.world_rank())] = plan.num_recv;
      group.allreduce_sum(node_rows.data(), static_cast<int64_t>(node_rows.size()));
      int64_t rank_rows = plan.num_recv;
      group.allreduce_max(&rank_rows, 1);
      A2aBenchRow row;
      row.size = T * row_bytes;
      row.count = T;
      row.algo = algo;
      row.time_us = tools::slowest_rank_median(group, tt) * 1e6;
      row.plan_us = tools::slowest_rank_median(group, tp) * 1e6;
      row.multicast_us = tools::slowest_rank_median(group, tm) * 1e6;
      row.algbw_gbps = row.time_us > 0 ? row.size / (row.time_us * 1e-6) / 1e9 : 0;
      row.busbw_gbps = row.algbw_gbps * (n - 1) / n;
      row.inter_node_bytes = static_cast<uint64_t>(sums[0]);
      row.intra_node_bytes = static_cast<uint64_t>(sums[1]);
      row.same_rank_bytes = static_cast<uint64_t>(sums[2]);
      row.inter_node_msgs_per_rank = static_cast<double>(sums[3]) / n;
      row.wrong = sums[4] + std::llabs(sums[5] - T * k * n);  // plus rows lost or invented
      row.max_rank_recv_rows = rank_rows;
      row.max_node_recv_rows = *std::max_element(node_rows.begin(), node_rows.end());
      res.rows.push_back(row);
    }
  }
  return res;
}

std::string format_a2a_table(const A2aBenchResult& r) {
  const A2aBenchOptions& o = r.opts;
  std::ostringstream os;
  char line[320];
  os << "# moetrain bench a2a: " << r.topology << "\n";
  os << "# routing " << o.routing;
  if (o.routing == "node-limited")
    os << " (a token reaches at most " << o.topk_group << (o.topk_group == 1 ? " node)" : " nodes)");
  os << ", E " << o.experts << ", k " << o.topk << ", H " << o.hidden
     << " (fp32 rows); iters " << o.iters << ", warmup " << o.warmup << ", seed " << o.seed << "\n";
  os << "# time: plan + multicast, median over iters of the slowest rank; bytes: all ranks, one "
        "dispatch\n#\n";
  std::snprintf(line, sizeof line, "%12s %9s %8s %11s %11s %11s %15s %15s %11s %7s\n", "size",
                "count", "algo", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "inter-node(B)",
                "intra-node(B)", "inter-msg/r", "#wrong");
  os << line;
  for (const A2aBenchRow& x : r.rows) {
    std::snprintf(line, sizeof line, "%12lld %9lld %8s %11.1f %11.3f %11.3f %15llu %15llu %11.2f %7lld\n",
                  static_cast<long long>(x.size), static_cast<long long>(x.count),
                  name(x.algo), x.time_us, x.algbw_gbps, x.busbw_gbps,
                  static_cast<unsigned long long>(x.inter_node_bytes),
                  static_cast<unsigned long long>(x.intra_node_bytes), x.inter_node_msgs_per_rank,
                  static_cast<long long>(x.wrong));
    os << line;
  }
  return os.str();
}

std::string a2a_bench_json(const A2aBenchResult& r) {
  const A2aBenchOptions& o = r.opts;
  nlohmann::json j;
  j["benchmark"] = "a2a";
  j["ranks"] = r.ranks;
  j["topology"] = r.topology;
  std::vector<std::string> algos;
  for (A2a a : o.algorithms) algos.push_back(name(a));
  // clang-format off
  j["options"] = {{"min_bytes", o.min_bytes}, {"max_bytes", o.max_bytes}, {"factor", o.factor},
                  {"hidden", o.hidden},       {"experts", o.experts},     {"topk", o.topk},
                  {"algorithms", algos},      {"routing", o.routing},     {"topk_group", o.topk_group},
                  {"iters", o.iters},
                  {"warmup", o.warmup},       {"seed", o.seed},
                  {"check_rows", o.check_rows}};
  // clang-format on
  nlohmann::json rows = nlohmann::json::array();
  for (const A2aBenchRow& x : r.rows)
    rows.push_back({{"size", x.size},
                    {"count", x.count},
                    {"algo", name(x.algo)},
                    {"time_us", x.time_us},
                    {"plan_us", x.plan_us},
                    {"multicast_us", x.multicast_us},
                    {"algbw_gbps", x.algbw_gbps},
                    {"busbw_gbps", x.busbw_gbps},
                    {"inter_node_bytes", x.inter_node_bytes},
                    {"intra_node_bytes", x.intra_node_bytes},
                    {"same_rank_bytes", x.same_rank_bytes},
                    {"inter_node_msgs_per_rank", x.inter_node_msgs_per_rank},
                    {"wrong", x.wrong},
                    {"max_rank_recv_rows", x.max_rank_recv_rows},
                    {"max_node_recv_rows", x.max_node_recv_rows}});
  j["rows"] = rows;
  return j.dump(2);
}

}  // namespace moe::comm
