// The token exchange: flat, rbd and halo behind one interface. See exchange.h.
//
// Every algorithm is a few "stages" of point-to-point messages (flat: one alltoallv). A stage lists,
// per peer, the rows it sends (indices into an input space) and the rows it receives (indices into
// an output space), in message order; plan() builds all of them once, so multicast/reduce only
// pack, post, wait and unpack. Spaces are [0, na) of one buffer (optionally through a row map),
// then a second buffer. Legend: n group size, H hidden, p a pair index of this rank (source side),
// i a received pair in canonical order (receiver side), t a source row, N a node id.
//
// rbd stages (A: direct + pilots, B: intra-node forward of pilots to replicas):
//   multicast  A: src[src_row[p]] -> [recv | pool]   B: pool -> pool (forward slots)   expand
//   reduce     S_rank per pool slot; B': S_rank -> pilot rank; S_node per pilot; A' = A reversed:
//              [rows | S_node] -> ret (the pilot pair's ret row holds S_node); source fold
// halo stages (I intra-node, II rail to rail, III intra-node forward):
//   multicast  I: src -> recv (posted first, waited last);  II: src -> rail pool;  III: pool -> recv
//   reduce     the same three stages reversed: rows -> ret, rows -> rail pool, rail pool -> ret
#include "comm/exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "comm/host_stage.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"

namespace moe::comm {

A2aAlgorithm parse_a2a_algorithm(const std::string& name) {
  if (name == "flat") return A2aAlgorithm::kFlat;
  if (name == "rbd") return A2aAlgorithm::kRbd;
  if (name == "halo") return A2aAlgorithm::kHalo;
  throw Error(str_cat("unknown all-to-all algorithm '", name, "' (expected flat, rbd or halo)"));
}

const char* a2a_algorithm_name(A2aAlgorithm a) {
  switch (a) {
    case A2aAlgorithm::kFlat: return "flat";
    case A2aAlgorithm::kRbd: return "rbd";
    case A2aAlgorithm::kHalo: return "halo";
  }
  return "?";
}

namespace {

// Tags of the exchange's point-to-point messages (reserved on the group's communicator).
constexpr int kTagRbdA = 30001, kTagRbdB = 30002, kTagRbdABack = 30003, kTagRbdBBack = 30004;
constexpr int kTagHalo1 = 30011, kTagHalo2 = 30012, kTagHalo3 = 30013;
constexpr int kTagHalo1Back = 30014, kTagHalo2Back = 30015, kTagHalo3Back = 30016;

// One message: the peer and the rows it carries, in message order.
struct Msg {
  int peer = -1;
  std::vector<int32_t> idx;
};

// One step of point-to-point messages; self_in[k] -> self_out[k] are rows this rank routes to
// itself (counted as a kSameRank message when self_is_message).
struct Stage {
  std::vector<Msg> sends, recvs;
  std::vector<int32_t> self_in, self_out;
  bool self_is_message = true;
  int tag = 0;

  // The same messages the other way (rows go back where they came from).
  Stage reversed(int new_tag) const {
    Stage r;
    r.sends = recvs;
    r.recvs = sends;
    r.self_in = self_out;
    r.self_out = self_in;
    r.self_is_message = self_is_message;
    r.tag = new_tag;
    return r;
  }
};

// Rows [0, na) of `a` (row map[i] of a when map is given), then rows of `b`.
struct RowSpace {
  float* a = nullptr;
  int64_t na = 0;
  const int32_t* map = nullptr;
  float* b = nullptr;
  float* row(int64_t i, int H) const {
    if (i < na) return a + static_cast<int64_t>(map ? map[i] : i) * H;
    return b + (i - na) * H;
  }
  // The first row when rows idx[0], idx[0] + 1, ... lie back to back in one buffer, else null.
  float* consecutive(const std::vector<int32_t>& idx, int H) const {
    if (idx.empty()) return nullptr;
    const int64_t first = idx[0], last = idx.back();
    if (last - first + 1 != static_cast<int64_t>(idx.size())) return nullptr;
    if (first < na && (map || last >= na)) return nullptr;
    for (size_t k = 1; k < idx.size(); ++k)
      if (idx[k] != idx[k - 1] + 1) return nullptr;
    return row(first, H);
  }
};
RowSpace space(const float* a, int64_t na = 0, const int32_t* map = nullptr,
               const float* b = nullptr) {
  return RowSpace{const_cast<float*>(a), na, map, const_cast<float*>(b)};
}

// Staging rows of one exchange: a Buffer charged to the exchange's staging tracker (when set), so
// the measured memory of a rank includes what its exchanges hold while they run.
class Rows {
 public:
  Rows() = default;
  Rows(size_t count, MemTracker* tracker) : buf_(count, tracker) {}
  float* data() { return buf_.data(); }
  size_t size() const { return buf_.size(); }

 private:
  Buffer<float> buf_;
};

void copy_row(float* dst, const float* src, int H) {
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(H));
}

// out = row(idx[0]); out = out + row(idx[k]) for k = 1.. (a left fold: the one summation order
// every algorithm shares, so their results are bit-identical).
void fold_rows(float* out, const RowSpace& in, const int32_t* idx, int count, int H) {
  copy_row(out, in.row(idx[0], H), H);
  for (int k = 1; k < count; ++k) {
    const float* r = in.row(idx[k], H);
    for (int h = 0; h < H; ++h) out[h] = out[h] + r[h];
  }
}

}  // namespace

struct ExchangePlan::Impl {
  A2aAlgorithm algo = A2aAlgorithm::kFlat;
  int n = 0, me = 0;
  int num_src_rows = 0, num_send_pairs = 0, num_recv = 0;
  std::vector<LinkClass> link_to;     // [n] link class from this rank to each group rank
  std::vector<int32_t> src_row;       // [num_send_pairs]
  std::vector<int> send_count, send_off;  // [n] pairs per destination, exclusive prefix sum
  std::vector<int> recv_count, recv_off;  // [n] pairs per source, exclusive prefix sum

  // Source-side fold, per source row t (reduce): node entries e in [node_off[t], node_off[t+1])
  // in node order; node_row[e] >= 0: S_node arrives ready in ret row node_row[e] (rbd pilots);
  // else S_node = fold over rank entries [rank_off[e], rank_off[e+1]) (ranks ascending) of
  // S_rank = fold over pairs fold_pairs[pair_off[r] .. pair_off[r+1]) (pair order).
  std::vector<int32_t> node_off, node_row, rank_off, pair_off, fold_pairs;
  bool keyed_fold = false;  // plan's fold_key: every pair's row comes back on its own (rbd: flat)

  // rbd
  Stage rbd_a, rbd_b, rbd_a_back, rbd_b_back;
  int num_pilots_in = 0, num_pool = 0, num_contrib = 0;
  std::vector<int32_t> expand_slot, expand_row;   // recv[expand_row[k]] = pool[expand_slot[k]]
  std::vector<int32_t> slot_pair_off, slot_pairs;  // [num_pool+1] CSR: recv rows of each slot
  std::vector<int32_t> contrib_off, contrib_idx;   // [num_pilots_in+1] CSR into [S_rank | contrib]

  // halo
  Stage halo1, halo2, halo3, halo1_back, halo2_back, halo3_back;
  int num_rail = 0;  // rows received rail to rail (phase II)
};

namespace {

using Impl = ExchangePlan::Impl;

// Posts a stage's receives and sends (and does its self copies). receive() waits for the
// receives only and unpacks them, so the next stage can start while this stage's sends drain;
// finish() also waits for the sends (their buffers live until then).
class StageRun {
 public:
  StageRun(const Group& g, const Impl& im, TrafficStats* stats, MemTracker* staging)
      : g_(g), im_(im), stats_(stats), staging_(staging) {}

  void post(const Stage& st, const RowSpace& in, const RowSpace& out, int H) {
    st_ = &st;
    out_ = out;
    H_ = H;
    rbuf_.resize(st.recvs.size());
    sbuf_.resize(st.sends.size());
    // A message whose rows are consecutive in one buffer goes from / lands in place: no copy.
    for (size_t m = 0; m < st.recvs.size(); ++m) {
      const Msg& msg = st.recvs[m];
      const int64_t count = static_cast<int64_t>(msg.idx.size()) * H;
      float* direct = out.consecutive(msg.idx, H);
      if (!direct) {
        rbuf_[m] = Rows(static_cast<size_t>(count), staging_);
        direct = rbuf_[m].data();
      }
      rreqs_.push_back(g_.irecv(direct, count, msg.peer, st.tag));
    }
    for (size_t m = 0; m < st.sends.size(); ++m) {
      const Msg& msg = st.sends[m];
      const int64_t count = static_cast<int64_t>(msg.idx.size()) * H;
      const float* direct = in.consecutive(msg.idx, H);
      if (!direct) {
        Rows& b = sbuf_[m];
        b = Rows(static_cast<size_t>(count), staging_);
        for (size_t k = 0; k < msg.idx.size(); ++k) copy_row(b.data() + k * H, in.row(msg.idx[k], H), H);
        direct = b.data();
      }
      sreqs_.push_back(g_.isend(direct, count, msg.peer, st.tag));
      if (stats_) stats_->add(im_.link_to[msg.peer], static_cast<uint64_t>(count) * sizeof(float));
    }
    for (size_t k = 0; k < st.self_in.size(); ++k)
      copy_row(out.row(st.self_out[k], H), in.row(st.self_in[k], H), H);
    if (stats_ && st.self_is_message && !st.self_in.empty())
      stats_->add(LinkClass::kSameRank, st.self_in.size() * H * sizeof(float));
  }

  void receive() {
    if (received_) return;
    wait_all(rreqs_);
    for (size_t m = 0; m < st_->recvs.size(); ++m) {
      if (!rbuf_[m].data()) continue;  // received in place
      const Msg& msg = st_->recvs[m];
      for (size_t k = 0; k < msg.idx.size(); ++k)
        copy_row(out_.row(msg.idx[k], H_), rbuf_[m].data() + k * H_, H_);
    }
    received_ = true;
  }

  void finish() {
    receive();
    wait_all(sreqs_);
  }

 private:
  const Group& g_;
  const Impl& im_;
  TrafficStats* stats_;
  MemTracker* staging_;
  const Stage* st_ = nullptr;
  RowSpace out_;
  int H_ = 0;
  bool received_ = false;
  std::vector<Rows> sbuf_, rbuf_;
  std::vector<Request> rreqs_, sreqs_;  // declared last: destroyed before their buffers
};

// Exclusive prefix sum.
std::vector<int> offsets_of(const std::vector<int>& counts) {
  std::vector<int> off(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) off[i] = off[i - 1] + counts[i - 1];
  return off;
}

std::vector<int> scaled(const std::vector<int>& v, int64_t f) {
  std::vector<int> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = v[i] * f;
    MOE_CHECK(x <= INT32_MAX, "TokenExchange: ", v[i], " rows x ", f,
              " elements exceed MPI's int count");
    r[i] = static_cast<int>(x);
  }
  return r;
}

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

// Source-side reduce: dst[t] += S_node(t, N) over nodes ascending (see Impl::node_off).
void source_fold(const Impl& im, const float* ret, float* dst, int H) {
  std::vector<float> s_rank(H), s_node(H);
  RowSpace rs = space(ret, im.num_send_pairs);
  for (int t = 0; t < im.num_src_rows; ++t) {
    float* d = dst + static_cast<int64_t>(t) * H;
    for (int e = im.node_off[t]; e < im.node_off[t + 1]; ++e) {
      const float* node_sum;
      if (im.node_row[e] >= 0) {
        node_sum = ret + static_cast<int64_t>(im.node_row[e]) * H;
      } else {
        for (int r = im.rank_off[e]; r < im.rank_off[e + 1]; ++r) {
          float* target = r == im.rank_off[e] ? s_node.data() : s_rank.data();
          fold_rows(target, rs, im.fold_pairs.data() + im.pair_off[r],
                    im.pair_off[r + 1] - im.pair_off[r], H);
          if (r != im.rank_off[e])
            for (int h = 0; h < H; ++h) s_node[h] = s_node[h] + s_rank[h];
        }
        node_sum = s_node.data();
      }
      for (int h = 0; h < H; ++h) d[h] = d[h] + node_sum[h];
    }
  }
}

const Impl& checked_impl(const ExchangePlan& plan, A2aAlgorithm algo, const Group& g,
                         const char* op) {
  MOE_CHECK(plan.impl, "TokenExchange::", op, ": the plan is empty (call TokenExchange::plan)");
  const Impl& im = *plan.impl;
  MOE_CHECK(im.algo == algo, "TokenExchange::", op, ": plan built for '",
            a2a_algorithm_name(im.algo), "' used with '", a2a_algorithm_name(algo), "'");
  MOE_CHECK(im.n == g.size() && im.me == g.rank(), "TokenExchange::", op,
            ": plan built on another group (rank ", im.me, " of ", im.n, ", here ", g.rank(),
            " of ", g.size(), ")");
  return im;
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
  for (int r = 0; r < n; ++r)
    if (g.world_rank_of(r) >= topo.world_size)
      return str_cat("group rank ", r, " is world rank ", g.world_rank_of(r),
                     ", outside the topology of ", topo.world_size, " ranks");
  return "";
}

// What the table builders need: where ranks sit, this rank's pairs, and what arrived with the
// metadata (per received pair, and the algorithm's extra ints per source).
struct PlanContext {
  int n = 0, me = 0, my_node = 0, num_nodes = 0;
  std::vector<int> node_of;                 // [n] node id of each group rank
  std::vector<std::vector<int>> members;    // [num_nodes] group ranks of each node, ascending
  std::vector<int> local_index;             // [n] position among its node's group ranks
  int num_pairs = 0;
  const int32_t* src_row = nullptr;         // [num_pairs]
  const int32_t* dst_rank = nullptr;        // [num_pairs]
  // rbd, source side
  std::vector<int32_t> pilot_pair_of;             // [num_pairs] pilot pair of a remote pair, else -1
  std::vector<int32_t> pilot_rank, pilot_idx;     // [num_pairs] sent with each pair
  std::vector<std::vector<int32_t>> pilots_to;    // [n] pilot pairs per pilot rank, idx order
  // halo, source side
  std::vector<std::vector<int32_t>> to_node;      // [num_nodes] my pairs to each remote node
  // receiver side
  std::vector<int32_t> recv_src_rank, recv_pilot_rank, recv_pilot_idx;  // [num_recv]
  std::vector<std::vector<int32_t>> extra_in;     // [n] extra ints from each source

  // HALO's rail peer of rank s on node N: the rank there with s's local index (modulo the
  // node's size when nodes hold different numbers of the group's ranks).
  int rail(int s, int N) const {
    const std::vector<int>& m = members[N];
    return m[local_index[s] % m.size()];
  }
};

std::vector<int32_t> iota_vec(int count, int start) {
  std::vector<int32_t> v(count);
  std::iota(v.begin(), v.end(), start);
  return v;
}
// Pair indices of my pairs to d; canonical positions of the rows from s (+ base).
std::vector<int32_t> pair_range(const Impl& im, int d) { return iota_vec(im.send_count[d], im.send_off[d]); }
std::vector<int32_t> recv_range(const Impl& im, int s, int base = 0) {
  return iota_vec(im.recv_count[s], base + im.recv_off[s]);
}

// rbd, source side: the first pair of (t, remote node N) in pair order is the pilot; the other
// pairs of (t, N) are its replicas. Extras to each pilot rank: (pilot idx, replica rank) records.
void route_rbd_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra) {
  c.pilot_pair_of.assign(c.num_pairs, -1);
  c.pilot_rank.assign(c.num_pairs, -1);
  c.pilot_idx.assign(c.num_pairs, -1);
  c.pilots_to.assign(c.n, {});
  std::unordered_map<int64_t, int32_t> pilot_of;            // (t, N) -> pilot pair
  std::vector<std::vector<int32_t>> replicas(c.num_pairs);  // of each pilot pair, ascending
  for (int p = 0; p < c.num_pairs; ++p) {
    const int d = c.dst_rank[p], N = c.node_of[d];
    if (N == c.my_node) continue;  // direct, as flat
    auto [it, fresh] = pilot_of.try_emplace(static_cast<int64_t>(c.src_row[p]) * c.num_nodes + N, p);
    const int pp = it->second;
    if (fresh) {
      c.pilot_idx[p] = static_cast<int32_t>(c.pilots_to[d].size());
      c.pilots_to[d].push_back(p);
    }
    c.pilot_pair_of[p] = pp;
    c.pilot_rank[p] = c.dst_rank[pp];
    c.pilot_idx[p] = c.pilot_idx[pp];
    if (d != c.dst_rank[pp] && (replicas[pp].empty() || replicas[pp].back() != d))
      replicas[pp].push_back(d);  // pairs are grouped by dst ascending: stays sorted, unique
  }
  for (int P = 0; P < c.n; ++P)
    for (size_t k = 0; k < c.pilots_to[P].size(); ++k)
      for (int q : replicas[c.pilots_to[P][k]]) {
        extra[P].push_back(static_cast<int32_t>(k));
        extra[P].push_back(q);
      }
}

// halo, source side: my pairs per remote node; extras to each rail peer: the final rank of each
// row of my phase II message.
void route_halo_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra) {
  c.to_node.assign(c.num_nodes, {});
  for (int p = 0; p < c.num_pairs; ++p) {
    const int N = c.node_of[c.dst_rank[p]];
    if (N != c.my_node) c.to_node[N].push_back(p);
  }
  for (int N = 0; N < c.num_nodes; ++N)
    for (int32_t p : c.to_node[N]) extra[c.rail(c.me, N)].push_back(c.dst_rank[p]);
}

// The source-side fold of reduce: per row t, its pairs by node ascending, rank ascending, pair
// order (rbd: a remote node's S_node arrives ready in its pilot pair's row). With a fold key: one
// node entry per pair (each pair's row added on its own), in ascending key order.
void build_fold_program(const PlanContext& c, int num_src_rows, bool rbd, const int32_t* fold_key, Impl& im) {
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
      if (rbd && N != c.my_node) {
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

// rbd stages. Receiver-side pool: [pilots that came to me | rows forwarded to me by pilot ranks].
void build_rbd_stages(const PlanContext& c, Impl& im) {
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
    int m = 0;
    for (int i = im.recv_off[s]; i < im.recv_off[s] + im.recv_count[s]; ++i) {
      MOE_CHECK(c.recv_pilot_rank[i] >= 0 && c.node_of[c.recv_pilot_rank[i]] == c.my_node,
                "TokenExchange::plan (rbd): inconsistent pilot rank ", c.recv_pilot_rank[i],
                " from group rank ", s);
      if (c.recv_pilot_rank[i] == me) m = std::max(m, c.recv_pilot_idx[i] + 1);
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
  for (int k = 0; k < num_pin; ++k) parts[k].push_back({me, k});
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
    std::sort(parts[k].begin(), parts[k].end());
    for (auto& [rank, x] : parts[k]) im.contrib_idx.push_back(x);
    im.contrib_off.push_back(static_cast<int32_t>(im.contrib_idx.size()));
  }
}

// halo stages; reduce runs them reversed. Rail pool: rows that came to me rail to rail.
void build_halo_stages(const PlanContext& c, Impl& im) {
  const int n = c.n, me = c.me;
  const std::vector<int>& local = c.members[c.my_node];
  // Phase I: pairs to the ranks of my node, directly.
  Stage& S1 = im.halo1;
  S1.tag = kTagHalo1;
  for (int r : local) {
    if (r == me) {
      S1.self_in = pair_range(im, me);
      S1.self_out = recv_range(im, me);
      continue;
    }
    if (im.send_count[r]) S1.sends.push_back({r, pair_range(im, r)});
    if (im.recv_count[r]) S1.recvs.push_back({r, recv_range(im, r)});
  }
  // Phase II: one message per remote node to my rail peer there (all my pairs to that node, in
  // pair order); what comes to me lands in the rail pool by (source, row).
  Stage& S2 = im.halo2;
  S2.tag = kTagHalo2;
  for (int N = 0; N < c.num_nodes; ++N)
    if (!c.to_node[N].empty()) S2.sends.push_back({c.rail(me, N), c.to_node[N]});
  std::vector<int32_t> rail_dst;  // final rank of each rail pool row
  std::vector<int> rail_src;      // its source
  for (int s = 0; s < n; ++s) {
    const std::vector<int32_t>& x = c.extra_in[s];
    if (x.empty()) continue;
    MOE_CHECK(c.node_of[s] != c.my_node && c.rail(s, c.my_node) == me,
              "TokenExchange::plan (halo): unexpected rail message from group rank ", s);
    for (int32_t d : x)
      MOE_CHECK(d >= 0 && d < n && c.node_of[d] == c.my_node,
                "TokenExchange::plan (halo): bad destination ", d, " from group rank ", s);
    S2.recvs.push_back({s, iota_vec(static_cast<int>(x.size()), static_cast<int>(rail_dst.size()))});
    rail_dst.insert(rail_dst.end(), x.begin(), x.end());
    rail_src.insert(rail_src.end(), x.size(), s);
  }
  im.num_rail = static_cast<int>(rail_dst.size());
  // Phase III: rail rows to their final rank on my node (mine: placed locally, not a message).
  // A source's rows to one rank keep their pair order, i.e. the receiver's canonical order.
  Stage& S3 = im.halo3;
  S3.tag = kTagHalo3;
  S3.self_is_message = false;
  std::vector<int> next_in_block(n, 0);
  for (int r : local) {
    std::vector<int32_t> v;
    for (int k = 0; k < im.num_rail; ++k) {
      if (rail_dst[k] != r) continue;
      if (r == me) {
        S3.self_in.push_back(k);
        S3.self_out.push_back(im.recv_off[rail_src[k]] + next_in_block[rail_src[k]]++);
      } else {
        v.push_back(k);
      }
    }
    if (!v.empty()) S3.sends.push_back({r, std::move(v)});
  }
  for (int R : local) {
    if (R == me) continue;
    std::vector<int32_t> v;
    for (int s = 0; s < n; ++s)
      if (c.node_of[s] != c.my_node && c.rail(s, c.my_node) == R)
        for (int32_t i : recv_range(im, s)) v.push_back(i);
    if (!v.empty()) S3.recvs.push_back({R, std::move(v)});
  }
  im.halo1_back = S1.reversed(kTagHalo1Back);
  im.halo2_back = S2.reversed(kTagHalo2Back);
  im.halo3_back = S3.reversed(kTagHalo3Back);
}

}  // namespace

TokenExchange::TokenExchange(const Group& group, const Topology& topo, A2aAlgorithm algo,
                             TrafficStats* stats)
    : group_(group), topo_(topo), algo_(algo), stats_(stats) {}

ExchangePlan TokenExchange::plan(int num_src_rows, int num_pairs, const int32_t* src_row,
                                 const int32_t* dst_rank, const int32_t* tag,
                                 const float* value, const int32_t* fold_key) const {
  double unused_seconds = 0;
  ScopedTimer timer(stats_ ? stats_->seconds : unused_seconds);
  const Group& g = group_;
  MOE_CHECK(g.valid(), "TokenExchange::plan: invalid group");
  const int n = g.size(), me = g.rank();
  const bool rbd = algo_ == A2aAlgorithm::kRbd, halo = algo_ == A2aAlgorithm::kHalo;

  // The counts alltoall also carries an "invalid input" flag: every rank learns of a bad rank in
  // that one collective and all of them throw (none is left waiting in the next one).
  const std::string bad = validate_pairs(g, topo_, num_src_rows, num_pairs, src_row, dst_rank);
  std::vector<int32_t> counts_out(3 * n, 0), counts_in(3 * n);
  auto exchange_counts = [&] {
    g.alltoall(counts_out.data(), counts_in.data(), 3);
    if (stats_)
      for (int d = 0; d < n; ++d)
        stats_->add(topo_.link(g.world_rank(), g.world_rank_of(d)), 3 * sizeof(int32_t), true);
    if (!bad.empty())
      throw Error(str_cat("TokenExchange::plan (group rank ", me, " of ", n, "): ", bad));
    std::string others;
    for (int r = 0; r < n; ++r)
      if (counts_in[3 * r + 2]) others += str_cat(others.empty() ? "" : ", ", r);
    if (!others.empty())
      throw Error(str_cat("TokenExchange::plan: invalid pairs on group rank(s) ", others,
                          " (see that rank's error)"));
  };
  if (!bad.empty()) {
    for (int d = 0; d < n; ++d) counts_out[3 * d + 2] = 1;
    exchange_counts();  // throws
  }

  PlanContext c;
  c.n = n;
  c.me = me;
  c.num_nodes = topo_.num_nodes();
  c.num_pairs = num_pairs;
  c.src_row = src_row;
  c.dst_rank = dst_rank;
  c.node_of.resize(n);
  c.members.resize(c.num_nodes);
  c.local_index.resize(n);
  auto im = std::make_shared<Impl>();
  im->algo = algo_;
  im->n = n;
  im->me = me;
  im->num_src_rows = num_src_rows;
  im->num_send_pairs = num_pairs;
  im->src_row.assign(src_row, src_row + num_pairs);
  im->link_to.resize(n);
  for (int r = 0; r < n; ++r) {
    im->link_to[r] = topo_.link(g.world_rank(), g.world_rank_of(r));
    c.node_of[r] = topo_.node_of(g.world_rank_of(r));
    c.local_index[r] = static_cast<int>(c.members[c.node_of[r]].size());
    c.members[c.node_of[r]].push_back(r);
  }
  c.my_node = c.node_of[me];
  im->send_count.assign(n, 0);
  for (int p = 0; p < num_pairs; ++p) im->send_count[dst_rank[p]]++;
  im->send_off = offsets_of(im->send_count);

  std::vector<std::vector<int32_t>> extra(n);  // the algorithm's extra ints to each rank
  if (rbd) route_rbd_sources(c, extra);
  if (halo) route_halo_sources(c, extra);

  // ---- counts: (pairs, extra ints, invalid-input flag) per rank ----
  for (int d = 0; d < n; ++d) {
    counts_out[3 * d] = im->send_count[d];
    counts_out[3 * d + 1] = static_cast<int32_t>(extra[d].size());
  }
  exchange_counts();
  im->recv_count.assign(n, 0);
  for (int s = 0; s < n; ++s) im->recv_count[s] = counts_in[3 * s];
  im->recv_off = offsets_of(im->recv_count);
  const int num_recv = n ? im->recv_off[n - 1] + im->recv_count[n - 1] : 0;
  im->num_recv = num_recv;

  // ---- per-pair metadata (tag, value[, pilot rank, pilot idx]) + extras: one flat alltoallv ----
  const int rec = rbd ? 4 : 2;
  std::vector<int> mc_out(n), mc_in(n);
  for (int d = 0; d < n; ++d) mc_out[d] = im->send_count[d] * rec + static_cast<int>(extra[d].size());
  for (int s = 0; s < n; ++s) mc_in[s] = im->recv_count[s] * rec + counts_in[3 * s + 1];
  std::vector<int> md_out = offsets_of(mc_out), md_in = offsets_of(mc_in);
  std::vector<int32_t> meta_out(n ? md_out[n - 1] + mc_out[n - 1] : 0);
  std::vector<int32_t> meta_in(n ? md_in[n - 1] + mc_in[n - 1] : 0);
  for (int d = 0; d < n; ++d) {
    int32_t* o = meta_out.data() + md_out[d];
    for (int p = im->send_off[d]; p < im->send_off[d] + im->send_count[d]; ++p) {
      *o++ = tag ? tag[p] : 0;
      *o++ = float_bits(value ? value[p] : 0.0f);
      if (rbd) {
        *o++ = c.pilot_rank[p];
        *o++ = c.pilot_idx[p];
      }
    }
    std::copy(extra[d].begin(), extra[d].end(), o);
  }
  g.alltoallv(meta_out.data(), mc_out, md_out, meta_in.data(), mc_in, md_in);
  if (stats_)
    for (int d = 0; d < n; ++d)
      if (mc_out[d]) stats_->add(im->link_to[d], mc_out[d] * sizeof(int32_t), true);

  ExchangePlan out;
  out.num_src_rows = num_src_rows;
  out.num_send_pairs = num_pairs;
  out.num_recv = num_recv;
  out.recv_tag.resize(num_recv);
  out.recv_value.resize(num_recv);
  out.recv_src_rank.resize(num_recv);
  c.recv_pilot_rank.assign(num_recv, -1);
  c.recv_pilot_idx.assign(num_recv, -1);
  c.extra_in.resize(n);
  for (int s = 0; s < n; ++s) {
    const int32_t* in = meta_in.data() + md_in[s];
    for (int k = 0; k < im->recv_count[s]; ++k) {
      const int i = im->recv_off[s] + k;
      out.recv_tag[i] = *in++;
      out.recv_value[i] = bits_float(*in++);
      out.recv_src_rank[i] = s;
      if (rbd) {
        c.recv_pilot_rank[i] = *in++;
        c.recv_pilot_idx[i] = *in++;
      }
    }
    c.extra_in[s].assign(in, in + counts_in[3 * s + 1]);
  }
  c.recv_src_rank = out.recv_src_rank;

  im->keyed_fold = fold_key != nullptr;
  build_fold_program(c, num_src_rows, rbd, fold_key, *im);
  if (rbd) build_rbd_stages(c, *im);
  if (halo) build_halo_stages(c, *im);
  out.impl = std::move(im);
  return out;
}

void TokenExchange::multicast_host(const ExchangePlan& plan, const float* src, float* recv,
                                   int H) const {
  double unused_seconds = 0;
  ScopedTimer timer(stats_ ? stats_->seconds : unused_seconds);
  const Impl& im = checked_impl(plan, algo_, group_, "multicast");
  MOE_CHECK(H >= 0, "TokenExchange::multicast: H = ", H, " must be >= 0");
  if (H == 0) return;  // nothing to move (every rank passes the same H)
  const int n = im.n;
  if (algo_ == A2aAlgorithm::kFlat) {
    Rows sendbuf(static_cast<size_t>(im.num_send_pairs) * H, staging_);
    for (int p = 0; p < im.num_send_pairs; ++p)
      copy_row(sendbuf.data() + static_cast<int64_t>(p) * H, src + static_cast<int64_t>(im.src_row[p]) * H, H);
    group_.alltoallv(sendbuf.data(), scaled(im.send_count, H), scaled(im.send_off, H), recv,
                     scaled(im.recv_count, H), scaled(im.recv_off, H));
    if (stats_)
      for (int d = 0; d < n; ++d)
        if (im.send_count[d]) stats_->add(im.link_to[d], uint64_t(im.send_count[d]) * H * sizeof(float));
    return;
  }
  const RowSpace src_by_pair = space(src, im.num_send_pairs, im.src_row.data());
  if (algo_ == A2aAlgorithm::kRbd) {
    Rows pool(static_cast<size_t>(im.num_pool) * H, staging_);
    RowSpace recv_pool = space(recv, im.num_recv, nullptr, pool.data());
    StageRun a(group_, im, stats_, staging_), b(group_, im, stats_, staging_);
    a.post(im.rbd_a, src_by_pair, recv_pool, H);
    a.receive();
    b.post(im.rbd_b, recv_pool, recv_pool, H);
    b.receive();
    a.finish();
    b.finish();
    for (size_t k = 0; k < im.expand_row.size(); ++k)
      copy_row(recv + static_cast<int64_t>(im.expand_row[k]) * H,
               pool.data() + static_cast<int64_t>(im.expand_slot[k]) * H, H);
    return;
  }
  // halo: phase I posted first and waited last, overlapping II -> III.
  Rows rail(static_cast<size_t>(im.num_rail) * H, staging_);
  StageRun s1(group_, im, stats_, staging_), s2(group_, im, stats_, staging_), s3(group_, im, stats_, staging_);
  s1.post(im.halo1, src_by_pair, space(recv, im.num_recv), H);
  s2.post(im.halo2, src_by_pair, space(rail.data(), im.num_rail), H);
  s2.receive();
  s3.post(im.halo3, space(rail.data(), im.num_rail), space(recv, im.num_recv), H);
  s3.receive();
  s1.finish();
  s2.finish();
  s3.finish();
}

void TokenExchange::reduce_host(const ExchangePlan& plan, const float* rows, float* dst,
                                int H) const {
  double unused_seconds = 0;
  ScopedTimer timer(stats_ ? stats_->seconds : unused_seconds);
  const Impl& im = checked_impl(plan, algo_, group_, "reduce");
  MOE_CHECK(H >= 0, "TokenExchange::reduce: H = ", H, " must be >= 0");
  if (H == 0) return;  // nothing to move (every rank passes the same H)
  const int n = im.n;
  // ret[p]: the row of pair p back at its source (rbd: the pilot pair's row holds S_node).
  Rows ret(static_cast<size_t>(im.num_send_pairs) * H, staging_);
  if (algo_ == A2aAlgorithm::kFlat || (algo_ == A2aAlgorithm::kRbd && im.keyed_fold)) {
    group_.alltoallv(rows, scaled(im.recv_count, H), scaled(im.recv_off, H), ret.data(),
                     scaled(im.send_count, H), scaled(im.send_off, H));
    if (stats_)
      for (int s = 0; s < n; ++s)
        if (im.recv_count[s]) stats_->add(im.link_to[s], uint64_t(im.recv_count[s]) * H * sizeof(float));
  } else if (algo_ == A2aAlgorithm::kRbd) {
    // S_rank per pool slot (my pairs of one (source, row) on this node), pair order.
    Rows srank(static_cast<size_t>(im.num_pool) * H, staging_);
    RowSpace rows_space = space(rows, im.num_recv);
    for (int k = 0; k < im.num_pool; ++k)
      fold_rows(srank.data() + static_cast<int64_t>(k) * H, rows_space,
                im.slot_pairs.data() + im.slot_pair_off[k], im.slot_pair_off[k + 1] - im.slot_pair_off[k], H);
    // Replicas' S_rank to the pilot rank (intra-node).
    Rows contrib(static_cast<size_t>(im.num_contrib) * H, staging_);
    StageRun b(group_, im, stats_, staging_), a(group_, im, stats_, staging_);
    b.post(im.rbd_b_back, space(rows, im.num_recv, nullptr, srank.data()),
           space(contrib.data(), im.num_contrib), H);
    b.receive();
    // S_node per pilot: the node's ranks ascending.
    Rows snode(static_cast<size_t>(im.num_pilots_in) * H, staging_);
    RowSpace parts = space(srank.data(), im.num_pool, nullptr, contrib.data());
    for (int k = 0; k < im.num_pilots_in; ++k)
      fold_rows(snode.data() + static_cast<int64_t>(k) * H, parts,
                im.contrib_idx.data() + im.contrib_off[k], im.contrib_off[k + 1] - im.contrib_off[k], H);
    // One row per (row, node) back across nodes; same-node pairs back individually.
    a.post(im.rbd_a_back, space(rows, im.num_recv, nullptr, snode.data()),
           space(ret.data(), im.num_send_pairs), H);
    a.finish();
    b.finish();
  } else {
    Rows rail(static_cast<size_t>(im.num_rail) * H, staging_);
    StageRun s1(group_, im, stats_, staging_), s3(group_, im, stats_, staging_), s2(group_, im, stats_, staging_);
    s1.post(im.halo1_back, space(rows, im.num_recv), space(ret.data(), im.num_send_pairs), H);
    s3.post(im.halo3_back, space(rows, im.num_recv), space(rail.data(), im.num_rail), H);
    s3.receive();
    s2.post(im.halo2_back, space(rail.data(), im.num_rail), space(ret.data(), im.num_send_pairs), H);
    s2.receive();
    s1.finish();
    s3.finish();
    s2.finish();
  }
  source_fold(im, ret.data(), dst, H);
}

void TokenExchange::return_values_host(const ExchangePlan& plan, const float* recv_vals,
                                       float* src_vals) const {
  double unused_seconds = 0;
  ScopedTimer timer(stats_ ? stats_->seconds : unused_seconds);
  const Impl& im = checked_impl(plan, algo_, group_, "return_values");
  group_.alltoallv(recv_vals, im.recv_count, im.recv_off, src_vals, im.send_count, im.send_off);
  if (stats_)
    for (int s = 0; s < im.n; ++s)
      if (im.recv_count[s]) stats_->add(im.link_to[s], uint64_t(im.recv_count[s]) * sizeof(float), true);
}

// ---- device buffers: staged through the host around the algorithms ----

void TokenExchange::multicast(const ExchangePlan& plan, const float* src, float* recv, int H) const {
  const size_t row = static_cast<size_t>(H > 0 ? H : 0) * sizeof(float);
  HostStage s(src, static_cast<size_t>(plan.num_src_rows) * row, /*fill=*/true);
  HostStage r(recv, static_cast<size_t>(plan.num_recv) * row, /*fill=*/false);
  multicast_host(plan, s.as<const float>(), r.as<float>(), H);
  r.store();
}

void TokenExchange::reduce(const ExchangePlan& plan, const float* rows, float* dst, int H) const {
  const size_t row = static_cast<size_t>(H > 0 ? H : 0) * sizeof(float);
  HostStage r(rows, static_cast<size_t>(plan.num_recv) * row, /*fill=*/true);
  HostStage d(dst, static_cast<size_t>(plan.num_src_rows) * row, /*fill=*/true);  // dst +=
  reduce_host(plan, r.as<const float>(), d.as<float>(), H);
  d.store();
}

void TokenExchange::return_values(const ExchangePlan& plan, const float* recv_vals,
                                  float* src_vals) const {
  HostStage r(recv_vals, static_cast<size_t>(plan.num_recv) * sizeof(float), /*fill=*/true);
  HostStage s(src_vals, static_cast<size_t>(plan.num_send_pairs) * sizeof(float), /*fill=*/false);
  return_values_host(plan, r.as<const float>(), s.as<float>());
  s.store();
}

}  // namespace moe::comm
