// rbd: X-MoE's redundancy-bypassing dispatch, and rbd-halo: the same pilots carried on HALO's rails
// (see exchange.h). Stages (A: direct + pilots, B: intra-node forward of pilots to replicas):
//   multicast  A: src[src_row[p]] -> [recv | pool]   B: pool -> pool (forward slots)   expand
//   reduce     S_rank per pool slot; B': S_rank -> pilot rank; S_node per pilot; A' = A reversed:
//              [rows | S_node] -> ret (the pilot pair's ret row holds S_node); source fold
// The two differ only in the pilot rank of (t, remote node N): rbd sends the pilot to the
// destination of t's first pair on N, so every node t reaches costs one message from each source
// to each destination rank there; rbd-halo sends it to my rail peer on N (HALO's phase II: one
// packed message per remote node), which copies it to every rank of t's pairs on N, itself only
// when it holds one of them.
#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "comm/exchange_internal.h"
#include "core/error.h"

namespace moe::comm::exchange_detail {
namespace {

// Source side: the first pair of (t, remote node N) in pair order is the pilot; it goes to the
// pilot rank (rbd: that pair's destination; on_rail: my rail peer on N), and every other rank of
// (t, N)'s pairs is a replica. Extras to each pilot rank: (pilot idx, replica rank) records.
void route_rbd_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra, bool on_rail) {
  c.pilot_pair_of.assign(c.num_pairs, -1);
  std::vector<int32_t> pilot_rank(c.num_pairs, -1), pilot_idx(c.num_pairs, -1);  // sent per pair
  c.pilots_to.assign(c.n, {});
  std::unordered_map<int64_t, int32_t> pilot_of;            // (t, N) -> pilot pair
  std::vector<std::vector<int32_t>> replicas(c.num_pairs);  // of each pilot pair, ascending
  for (int p = 0; p < c.num_pairs; ++p) {
    const int d = c.dst_rank[p], N = c.node_of[d];
    if (N == c.my_node) continue;  // direct, as flat
    auto [it, fresh] = pilot_of.try_emplace(static_cast<int64_t>(c.src_row[p]) * c.num_nodes + N, p);
    const int pp = it->second;
    if (fresh) {
      pilot_rank[p] = on_rail ? c.rail(c.me, N) : d;
      pilot_idx[p] = static_cast<int32_t>(c.pilots_to[pilot_rank[p]].size());
      c.pilots_to[pilot_rank[p]].push_back(p);
    }
    c.pilot_pair_of[p] = pp;
    pilot_rank[p] = pilot_rank[pp];
    pilot_idx[p] = pilot_idx[pp];
    if (d != pilot_rank[pp] && (replicas[pp].empty() || replicas[pp].back() != d))
      replicas[pp].push_back(d);  // pairs are grouped by dst ascending: stays sorted, unique
  }
  c.pair_ints.resize(2 * static_cast<size_t>(c.num_pairs));
  for (int p = 0; p < c.num_pairs; ++p) {
    c.pair_ints[2 * p] = pilot_rank[p];
    c.pair_ints[2 * p + 1] = pilot_idx[p];
  }
  for (int P = 0; P < c.n; ++P)
    for (size_t k = 0; k < c.pilots_to[P].size(); ++k)
      for (int q : replicas[c.pilots_to[P][k]]) {
        extra[P].push_back(static_cast<int32_t>(k));
        extra[P].push_back(q);
      }
}

// rbd stages. Receiver-side pool: [pilots that came to me | rows forwarded to me by pilot ranks].
// Long (149 lines): the stages A, B, the forwarding table, the expansion and B' are one plan over
// the same pool slots, in the order the messages travel; each step reads the slots the one before
// numbered, so it reads best top to bottom.
void build_rbd_stages(PlanContext& c, Impl& im) {
  c.recv_pilot_rank.resize(im.num_recv);
  c.recv_pilot_idx.resize(im.num_recv);
  for (int i = 0; i < im.num_recv; ++i) {
    c.recv_pilot_rank[i] = c.recv_pair_ints[2 * static_cast<size_t>(i)];
    c.recv_pilot_idx[i] = c.recv_pair_ints[2 * static_cast<size_t>(i) + 1];
  }
  const int n = c.n, me = c.me, num_recv = im.num_recv;
  // Stage A: direct rows to the ranks of my node, one pilot row per (t, remote node).
  Stage& A = im.rbd_a;
  A.tag = kTagRbdA;
  for (int d = 0; d < n; ++d) {
    if (d == me) {
      A.self_in = pair_range(im, me);
      A.self_out = recv_range(im, me);
    } else if (c.node_of[d] == c.my_node) {
      if (im.send_count[d]) A.sends.push_back({d, pair_range(im, d)});
    } else if (!c.pilots_to[d].empty()) {
      A.sends.push_back({d, c.pilots_to[d]});
    }
  }
  // Pilots arriving here: pool slots [0, num_pin), by (source, pilot idx).
  std::vector<int> pilot_base(n, 0);
  int num_pin = 0;
  for (int s = 0; s < n; ++s) {
    pilot_base[s] = num_pin;
    if (s == me) continue;
    if (c.node_of[s] == c.my_node) {
      if (im.recv_count[s]) A.recvs.push_back({s, recv_range(im, s)});
      continue;
    }
    // Pilots from s: the highest pilot idx of my pairs from s or of s's replica records (an
    // rbd-halo rail rank holds pilots none of whose pairs are its own).
    int m = 0;
    for (int i = im.recv_off[s]; i < im.recv_off[s] + im.recv_count[s]; ++i) {
      MOE_CHECK(c.recv_pilot_rank[i] >= 0 && c.node_of[c.recv_pilot_rank[i]] == c.my_node,
                "TokenExchange::plan (rbd): inconsistent pilot rank ", c.recv_pilot_rank[i],
                " from group rank ", s);
      if (c.recv_pilot_rank[i] == me) m = std::max(m, c.recv_pilot_idx[i] + 1);
    }
    const std::vector<int32_t>& x = c.extra_in[s];
    for (size_t k = 0; k + 1 < x.size(); k += 2) {
      MOE_CHECK(x[k] >= 0, "TokenExchange::plan (rbd): inconsistent replica record from group rank ", s);
      m = std::max(m, x[k] + 1);
    }
    if (m) A.recvs.push_back({s, iota_vec(m, num_recv + num_pin)});
    num_pin += m;
  }
  im.num_pilots_in = num_pin;
  im.rbd_a_back = A.reversed(kTagRbdABack);  // [rows | S_node] -> ret (S_node into pilot rows)

  // Replicas of the pilots I hold, from the sources' extras.
  std::vector<std::vector<int>> replicas_of(num_pin);  // ascending ranks
  for (int s = 0; s < n; ++s) {
    const std::vector<int32_t>& x = c.extra_in[s];
    for (size_t k = 0; k + 1 < x.size(); k += 2) {
      const int idx = x[k], q = x[k + 1];
      MOE_CHECK(c.node_of[s] != c.my_node && idx >= 0 && pilot_base[s] + idx < num_pin && q >= 0 &&
                    q < n && q != me && c.node_of[q] == c.my_node,
                "TokenExchange::plan (rbd): inconsistent replica record from group rank ", s);
      replicas_of[pilot_base[s] + idx].push_back(q);
    }
  }
  // Stage B: one copy per (pilot, replica rank), inside the node.
  Stage& B = im.rbd_b;
  B.tag = kTagRbdB;
  std::vector<std::vector<int32_t>> fwd_to(n);  // pilot slots forwarded to each rank
  for (int k = 0; k < num_pin; ++k)
    for (int q : replicas_of[k]) fwd_to[q].push_back(k);
  for (int q = 0; q < n; ++q)
    if (!fwd_to[q].empty()) {
      std::vector<int32_t> v;
      for (int32_t k : fwd_to[q]) v.push_back(num_recv + k);
      B.sends.push_back({q, std::move(v)});
    }
  // Forwarded to me: distinct (pilot rank, source, pilot idx) of my remote pairs whose pilot is on
  // another rank; pool slots after the pilots, sorted so (source, idx) ascending per pilot rank,
  // which is the pilot rank's send order.
  struct Key {
    int P, s, idx;
    auto operator<=>(const Key&) const = default;
  };
  std::vector<Key> keys;
  for (int i = 0; i < num_recv; ++i)
    if (c.recv_pilot_rank[i] >= 0 && c.recv_pilot_rank[i] != me)
      keys.push_back({c.recv_pilot_rank[i], c.recv_src_rank[i], c.recv_pilot_idx[i]});
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  for (size_t k = 0; k < keys.size();) {
    std::vector<int32_t> v;
    size_t e = k;
    for (; e < keys.size() && keys[e].P == keys[k].P; ++e) v.push_back(num_recv + num_pin + static_cast<int32_t>(e));
    B.recvs.push_back({keys[k].P, std::move(v)});
    k = e;
  }
  im.num_pool = num_pin + static_cast<int>(keys.size());

  // Expansion: every remote pair takes its row from its pool slot; per slot, its pairs in
  // canonical order (= the source's pair order: S_rank folds them so).
  std::vector<int> slot_off(im.num_pool + 1, 0);
  for (int i = 0; i < num_recv; ++i) {
    if (c.recv_pilot_rank[i] < 0) continue;
    const int s = c.recv_src_rank[i];
    int slot;
    if (c.recv_pilot_rank[i] == me) {
      slot = pilot_base[s] + c.recv_pilot_idx[i];
    } else {
      Key key{c.recv_pilot_rank[i], s, c.recv_pilot_idx[i]};
      slot = num_pin + static_cast<int>(std::lower_bound(keys.begin(), keys.end(), key) - keys.begin());
    }
    im.expand_slot.push_back(slot);
    im.expand_row.push_back(i);
    slot_off[slot + 1]++;
  }
  std::partial_sum(slot_off.begin(), slot_off.end(), slot_off.begin());
  im.slot_pair_off.assign(slot_off.begin(), slot_off.end());
  im.slot_pairs.resize(im.expand_row.size());
  std::vector<int> fill(slot_off.begin(), slot_off.end() - 1);
  for (size_t k = 0; k < im.expand_row.size(); ++k)
    im.slot_pairs[fill[im.expand_slot[k]]++] = im.expand_row[k];

  // Reduce, B': replicas send S_rank of their forwarded slots to the pilot rank ([rows | S_rank]
  // has the same indices as B's receives); the pilot rank takes one contribution per
  // (pilot, replica) into contrib rows.
  Stage& Bb = im.rbd_b_back;
  Bb.tag = kTagRbdBBack;
  Bb.sends = B.recvs;
  std::vector<std::vector<std::pair<int, int32_t>>> parts(num_pin);  // (rank, [S_rank|contrib] idx)
  for (int k = 0; k < num_pin; ++k)                                  // my S_rank, when I hold pairs of the pilot's row
    if (im.slot_pair_off[k + 1] > im.slot_pair_off[k]) parts[k].push_back({me, k});
  int num_contrib = 0;
  for (const Msg& m : B.sends) {
    std::vector<int32_t> v;
    for (int32_t x : m.idx) {
      parts[x - num_recv].push_back({m.peer, im.num_pool + num_contrib});
      v.push_back(num_contrib++);
    }
    Bb.recvs.push_back({m.peer, std::move(v)});
  }
  im.num_contrib = num_contrib;
  // S_node of each pilot: the node's contributions, ranks ascending.
  im.contrib_off.assign(1, 0);
  for (int k = 0; k < num_pin; ++k) {
    MOE_CHECK(!parts[k].empty(), "TokenExchange::plan (rbd): pilot ", k, " reaches no rank");
    std::sort(parts[k].begin(), parts[k].end());
    for (auto& [rank, x] : parts[k]) im.contrib_idx.push_back(x);
    im.contrib_off.push_back(static_cast<int32_t>(im.contrib_idx.size()));
  }
}

class RbdAlgorithm final : public Algorithm {
 public:
  explicit RbdAlgorithm(bool on_rail) : on_rail_(on_rail) {}
  int ints_per_pair() const override { return 2; }  // pilot rank, pilot idx
  bool sums_in_network() const override { return true; }
  void route_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra) const override {
    route_rbd_sources(c, extra, on_rail_);
  }
  void build_stages(PlanContext& c, Impl& im) const override { build_rbd_stages(c, im); }
  bool metadata_by_rails() const override { return on_rail_; }  // rbd-halo

  void multicast(const ExchangeRun& run, const float* src, float* recv, int H) const override {
    const Impl& im = run.im;
    const RowSpace src_by_pair = space(src, im.num_send_pairs, im.src_row.data());
    Rows pool = run.rows(static_cast<size_t>(im.num_pool) * H);
    RowSpace recv_pool = space(recv, im.num_recv, nullptr, pool.data());
    StageRun a(run), b(run);
    a.post(im.rbd_a, src_by_pair, recv_pool, H);
    a.receive();
    b.post(im.rbd_b, recv_pool, recv_pool, H);
    b.receive();
    a.finish();
    b.finish();
    if (run.copy_rows)
      for (size_t k = 0; k < im.expand_row.size(); ++k)
        copy_row(recv + static_cast<int64_t>(im.expand_row[k]) * H,
                 pool.data() + static_cast<int64_t>(im.expand_slot[k]) * H, H);
  }

  void return_rows(const ExchangeRun& run, const float* rows, float* ret, int H) const override {
    const Impl& im = run.im;
    // With a fold key every pair's row comes back on its own: sums by node would break its order.
    if (im.keyed_fold) return return_rows_flat(run, rows, ret, H);
    // S_rank per pool slot (my pairs of one (source, row) on this node), pair order.
    Rows srank = run.rows(static_cast<size_t>(im.num_pool) * H, /*zeroed=*/run.copy_rows);  // slots without pairs: 0
    RowSpace rows_space = space(rows, im.num_recv);
    if (run.copy_rows)
      for (int k = 0; k < im.num_pool; ++k)  // (an rbd-halo rail rank's pilot may have no pairs here)
        if (im.slot_pair_off[k + 1] > im.slot_pair_off[k])
          fold_rows(srank.data() + static_cast<int64_t>(k) * H, rows_space,
                    im.slot_pairs.data() + im.slot_pair_off[k], im.slot_pair_off[k + 1] - im.slot_pair_off[k], H);
    // Replicas' S_rank to the pilot rank (intra-node).
    Rows contrib = run.rows(static_cast<size_t>(im.num_contrib) * H);
    StageRun b(run), a(run);
    b.post(im.rbd_b_back, space(rows, im.num_recv, nullptr, srank.data()),
           space(contrib.data(), im.num_contrib), H);
    b.receive();
    // S_node per pilot: the node's ranks ascending.
    Rows snode = run.rows(static_cast<size_t>(im.num_pilots_in) * H);
    RowSpace parts = space(srank.data(), im.num_pool, nullptr, contrib.data());
    if (run.copy_rows)
      for (int k = 0; k < im.num_pilots_in; ++k)
        fold_rows(snode.data() + static_cast<int64_t>(k) * H, parts,
                  im.contrib_idx.data() + im.contrib_off[k], im.contrib_off[k + 1] - im.contrib_off[k], H);
    // One row per (row, node) back across nodes; same-node pairs back individually.
    a.post(im.rbd_a_back, space(rows, im.num_recv, nullptr, snode.data()),
           space(ret, im.num_send_pairs), H);
    a.finish();
    b.finish();
  }

 private:
  bool on_rail_;
};

}  // namespace

const Algorithm& rbd_algorithm() {
  static const RbdAlgorithm algo(false);
  return algo;
}

const Algorithm& rbd_halo_algorithm() {
  static const RbdAlgorithm algo(true);
  return algo;
}

}  // namespace moe::comm::exchange_detail
