// The token exchange's internal interface, shared by exchange.cpp (TokenExchange, plan(), the
// stage runner, the source fold) and one file per algorithm (exchange_flat.cpp, exchange_rbd.cpp
// with rbd-halo, exchange_halo.cpp). Internal to comm/: nothing outside the exchange includes it.
//
// Every algorithm is a few "stages" of point-to-point messages (flat: one alltoallv). A stage lists,
// per peer, the rows it sends (indices into an input space) and the rows it receives (indices into
// an output space), in message order; plan() builds all of them once, so multicast/reduce only
// pack, post, wait and unpack. Spaces are [0, na) of one buffer (optionally through a row map),
// then a second buffer. Legend: n group size, H hidden, p a pair index of this rank (source side),
// i a received pair in canonical order (receiver side), t a source row, N a node id.
#pragma once
#include <cstdint>
#include <cstring>
#include <deque>
#include <numeric>
#include <utility>
#include <vector>

#include "comm/exchange.h"
#include "core/buffer.h"

namespace moe::comm {
namespace exchange_detail {

// What a timed call adds its seconds to: stats->seconds, or a sink nobody reads without stats.
inline double& seconds_of(TrafficStats* stats) {
  thread_local double unused = 0;
  return stats ? stats->seconds : unused;
}

// Tags of the exchange's point-to-point messages (reserved on the group's communicator).
constexpr int kTagRbdA = 30001, kTagRbdB = 30002, kTagRbdABack = 30003, kTagRbdBBack = 30004;
constexpr int kTagHalo1 = 30011, kTagHalo2 = 30012, kTagHalo3 = 30013;
constexpr int kTagHalo1Back = 30014, kTagHalo2Back = 30015, kTagHalo3Back = 30016;
constexpr int kTagMeta1 = 30021, kTagMeta2 = 30022, kTagMeta3 = 30023;

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
inline RowSpace space(const float* a, int64_t na = 0, const int32_t* map = nullptr,
                      const float* b = nullptr) {
  return RowSpace{const_cast<float*>(a), na, map, const_cast<float*>(b)};
}

// Staging buffers kept from one exchange to the next (TokenExchange::keep_staging): the k-th
// staging request of a call gets the k-th buffer, grown when too small. Every call of one plan
// makes the same requests in the same order, so after the first call nothing is allocated, and
// nothing is mapped or faulted in again (under SMPI's shared malloc every allocation is a fresh
// mapping whose pages fault on first touch: 99.8% of a simulated step's page faults).
class StagingPool {
 public:
  // Starts a call: requests count from the first buffer again. Every Rows of the previous call
  // must be gone (its requests complete).
  void begin() { next_ = 0; }
  float* take(size_t count) {
    if (next_ == slots_.size()) slots_.emplace_back();
    Buffer<float>& b = slots_[next_++];
    if (b.size() < count) b.resize_for_overwrite(count);
    return b.data();
  }

 private:
  std::deque<Buffer<float>> slots_;  // a deque: taken pointers stay valid while it grows
  size_t next_ = 0;
};

// Staging rows of one exchange, charged to the exchange's staging tracker (when set) while they
// live, so the measured memory of a rank includes what its exchanges hold while they run. From
// the pool when there is one, else owned. Contents start undefined (every use writes its rows
// before reading them; debug builds poison owned rows) unless `zeroed`.
class Rows {
 public:
  Rows() = default;
  Rows(size_t count, MemTracker* tracker, StagingPool* pool, bool zeroed = false) {
    if (!pool) {
      zeroed ? own_.resize(count, tracker) : own_.resize_for_overwrite(count, tracker);
      data_ = own_.data();
      return;
    }
    data_ = count ? pool->take(count) : nullptr;
    if (zeroed && count) std::memset(data_, 0, count * sizeof(float));
    tracker_ = tracker;
    charged_ = count * sizeof(float);
    if (tracker_) tracker_->add(charged_);
  }
  ~Rows() { release(); }
  Rows(Rows&& o) noexcept { *this = std::move(o); }
  Rows& operator=(Rows&& o) noexcept {
    if (this != &o) {
      release();
      own_ = std::move(o.own_);
      data_ = std::exchange(o.data_, nullptr);
      tracker_ = std::exchange(o.tracker_, nullptr);
      charged_ = std::exchange(o.charged_, 0);
    }
    return *this;
  }
  float* data() { return data_; }

 private:
  void release() {
    if (tracker_) tracker_->sub(charged_);
    tracker_ = nullptr;
    charged_ = 0;
    data_ = nullptr;
    own_.release();
  }
  Buffer<float> own_;
  float* data_ = nullptr;
  MemTracker* tracker_ = nullptr;  // pooled rows only (owned rows charge through own_)
  size_t charged_ = 0;
};

inline void copy_row(float* dst, const float* src, int H) {
  std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(H));
}

// out = row(idx[0]); out = out + row(idx[k]) for k = 1.. (a left fold: the one summation order
// every algorithm shares, so their results are bit-identical).
inline void fold_rows(float* out, const RowSpace& in, const int32_t* idx, int count, int H) {
  copy_row(out, in.row(idx[0], H), H);
  for (int k = 1; k < count; ++k) {
    const float* r = in.row(idx[k], H);
    for (int h = 0; h < H; ++h) out[h] = out[h] + r[h];
  }
}

}  // namespace exchange_detail

struct ExchangePlan::Impl {
  using Stage = exchange_detail::Stage;
  A2a algo = A2a::kFlat;
  int n = 0, me = 0;
  int num_src_rows = 0, num_send_pairs = 0, num_recv = 0;
  std::vector<LinkClass> link_to;         // [n] link class from this rank to each group rank
  std::vector<int32_t> src_row;           // [num_send_pairs]
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
  std::vector<int32_t> expand_slot, expand_row;    // recv[expand_row[k]] = pool[expand_slot[k]]
  std::vector<int32_t> slot_pair_off, slot_pairs;  // [num_pool+1] CSR: recv rows of each slot
  std::vector<int32_t> contrib_off, contrib_idx;   // [num_pilots_in+1] CSR into [S_rank | contrib]

  // halo
  Stage halo1, halo2, halo3, halo1_back, halo2_back, halo3_back;
  int num_rail = 0;  // rows received rail to rail (phase II)
};

namespace exchange_detail {

using Impl = ExchangePlan::Impl;

// What one multicast/reduce/return runs with: the group, the plan's tables, where bytes are
// counted and where staging rows are charged.
struct ExchangeRun {
  const Group& group;
  const Impl& im;
  TrafficStats* stats;  // may be null
  MemTracker* staging;  // may be null
  StagingPool* pool;    // may be null: staging rows are then allocated per call
  bool copy_rows;       // false: messages keep their sizes, but no row is packed, copied or summed
  Rows rows(size_t count, bool zeroed = false) const { return Rows(count, staging, pool, zeroed); }
};

// Posts a stage's receives and sends (and does its self copies). receive() waits for the
// receives only and unpacks them, so the next stage can start while this stage's sends drain;
// finish() also waits for the sends (their buffers live until then).
class StageRun {
 public:
  explicit StageRun(const ExchangeRun& run)
      : g_(run.group), im_(run.im), stats_(run.stats), staging_(run.staging), pool_(run.pool),
        copy_rows_(run.copy_rows) {}
  void post(const Stage& st, const RowSpace& in, const RowSpace& out, int H);
  void receive();
  void finish();

 private:
  const Group& g_;
  const Impl& im_;
  TrafficStats* stats_;
  MemTracker* staging_;
  StagingPool* pool_;
  bool copy_rows_;
  const Stage* st_ = nullptr;
  RowSpace out_;
  int H_ = 0;
  bool received_ = false;
  std::vector<Rows> sbuf_, rbuf_;
  std::vector<Request> rreqs_, sreqs_;  // declared last: destroyed before their buffers
};

// Exclusive prefix sum.
std::vector<int> offsets_of(const std::vector<int>& counts);
// v[i] * f, checked against MPI's int count.
std::vector<int> scaled(const std::vector<int>& v, int64_t f);

// What the table builders need: where ranks sit, this rank's pairs, and what arrived with the
// metadata (per received pair, and the algorithm's extra ints per source).
struct PlanContext {
  int n = 0, me = 0, my_node = 0, num_nodes = 0;
  std::vector<int> node_of;               // [n] node id of each group rank
  std::vector<std::vector<int>> members;  // [num_nodes] group ranks of each node, ascending
  std::vector<int> local_index;           // [n] position among its node's group ranks
  int num_pairs = 0;
  const int32_t* src_row = nullptr;   // [num_pairs]
  const int32_t* dst_rank = nullptr;  // [num_pairs]
  std::vector<int32_t> pair_ints;     // [num_pairs * ints_per_pair] the algorithm's ints per pair
  // rbd, source side
  std::vector<int32_t> pilot_pair_of;           // [num_pairs] pilot pair of a remote pair, else -1
  std::vector<std::vector<int32_t>> pilots_to;  // [n] pilot pairs per pilot rank, idx order
  // halo, source side
  std::vector<std::vector<int32_t>> to_node;  // [num_nodes] my pairs to each remote node
  // receiver side
  std::vector<int32_t> recv_src_rank;                    // [num_recv]
  std::vector<int32_t> recv_pair_ints;                   // [num_recv * ints_per_pair]
  std::vector<int32_t> recv_pilot_rank, recv_pilot_idx;  // [num_recv] rbd, from recv_pair_ints
  std::vector<std::vector<int32_t>> extra_in;            // [n] extra ints from each source

  // HALO's rail peer of rank s on node N: the rank there with s's local index (modulo the
  // node's size when nodes hold different numbers of the group's ranks).
  int rail(int s, int N) const {
    const std::vector<int>& m = members[N];
    return m[local_index[s] % m.size()];
  }
};

inline std::vector<int32_t> iota_vec(int count, int start) {
  std::vector<int32_t> v(count);
  std::iota(v.begin(), v.end(), start);
  return v;
}
// Pair indices of my pairs to d; canonical positions of the rows from s (+ base).
inline std::vector<int32_t> pair_range(const Impl& im, int d) { return iota_vec(im.send_count[d], im.send_off[d]); }
inline std::vector<int32_t> recv_range(const Impl& im, int s, int base = 0) {
  return iota_vec(im.recv_count[s], base + im.recv_off[s]);
}

// One algorithm, as plan() and the exchanges see it. plan() does the shared work (checks, counts,
// per-pair metadata, the source fold program); an algorithm adds its routing on both sides and
// moves the rows.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  // Ints sent with every pair beside (tag, value) in plan's metadata alltoallv (rbd: pilot rank,
  // pilot idx); route_sources fills c.pair_ints, receivers find them in c.recv_pair_ints.
  virtual int ints_per_pair() const { return 0; }
  // True when a remote node's S_node comes back ready in one pair's ret row (rbd's pilot), so the
  // source fold takes it instead of folding that node's pairs.
  virtual bool sums_in_network() const { return false; }
  // True when plan()'s counts and metadata travel HALO's way (rails_metadata_exchange below)
  // instead of one alltoall and one alltoallv over every pair of ranks.
  virtual bool metadata_by_rails() const { return false; }
  // Source side, before the metadata exchange: c.pair_ints and the extra ints to each rank.
  virtual void route_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra) const {
    (void)c, (void)extra;
  }
  // Receiver side, after it: the algorithm's stages and tables into im.
  virtual void build_stages(PlanContext& c, Impl& im) const { (void)c, (void)im; }
  // recv[i] = src[src_row of i's pair at its source] (exchange.h's multicast).
  virtual void multicast(const ExchangeRun& run, const float* src, float* recv, int H) const = 0;
  // ret [num_send_pairs, H]: the row of each pair back at its source, or, where
  // sums_in_network, S_node in the pilot pair's row; the source fold then sums ret into dst.
  virtual void return_rows(const ExchangeRun& run, const float* rows, float* ret, int H) const = 0;
};

const Algorithm& algorithm_of(A2a a);
const Algorithm& flat_algorithm();
const Algorithm& rbd_algorithm();
const Algorithm& halo_algorithm();
const Algorithm& rbd_halo_algorithm();  // exchange_rbd.cpp: rbd's pilots on halo's rails

// Flat's return of every pair's row (one alltoallv): also rbd's with a fold key.
void return_rows_flat(const ExchangeRun& run, const float* rows, float* ret, int H);

}  // namespace exchange_detail
}  // namespace moe::comm
