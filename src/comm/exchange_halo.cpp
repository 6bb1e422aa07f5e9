// halo: Piper's 3-phase all-to-all (see exchange.h). Stages (I intra-node, II rail to rail, III
// intra-node forward):
//   multicast  I: src -> recv (posted first, waited last);  II: src -> rail pool;  III: pool -> recv
//   reduce     the same three stages reversed: rows -> ret, rows -> rail pool, rail pool -> ret
#include <utility>

#include "comm/exchange_internal.h"
#include "core/error.h"

namespace moe::comm::exchange_detail {
namespace {

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

class HaloAlgorithm final : public Algorithm {
 public:
  void route_sources(PlanContext& c, std::vector<std::vector<int32_t>>& extra) const override {
    route_halo_sources(c, extra);
  }
  void build_stages(PlanContext& c, Impl& im) const override { build_halo_stages(c, im); }
  bool metadata_by_rails() const override { return true; }

  // Phase I posted first and waited last, overlapping II -> III.
  void multicast(const ExchangeRun& run, const float* src, float* recv, int H) const override {
    const Impl& im = run.im;
    const RowSpace src_by_pair = space(src, im.num_send_pairs, im.src_row.data());
    Rows rail = run.rows(static_cast<size_t>(im.num_rail) * H);
    StageRun s1(run), s2(run), s3(run);
    s1.post(im.halo1, src_by_pair, space(recv, im.num_recv), H);
    s2.post(im.halo2, src_by_pair, space(rail.data(), im.num_rail), H);
    s2.receive();
    s3.post(im.halo3, space(rail.data(), im.num_rail), space(recv, im.num_recv), H);
    s3.receive();
    s1.finish();
    s2.finish();
    s3.finish();
  }

  void return_rows(const ExchangeRun& run, const float* rows, float* ret, int H) const override {
    const Impl& im = run.im;
    Rows rail = run.rows(static_cast<size_t>(im.num_rail) * H);
    StageRun s1(run), s3(run), s2(run);
    s1.post(im.halo1_back, space(rows, im.num_recv), space(ret, im.num_send_pairs), H);
    s3.post(im.halo3_back, space(rows, im.num_recv), space(rail.data(), im.num_rail), H);
    s3.receive();
    s2.post(im.halo2_back, space(rail.data(), im.num_rail), space(ret, im.num_send_pairs), H);
    s2.receive();
    s1.finish();
    s3.finish();
    s2.finish();
  }
};

}  // namespace

const Algorithm& halo_algorithm() {
  static const HaloAlgorithm algo;
  return algo;
}

}  // namespace moe::comm::exchange_detail
