// TokenExchange::plan: the checks, counts and metadata every algorithm shares (over the flat
// alltoall + alltoallv, or routed along HALO's rails), the source fold program, then the
// algorithm's own stages (exchange_internal.h's Algorithm).
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "comm/exchange.h"
#include "comm/exchange_internal.h"
#include "core/error.h"
#include "core/timer.h"

namespace moe::comm {
namespace {

using namespace exchange_detail;

int32_t float_bits(float v) {
  int32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
float bits_float(int32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// The first group rank whose world rank lies outside the topology, or -1.
int rank_outside_topology(const Group& g, const Topology& topo) {
  for (int r = 0; r < g.size(); ++r)
    if (g.world_rank_of(r) >= topo.world_size) return r;
  return -1;
}

// plan()'s counts and metadata routed like HALO's rows (halo, rbd-halo). Block (s -> d) is s's 3
// counts for d, then its mc[d] metadata ints. Phase I: my blocks to the ranks of my node, one
// message each. Phase II: to my rail peer on each remote node, one message holding my blocks to
// every rank there (ascending). Phase III: a rail rank forwards what came to it, one message per
// rank of its node holding that rank's blocks from its rail sources (ascending). Phases I and II
// are posted together, so the depth is two messages, as the flat alltoall + alltoallv; a rank
// sends (ranks per node - 1) + (nodes - 1) + (ranks per node - 1) messages instead of 2 (n - 1).
// Received sizes are probed (Group::probe_int32), then every receive of a phase is posted at
// once: the counts come with the rows. Output as the flat path's: counts_in [3n], meta_in with
// md_in[s] the offset of source s's ints.
// Long (124 lines): one protocol of three phases whose lambdas share the message buffers, the
// receive requests and the per-source blocks; cut apart, each piece would take them all as
// arguments.
void rails_metadata_exchange(const Group& g, const PlanContext& c, int rec,
                             const std::vector<int32_t>& counts_out,
                             const std::vector<int32_t>& meta_out, const std::vector<int>& mc_out,
                             const std::vector<int>& md_out, std::vector<int32_t>& counts_in,
                             std::vector<int32_t>& meta_in, std::vector<int>& md_in,
                             TrafficStats* stats, const std::vector<LinkClass>& link_to) {
  const int n = c.n, me = c.me, my_node = c.my_node;
  const std::vector<int>& local = c.members[my_node];
  auto append_block = [&](std::vector<int32_t>& msg, int d) {
    msg.insert(msg.end(), counts_out.begin() + 3 * d, counts_out.begin() + 3 * d + 3);
    msg.insert(msg.end(), meta_out.begin() + md_out[d], meta_out.begin() + md_out[d] + mc_out[d]);
  };
  // Takes one block at pos of a received message (checked: a short or garbled message throws).
  auto take_block = [&](const std::vector<int32_t>& msg, size_t& pos, int s, int d) {
    MOE_CHECK(pos + 3 <= msg.size(), "TokenExchange::plan: metadata of group rank ", s, " for ",
              d, " is cut short");
    const int32_t pairs = msg[pos], extra = msg[pos + 1];
    MOE_CHECK(pairs >= 0 && extra >= 0 && pos + 3 + static_cast<size_t>(pairs) * rec + extra <= msg.size(),
              "TokenExchange::plan: metadata of group rank ", s, " for ", d, " is garbled");
    const size_t end = pos + 3 + static_cast<size_t>(pairs) * rec + extra;
    std::vector<int32_t> block(msg.begin() + pos, msg.begin() + end);
    pos = end;
    return block;
  };
  std::vector<std::vector<int32_t>> from(n);   // from[s]: s's block to me
  std::deque<std::vector<int32_t>> sent, got;  // message buffers (stable addresses)
  std::vector<Request> sreqs;
  auto post = [&](std::vector<int32_t> msg, int peer, int tag) {
    sent.push_back(std::move(msg));
    sreqs.push_back(g.isend(sent.back().data(), static_cast<int64_t>(sent.back().size()), peer, tag));
    if (stats) stats->add(link_to[peer], sent.back().size() * sizeof(int32_t), true);
  };
  // Receives from these peers, all posted before any is waited for (sizes probed first).
  auto receive = [&](const std::vector<int>& peers, int tag) {
    std::vector<Request> r;
    std::vector<std::vector<int32_t>*> bufs;
    for (int p : peers) {
      got.emplace_back(static_cast<size_t>(g.probe_int32(p, tag)));
      r.push_back(g.irecv(got.back().data(), static_cast<int64_t>(got.back().size()), p, tag));
      bufs.push_back(&got.back());
    }
    return std::make_pair(std::move(r), std::move(bufs));
  };
  // Phase I and II, posted together.
  std::vector<int> local_peers;
  for (int d : local) {
    if (d == me) continue;
    local_peers.push_back(d);
    std::vector<int32_t> msg;
    append_block(msg, d);
    post(std::move(msg), d, kTagMeta1);
  }
  append_block(from[me], me);
  for (int N = 0; N < c.num_nodes; ++N) {
    if (N == my_node || c.members[N].empty()) continue;
    std::vector<int32_t> msg;
    for (int d : c.members[N]) append_block(msg, d);
    post(std::move(msg), c.rail(me, N), kTagMeta2);
  }
  // Remote sources that reach my node through rail rank R, ascending.
  auto rail_sources = [&](int R) {
    std::vector<int> v;
    for (int s = 0; s < n; ++s)
      if (c.node_of[s] != my_node && c.rail(s, my_node) == R) v.push_back(s);
    return v;
  };
  const std::vector<int> mine = rail_sources(me);
  auto [r2, in2] = receive(mine, kTagMeta2);
  auto [r1, in1] = receive(local_peers, kTagMeta1);
  // Phase II in, phase III out: my rail sources' blocks to each rank of my node.
  wait_all(r2);
  std::vector<std::vector<int32_t>> forward(local.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const int s = mine[i];
    const std::vector<int32_t>& msg = *in2[i];
    size_t pos = 0;
    for (size_t j = 0; j < local.size(); ++j) {
      std::vector<int32_t> block = take_block(msg, pos, s, local[j]);
      if (local[j] == me) from[s] = std::move(block);
      else forward[j].insert(forward[j].end(), block.begin(), block.end());
    }
    MOE_CHECK(pos == msg.size(), "TokenExchange::plan: rail metadata of group rank ", s,
              " is longer than its blocks");
  }
  if (!mine.empty())
    for (size_t j = 0; j < local.size(); ++j)
      if (local[j] != me) post(std::move(forward[j]), local[j], kTagMeta3);
  // Phase III in (from the rail ranks of my node that have rail sources), then phase I.
  std::vector<int> rails;
  std::vector<std::vector<int>> sources_of;  // sources_of[i]: rails[i]'s rail sources
  for (int R : local_peers) {
    std::vector<int> v = rail_sources(R);
    if (v.empty()) continue;
    rails.push_back(R);
    sources_of.push_back(std::move(v));
  }
  auto [r3, in3] = receive(rails, kTagMeta3);
  wait_all(r1);
  wait_all(r3);
  for (size_t i = 0; i < local_peers.size(); ++i) {
    const int s = local_peers[i];
    size_t pos = 0;
    from[s] = take_block(*in1[i], pos, s, me);
    MOE_CHECK(pos == in1[i]->size(), "TokenExchange::plan: metadata of group rank ", s,
              " is longer than its block");
  }
  for (size_t i = 0; i < rails.size(); ++i) {
    size_t pos = 0;
    for (int s : sources_of[i]) from[s] = take_block(*in3[i], pos, s, me);
    MOE_CHECK(pos == in3[i]->size(), "TokenExchange::plan: forwarded metadata from group rank ",
              rails[i], " is longer than its blocks");
  }
  wait_all(sreqs);
  size_t total = 0;
  for (int s = 0; s < n; ++s) total += from[s].size() - 3;
  meta_in.assign(total, 0);
  size_t off = 0;
  for (int s = 0; s < n; ++s) {
    std::copy(from[s].begin(), from[s].begin() + 3, counts_in.begin() + 3 * s);
    md_in[s] = static_cast<int>(off);
    std::copy(from[s].begin() + 3, from[s].end(), meta_in.begin() + off);
    off += from[s].size() - 3;
  }
}

// Why a rank's pairs are unusable ("" when fine). Checked before any communication.
std::string validate_pairs(const Group& g, const Topology& topo, int num_src_rows, int num_pairs,
                           const int32_t* src_row, const int32_t* dst_rank) {
  const int n = g.size();
  if (num_src_rows < 0 || num_pairs < 0)
    return str_cat("num_src_rows ", num_src_rows, " and num_pairs ", num_pairs, " must be >= 0");
  if (num_pairs > 0 && (!src_row || !dst_rank)) return "src_row and dst_rank must not be null";
  for (int p = 0; p < num_pairs; ++p) {
    if (dst_rank[p] < 0 || dst_rank[p] >= n)
      return str_cat("dst_rank[", p, "] = ", dst_rank[p], " out of range [0, ", n, ")");
    if (p > 0 && dst_rank[p] < dst_rank[p - 1])
      return str_cat("dst_rank[", p, "] = ", dst_rank[p], " after dst_rank[", p - 1, "] = ",
                     dst_rank[p - 1], ": pairs must be grouped by dst_rank ascending");
    if (src_row[p] < 0 || src_row[p] >= num_src_rows)
      return str_cat("src_row[", p, "] = ", src_row[p], " out of range [0, ", num_src_rows, ")");
  }
  if (const int r = rank_outside_topology(g, topo); r >= 0)
    return str_cat("group rank ", r, " is world rank ", g.world_rank_of(r), ", outside the topology of ",
                   topo.world_size, " ranks");
  return "";
}

// The source-side fold of reduce: per row t, its pairs by node ascending, rank ascending, pair
// order (rbd: a remote node's S_node arrives ready in its pilot pair's row). With a fold key: one
// node entry per pair (each pair's row added on its own), in ascending key order.
void build_fold_program(const PlanContext& c, int num_src_rows, bool sums_in_network, const int32_t* fold_key, Impl& im) {
  std::vector<int> row_off(num_src_rows + 1, 0);
  for (int p = 0; p < c.num_pairs; ++p) row_off[c.src_row[p] + 1]++;
  std::partial_sum(row_off.begin(), row_off.end(), row_off.begin());
  std::vector<int32_t> by_row(c.num_pairs);
  std::vector<int> fill(row_off.begin(), row_off.end() - 1);
  for (int p = 0; p < c.num_pairs; ++p) by_row[fill[c.src_row[p]]++] = p;
  auto node_of_pair = [&](int32_t p) { return c.node_of[c.dst_rank[p]]; };
  im.node_off.assign(1, 0);
  im.rank_off.assign(1, 0);
  im.pair_off.assign(1, 0);
  for (int t = 0; t < num_src_rows; ++t) {
    auto b = by_row.begin() + row_off[t], e = by_row.begin() + row_off[t + 1];
    if (fold_key) {
      std::stable_sort(b, e, [&](int32_t x, int32_t y) { return fold_key[x] < fold_key[y]; });
      for (auto it = b; it != e; ++it) {
        im.node_row.push_back(-1);
        im.fold_pairs.push_back(*it);
        im.pair_off.push_back(static_cast<int32_t>(im.fold_pairs.size()));
        im.rank_off.push_back(static_cast<int32_t>(im.pair_off.size() - 1));
      }
      im.node_off.push_back(static_cast<int32_t>(im.node_row.size()));
      continue;
    }
    std::stable_sort(b, e, [&](int32_t x, int32_t y) {
      return node_of_pair(x) != node_of_pair(y) ? node_of_pair(x) < node_of_pair(y)
                                                : c.dst_rank[x] < c.dst_rank[y];
    });
    for (auto it = b; it != e;) {
      const int N = node_of_pair(*it);
      auto node_end = std::find_if(it, e, [&](int32_t p) { return node_of_pair(p) != N; });
      if (sums_in_network && N != c.my_node) {
        im.node_row.push_back(c.pilot_pair_of[*it]);
      } else {
        im.node_row.push_back(-1);
        for (auto r = it; r != node_end;) {
          const int d = c.dst_rank[*r];
          for (; r != node_end && c.dst_rank[*r] == d; ++r) im.fold_pairs.push_back(*r);
          im.pair_off.push_back(static_cast<int32_t>(im.fold_pairs.size()));
        }
      }
      im.rank_off.push_back(static_cast<int32_t>(im.pair_off.size() - 1));
      it = node_end;
    }
    im.node_off.push_back(static_cast<int32_t>(im.node_row.size()));
  }
}

// The context every algorithm plans in: the pairs, and the group's ranks by node.
PlanContext plan_context(const Group& g, const Topology& topo, int num_pairs, const int32_t* src_row,
                         const int32_t* dst_rank) {
  const int n = g.size();
  PlanContext c;
  c.n = n;
  c.me = g.rank();
  c.num_nodes = topo.num_nodes();
  c.num_pairs = num_pairs;
  c.src_row = src_row;
  c.dst_rank = dst_rank;
  c.node_of.resize(n);
  c.members.resize(c.num_nodes);
  c.local_index.resize(n);
  for (int r = 0; r < n; ++r) {
    c.node_of[r] = topo.node_of(g.world_rank_of(r));
    c.local_index[r] = static_cast<int>(c.members[c.node_of[r]].size());
    c.members[c.node_of[r]].push_back(r);
  }
  c.my_node = c.node_of[c.me];
  return c;
}

// The received metadata (per source s, at md_in[s]: per pair tag, value, the algorithm's ipp ints,
// then counts_in[3 s + 1] extra ints) into the plan's receive side and the context.
void unpack_metadata(const Impl& im, int ipp, const std::vector<int32_t>& counts_in,
                     const std::vector<int32_t>& meta_in, const std::vector<int>& md_in,
                     ExchangePlan& out, PlanContext& c) {
  const int n = im.n, num_recv = im.num_recv;
  out.recv_tag.resize(num_recv);
  out.recv_value.resize(num_recv);
  out.recv_src_rank.resize(num_recv);
  c.recv_pair_ints.resize(static_cast<size_t>(num_recv) * ipp);
  c.extra_in.resize(n);
  for (int s = 0; s < n; ++s) {
    const int32_t* in = meta_in.data() + md_in[s];
    for (int k = 0; k < im.recv_count[s]; ++k) {
      const int i = im.recv_off[s] + k;
      out.recv_tag[i] = *in++;
      out.recv_value[i] = bits_float(*in++);
      out.recv_src_rank[i] = s;
      for (int j = 0; j < ipp; ++j) c.recv_pair_ints[static_cast<size_t>(i) * ipp + j] = *in++;
    }
    c.extra_in[s].assign(in, in + counts_in[3 * s + 1]);
  }
  c.recv_src_rank = out.recv_src_rank;
}

}  // namespace

ExchangePlan TokenExchange::plan(int num_src_rows, int num_pairs, const int32_t* src_row,
                                 const int32_t* dst_rank, const int32_t* tag,
                                 const float* value, const int32_t* fold_key) const {
  ScopedTimer timer(seconds_of(stats_));
  const Group& g = group_;
  MOE_CHECK(g.valid(), "TokenExchange::plan: invalid group");
  const int n = g.size(), me = g.rank();
  const Algorithm& algo = algorithm_of(algo_);
  const int ipp = algo.ints_per_pair();

  // The counts also carry an "invalid input" flag: every rank learns of a bad rank in that one
  // exchange and all of them throw (none is left waiting in the next one).
  const std::string bad = validate_pairs(g, topo_, num_src_rows, num_pairs, src_row, dst_rank);
  const bool by_rails = algo.metadata_by_rails() && rank_outside_topology(g, topo_) < 0;
  std::vector<int32_t> counts_out(3 * n, 0), counts_in(3 * n);
  auto check_flags = [&] {
    if (!bad.empty())
      throw Error(str_cat("TokenExchange::plan (group rank ", me, " of ", n, "): ", bad));
    std::string others;
    for (int r = 0; r < n; ++r)
      if (counts_in[3 * r + 2]) others += str_cat(others.empty() ? "" : ", ", r);
    if (!others.empty())
      throw Error(str_cat("TokenExchange::plan: invalid pairs on group rank(s) ", others,
                          " (see that rank's error)"));
  };
  auto exchange_counts = [&] {
    g.alltoall(counts_out.data(), counts_in.data(), 3);
    if (stats_)
      for (int d = 0; d < n; ++d)
        stats_->add(topo_.link(g.world_rank(), g.world_rank_of(d)), 3 * sizeof(int32_t), true);
    check_flags();
  };
  if (!bad.empty() && !by_rails) {
    for (int d = 0; d < n; ++d) counts_out[3 * d + 2] = 1;
    exchange_counts();  // throws
  }

  PlanContext c = plan_context(g, topo_, num_pairs, src_row, dst_rank);
  auto im = std::make_shared<Impl>();
  im->algo = algo_;
  im->n = n;
  im->me = me;
  im->num_src_rows = num_src_rows;
  im->num_send_pairs = num_pairs;
  im->link_to.resize(n);
  for (int r = 0; r < n; ++r) im->link_to[r] = topo_.link(g.world_rank(), g.world_rank_of(r));
  const int rec = 2 + ipp;  // ints per pair in the metadata: tag, value, the algorithm's
  std::vector<int> mc_out(n, 0), mc_in(n), md_out(n, 0), md_in(n);
  std::vector<int32_t> meta_out, meta_in;
  if (!bad.empty()) {  // by rails: the flags travel the rails, then every rank throws
    for (int d = 0; d < n; ++d) counts_out[3 * d + 2] = 1;
    rails_metadata_exchange(g, c, rec, counts_out, meta_out, mc_out, md_out, counts_in, meta_in,
                            md_in, stats_, im->link_to);
    check_flags();  // throws
  }
  im->src_row.assign(src_row, src_row + num_pairs);
  im->send_count.assign(n, 0);
  for (int p = 0; p < num_pairs; ++p) im->send_count[dst_rank[p]]++;
  im->send_off = offsets_of(im->send_count);

  std::vector<std::vector<int32_t>> extra(n);  // the algorithm's extra ints to each rank
  algo.route_sources(c, extra);

  // ---- counts (pairs, extra ints, invalid-input flag) and per-pair metadata (tag, value, the
  // algorithm's ints) + extras, per rank ----
  for (int d = 0; d < n; ++d) {
    counts_out[3 * d] = im->send_count[d];
    counts_out[3 * d + 1] = static_cast<int32_t>(extra[d].size());
    mc_out[d] = im->send_count[d] * rec + static_cast<int>(extra[d].size());
  }
  md_out = offsets_of(mc_out);
  meta_out.resize(n ? md_out[n - 1] + mc_out[n - 1] : 0);
  for (int d = 0; d < n; ++d) {
    int32_t* o = meta_out.data() + md_out[d];
    for (int p = im->send_off[d]; p < im->send_off[d] + im->send_count[d]; ++p) {
      *o++ = tag ? tag[p] : 0;
      *o++ = float_bits(value ? value[p] : 0.0f);
      for (int k = 0; k < ipp; ++k) *o++ = c.pair_ints[static_cast<size_t>(p) * ipp + k];
    }
    std::copy(extra[d].begin(), extra[d].end(), o);
  }
  if (by_rails) {
    rails_metadata_exchange(g, c, rec, counts_out, meta_out, mc_out, md_out, counts_in, meta_in,
                            md_in, stats_, im->link_to);
    check_flags();
  } else {
    exchange_counts();
    for (int s = 0; s < n; ++s) mc_in[s] = counts_in[3 * s] * rec + counts_in[3 * s + 1];
    md_in = offsets_of(mc_in);
    meta_in.resize(n ? md_in[n - 1] + mc_in[n - 1] : 0);
    g.alltoallv(meta_out.data(), mc_out, md_out, meta_in.data(), mc_in, md_in);
    if (stats_)
      for (int d = 0; d < n; ++d)
        if (mc_out[d]) stats_->add(im->link_to[d], mc_out[d] * sizeof(int32_t), true);
  }
  im->recv_count.assign(n, 0);
  for (int s = 0; s < n; ++s) im->recv_count[s] = counts_in[3 * s];
  im->recv_off = offsets_of(im->recv_count);
  const int num_recv = n ? im->recv_off[n - 1] + im->recv_count[n - 1] : 0;
  im->num_recv = num_recv;

  ExchangePlan out;
  out.num_src_rows = num_src_rows;
  out.num_send_pairs = num_pairs;
  out.num_recv = num_recv;
  unpack_metadata(*im, ipp, counts_in, meta_in, md_in, out, c);

  im->keyed_fold = fold_key != nullptr;
  build_fold_program(c, num_src_rows, algo.sums_in_network(), fold_key, *im);
  algo.build_stages(c, *im);
  out.impl = std::move(im);
  return out;
}

}  // namespace moe::comm
