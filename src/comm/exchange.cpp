// The token exchange: TokenExchange's public calls (plan() is in exchange_plan.cpp), the stage
// runner and the source fold. The algorithms, one file each, sit
// behind exchange_internal.h's Algorithm: exchange_flat.cpp, exchange_rbd.cpp, exchange_halo.cpp.
#include "comm/exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "comm/exchange_internal.h"
#include "comm/host_stage.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/timer.h"

namespace moe::comm {

namespace exchange_detail {

void StageRun::post(const Stage& st, const RowSpace& in, const RowSpace& out, int H) {
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
      rbuf_[m] = Rows(static_cast<size_t>(count), staging_, pool_);
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
      b = Rows(static_cast<size_t>(count), staging_, pool_);
      if (copy_rows_)
        for (size_t k = 0; k < msg.idx.size(); ++k)
          copy_row(b.data() + k * H, in.row(msg.idx[k], H), H);
      direct = b.data();
    }
    sreqs_.push_back(g_.isend(direct, count, msg.peer, st.tag));
    if (stats_) stats_->add(im_.link_to[msg.peer], static_cast<uint64_t>(count) * sizeof(float));
  }
  if (copy_rows_)
    for (size_t k = 0; k < st.self_in.size(); ++k)
      copy_row(out.row(st.self_out[k], H), in.row(st.self_in[k], H), H);
  if (stats_ && st.self_is_message && !st.self_in.empty())
    stats_->add(LinkClass::kSameRank, st.self_in.size() * H * sizeof(float));
}

void StageRun::receive() {
  if (received_) return;
  wait_all(rreqs_);
  for (size_t m = 0; m < st_->recvs.size(); ++m) {
    if (!rbuf_[m].data() || !copy_rows_) continue;  // received in place, or rows not copied
    const Msg& msg = st_->recvs[m];
    for (size_t k = 0; k < msg.idx.size(); ++k)
      copy_row(out_.row(msg.idx[k], H_), rbuf_[m].data() + k * H_, H_);
  }
  received_ = true;
}

void StageRun::finish() {
  receive();
  wait_all(sreqs_);
}

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

const Algorithm& algorithm_of(A2a a) {
  switch (a) {
    case A2a::kFlat: return flat_algorithm();
    case A2a::kRbd: return rbd_algorithm();
    case A2a::kHalo: return halo_algorithm();
    case A2a::kRbdHalo: return rbd_halo_algorithm();
  }
  throw Error(str_cat("TokenExchange: algorithm ", static_cast<int>(a), " has no implementation"));
}

}  // namespace exchange_detail

namespace {

using namespace exchange_detail;

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

// The plan's Impl, checked to belong to this exchange's algorithm and group, and H (rows of H
// floats) to be >= 0.
const Impl& checked_impl(const ExchangePlan& plan, A2a algo, const Group& g,
                         const char* op, int H = 0) {
  MOE_CHECK(plan.impl, "TokenExchange::", op, ": the plan is empty (call TokenExchange::plan)");
  const Impl& im = *plan.impl;
  MOE_CHECK(im.algo == algo, "TokenExchange::", op, ": plan built for '",
            name(im.algo), "' used with '", name(algo), "'");
  MOE_CHECK(im.n == g.size() && im.me == g.rank(), "TokenExchange::", op,
            ": plan built on another group (rank ", im.me, " of ", im.n, ", here ", g.rank(),
            " of ", g.size(), ")");
  MOE_CHECK(H >= 0, "TokenExchange::", op, ": H = ", H, " must be >= 0");
  return im;
}

}  // namespace

TokenExchange::TokenExchange(const Group& group, const Topology& topo, A2a algo,
                             TrafficStats* stats)
    : group_(group), topo_(topo), algo_(algo), stats_(stats) {}

void TokenExchange::keep_staging(bool keep) {
  pool_ = keep ? std::make_shared<exchange_detail::StagingPool>() : nullptr;
}

exchange_detail::ExchangeRun TokenExchange::start_run(const Impl& im) const {
  if (pool_) pool_->begin();
  return exchange_detail::ExchangeRun{group_, im, stats_, staging_, pool_.get(), copy_rows_};
}

void TokenExchange::multicast_host(const ExchangePlan& plan, const float* src, float* recv,
                                   int H) const {
  ScopedTimer timer(seconds_of(stats_));
  const Impl& im = checked_impl(plan, algo_, group_, "multicast", H);
  if (H == 0) return;  // nothing to move (every rank passes the same H)
  algorithm_of(algo_).multicast(start_run(im), src, recv, H);
}

void TokenExchange::reduce_host(const ExchangePlan& plan, const float* rows, float* dst,
                                int H) const {
  ScopedTimer timer(seconds_of(stats_));
  const Impl& im = checked_impl(plan, algo_, group_, "reduce", H);
  if (H == 0) return;  // nothing to move (every rank passes the same H)
  // ret[p]: the row of pair p back at its source (rbd: the pilot pair's row holds S_node).
  const ExchangeRun run = start_run(im);
  Rows ret = run.rows(static_cast<size_t>(im.num_send_pairs) * H);
  algorithm_of(algo_).return_rows(run, rows, ret.data(), H);
  if (run.copy_rows) source_fold(im, ret.data(), dst, H);
}

void TokenExchange::return_values_host(const ExchangePlan& plan, const float* recv_vals,
                                       float* src_vals) const {
  ScopedTimer timer(seconds_of(stats_));
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
