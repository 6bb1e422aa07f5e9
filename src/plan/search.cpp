// The search over layouts. See search.h.
#include "plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/error.h"

namespace moe::plan {
namespace {

std::vector<int> divisors(long long n, long long limit) {
  std::vector<int> d;
  for (long long i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) d.push_back(static_cast<int>(i));
  return d;
}

std::string gb(double bytes) { return str_cat(std::round(bytes / 1e8) / 10, " GB"); }

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else std::snprintf(buf, sizeof buf, "%.0f kB", bytes / 1e3);
  return buf;
}

int ranks_on_node(const ClusterProfile& c, const Layout& l) { return std::min(l.world(), c.ranks_per_node); }

}  // namespace

std::string check_layout(const PlanModel& m, const ClusterProfile& c, const Layout& l,
                         const TrainShape& shape, std::string* constraint) {
  auto fail = [&](const char* kind, std::string why) {
    if (constraint) *constraint = kind;
    return why;
  };
  if (l.pp < 1 || l.dp < 1 || l.ep < 1 || l.tp < 1 || l.micro_batches < 1)
    return fail("divisibility", str_cat("degrees must be >= 1 (", l.describe(), ")"));
  if (l.pp > m.layers)
    return fail("layers", str_cat("pp(", l.pp, ") exceeds the model's ", m.layers, " layers"));
  if (l.ep > 1 && m.num_moe_layers() == 0)
    return fail("divisibility", str_cat("ep(", l.ep, ") needs MoE layers; ", m.name, " has none"));
  if (m.num_moe_layers() > 0 && m.experts % l.ep != 0)
    return fail("divisibility", str_cat("ep(", l.ep, ") does not divide the ", m.experts, " routed experts"));
  if (m.heads % l.tp != 0)
    return fail("divisibility", str_cat("tp(", l.tp, ") does not divide the ", m.heads, " attention heads"));
  // The trainer's other TP splits: k/v heads, the dense FFN width, the sequence shards.
  if (m.kv_heads % l.tp != 0)
    return fail("divisibility", str_cat("tp(", l.tp, ") does not divide the ", m.kv_heads, " key/value heads"));
  if (m.layers > m.num_moe_layers() && m.dense_ffn % l.tp != 0)
    return fail("divisibility", str_cat("tp(", l.tp, ") does not divide the dense FFN width ", m.dense_ffn));
  if (shape.seq_len % l.tp != 0)
    return fail("divisibility", str_cat("tp(", l.tp, ") does not divide the sequence length ", shape.seq_len));
  if (l.tp > c.ranks_per_node)
    return fail("fast-domain", str_cat("tp(", l.tp, ") spans more than one node of ", c.ranks_per_node, " GPUs"));
  const long long fast = static_cast<long long>(c.fast_domain_nodes) * c.ranks_per_node;
  if (static_cast<long long>(l.ep) * l.tp > fast)
    return fail("fast-domain", str_cat("ep(", l.ep, ") x tp(", l.tp, ") = ", l.ep * l.tp,
                                       " ranks is beyond the fast domain of ", fast, " (",
                                       c.fast_domain_nodes, " node(s) x ", c.ranks_per_node, ")"));
  const long long D = l.data_ranks();
  if (shape.global_batch % (D * l.micro_batches) != 0)
    return fail("batch", str_cat("global batch ", shape.global_batch, " is not divisible by dp(", l.dp,
                                 ") * ep(", l.ep, ") * micro-batches(", l.micro_batches, ") = ",
                                 D * l.micro_batches));
  return "";
}

MemoryOptions layout_options(const ClusterProfile& c, const Layout& l, const TrainShape& shape,
                             const RoutingStats* routing, double imbalance) {
  MemoryOptions mo = memory_options(c, shape.precision, l.zero1);
  if (l.ep > 1) {
    if (routing) {
      // Ranks of the EP group per node, as plan/time_model.cpp's a2a_seconds counts them.
      const int r_n = std::max(1, std::min(l.ep, c.ranks_per_node / std::max(1, l.tp)));
      const Imbalance im = routing_imbalance(*routing, l.ep, r_n);
      mo.routing_imbalance = im.memory;
      mo.time_imbalance = im.time;
      mo.a2a_imbalance = r_n < l.ep ? im.node_time : im.time;
    } else {
      mo.routing_imbalance = mo.time_imbalance = mo.a2a_imbalance = imbalance;
    }
  }
  return mo;
}

Candidate evaluate_layout(const PlanModel& m, const ClusterProfile& c, const Layout& l,
                          const TrainShape& shape, const RoutingStats* routing, double imbalance) {
  const std::string why = check_layout(m, c, l, shape);
  MOE_CHECK(why.empty(), "layout ", l.describe(), ": ", why);
  if (routing && m.num_moe_layers() > 0) check_routing_matches(*routing, m.experts, m.name);
  Candidate cand;
  cand.layout = l;
  const MemoryOptions mo = layout_options(c, l, shape, routing, imbalance);
  cand.imbalance_memory = mo.routing_imbalance;
  cand.imbalance_time = mo.time_imbalance;
  cand.memory = estimate_memory(m, l, shape, mo);
  cand.time = estimate_time(m, l, shape, c, mo);
  cand.capacity = c.rank_memory(ranks_on_node(c, l));
  cand.fits = cand.memory.worst_stage().total <= cand.capacity;
  return cand;
}

// Long (121 lines): the checks of the options, the nested loops over every layout (pp, ep, tp,
// dp, micro-batches, recompute) and the ranking, kept together so the search space reads at once.
SearchResult search_plans(const PlanModel& m, const ClusterProfile& c, const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  MOE_CHECK(o.gpus >= 1, "--gpus must be >= 1, got ", o.gpus);
  if (c.nodes > 0)
    MOE_CHECK(o.gpus <= static_cast<long long>(c.nodes) * c.ranks_per_node, "--gpus ", o.gpus,
              " does not fit cluster ", c.name, ": it has ", c.nodes, " node(s) x ", c.ranks_per_node,
              " = ", static_cast<long long>(c.nodes) * c.ranks_per_node, " GPUs");
  if (o.gpus > c.ranks_per_node)
    MOE_CHECK(o.gpus % c.ranks_per_node == 0, "--gpus ", o.gpus, " is not a whole number of ",
              c.name, " nodes of ", c.ranks_per_node, " GPUs");
  MOE_CHECK(o.shape.seq_len > 0, "--seq-len must be positive, got ", o.shape.seq_len);
  MOE_CHECK(o.shape.global_batch > 0, "--global-batch must be positive, got ", o.shape.global_batch);
  if (o.routing && m.num_moe_layers() > 0) check_routing_matches(*o.routing, m.experts, m.name);

  SearchResult res;
  res.memory_options = memory_options(c, o.shape.precision, o.zero1);
  std::vector<Candidate> all;
  const bool moe = m.num_moe_layers() > 0;
  const std::vector<Recompute> recompute_modes =
      moe ? std::vector<Recompute>{Recompute::kNone, Recompute::kMoe, Recompute::kFull}
          : std::vector<Recompute>{Recompute::kNone, Recompute::kFull};
  for (int tp : divisors(o.gpus, o.max_tp)) {
    for (int ep : divisors(o.gpus / tp, o.gpus)) {
      if (ep > 1 && (!moe || m.experts % ep != 0)) {  // one entry for every pp of this ep
        Rejection rej;
        rej.family.tp = tp;
        rej.family.ep = ep;
        rej.family.pp = rej.family.dp = 0;  // any
        rej.constraint = "divisibility";
        rej.reason = moe ? str_cat("ep(", ep, ") does not divide the ", m.experts, " routed experts")
                         : str_cat("ep(", ep, ") needs MoE layers; ", m.name, " has none");
        res.rejected.push_back(rej);
        continue;
      }
      for (int pp : divisors(o.gpus / tp / ep, o.gpus)) {
        Layout fam;
        fam.tp = tp;
        fam.ep = ep;
        fam.pp = pp;
        fam.dp = o.gpus / (tp * ep * pp);
        fam.zero1 = o.zero1;
        Rejection rej;
        rej.family = fam;
        // Hard constraints of the family (M = 1 stands in for the batch check).
        std::string kind;
        std::string why = check_layout(m, c, fam, o.shape, &kind);
        if (!why.empty()) {
          rej.constraint = kind;
          rej.reason = why;
          res.rejected.push_back(rej);
          continue;
        }
        const long long b = o.shape.global_batch / fam.data_ranks();
        bool any_fit = false;
        double best_over = 1e300;
        Layout closest = fam;
        int closest_stage = 0;
        double closest_need = 0, closest_cap = 0;
        for (int M : divisors(b, o.max_micro_batches)) {
          for (Recompute rc : recompute_modes) {
            Layout l = fam;
            l.micro_batches = M;
            l.recompute = rc;
            const MemoryOptions mo = layout_options(c, l, o.shape, o.routing, o.imbalance);
            MemoryEstimate me = estimate_memory(m, l, o.shape, mo);
            ++res.evaluated;
            const double cap = c.rank_memory(ranks_on_node(c, l));
            const StageMemory& w = me.worst_stage();
            if (w.total > cap) {
              if (w.total - cap < best_over) {
                best_over = w.total - cap;
                closest = l;
                closest_stage = w.stage;
                closest_need = w.total;
                closest_cap = cap;
              }
              continue;
            }
            any_fit = true;
            // Exchange algorithms: only different when the EP group spans nodes.
            const int group_nodes = (ep * tp + c.ranks_per_node - 1) / c.ranks_per_node;
            std::vector<A2a> algos = {A2a::kFlat};
            if (ep > 1 && group_nodes > 1) algos = {A2a::kFlat, A2a::kRbd, A2a::kHalo, A2a::kRbdHalo};
            for (A2a a : algos) {
              Candidate cand;
              cand.layout = l;
              cand.layout.a2a = a;
              cand.memory = me;
              cand.time = estimate_time(m, cand.layout, o.shape, c, mo);
              cand.capacity = cap;
              cand.imbalance_memory = mo.routing_imbalance;
              cand.imbalance_time = mo.time_imbalance;
              all.push_back(std::move(cand));
              ++res.feasible;
            }
            break;  // a heavier recomputation would only be slower
          }
        }
        if (!any_fit) {
          rej.family = closest;
          rej.constraint = "memory";
          rej.over_bytes = best_over;
          rej.reason = best_over < 1e300
                           ? str_cat("stage ", closest_stage, " needs ", gb(closest_need), " > ",
                                     gb(closest_cap), (c.kind == NodeKind::kCpu ? " memory" : " HBM"), " by ",
                                     human(best_over), " even with mb=", closest.micro_batches,
                                     " recompute=", closest.recompute)
                           : str_cat("no micro-batch count divides the ", b, " sequences per data rank");
          if (best_over >= 1e300) rej.constraint = "batch";
          res.rejected.push_back(rej);
        }
      }
    }
  }
  std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
    return a.time.step < b.time.step;
  });
  if (static_cast<int>(all.size()) > o.top) all.resize(o.top);
  res.best = std::move(all);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace moe::plan
