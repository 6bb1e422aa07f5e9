// Multi-rank tests of comm/: Group operations, Topology, TrafficStats, and the token exchange
// (flat, rbd, halo, rbd-halo) against naive expectations built from a test-only global view of everyone's
// pairs. Rows are stamped with their origin (world rank * 1000000 + token), so a receiver checks
// where every row came from. Plain main, run under mpirun (see CMakeLists.txt): every rank runs
// every check; rank 0 prints "N passed, M failed"; the exit code is non-zero on any failure.
// Flags: --ranks-per-node R, --nodes-per-group G (emulated nodes on one machine).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "comm/group.h"
#include "comm/mpi_runtime.h"
#include "comm/topology.h"
#include "comm/traffic.h"
#include "core/error.h"
#include "mpi_check.h"
#include "core/rng.h"

using namespace moe;
using namespace moe::comm;

namespace {

using mpitest::ck;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs f, expecting a moe::Error whose message contains every part.
void expect_error(const std::string& name, const std::function<void()>& f,
                  const std::vector<std::string>& parts) {
  try {
    f();
    CHECK(false, name, ": no error thrown");
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& p : parts)
      CHECK(contains(msg, p), name, ": message '", msg, "' does not name '", p, "'");
  }
}

// ---------------------------------------------------------------- Group

void test_group(const Group& world) {
  const int n = world.size(), r = world.rank();
  CHECK(world.valid() && r >= 0 && r < n, "world group rank ", r, " size ", n);
  CHECK(world.world_rank() == r && world.world_rank_of(r) == r, "world rank mapping");

  // alltoall: value r*100 + d, two per rank
  std::vector<int32_t> a_out(2 * n), a_in(2 * n);
  for (int d = 0; d < n; ++d) a_out[2 * d] = r * 100 + d, a_out[2 * d + 1] = -(r * 100 + d);
  world.alltoall(a_out.data(), a_in.data(), 2);
  bool ok = true;
  for (int s = 0; s < n; ++s) ok &= a_in[2 * s] == s * 100 + r && a_in[2 * s + 1] == -(s * 100 + r);
  CHECK(ok, "alltoall int32");

  // alltoallv: (r + d) % 3 elements from r to d, value r*1000 + d*10 + k (+0.5 for float)
  std::vector<int> sc(n), rc(n), sd(n), rd(n);
  for (int d = 0; d < n; ++d) sc[d] = (r + d) % 3, rc[d] = (d + r) % 3;
  for (int d = 1; d < n; ++d) sd[d] = sd[d - 1] + sc[d - 1], rd[d] = rd[d - 1] + rc[d - 1];
  std::vector<float> fs(sd[n - 1] + sc[n - 1]), fr(rd[n - 1] + rc[n - 1], -1.f);
  std::vector<int32_t> is(fs.size()), ir(fr.size(), -1);
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < sc[d]; ++k) {
      fs[sd[d] + k] = r * 1000 + d * 10 + k + 0.5f;
      is[sd[d] + k] = r * 1000 + d * 10 + k;
    }
  world.alltoallv(fs.data(), sc, sd, fr.data(), rc, rd);
  world.alltoallv(is.data(), sc, sd, ir.data(), rc, rd);
  bool okf = true, oki = true;
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < rc[s]; ++k) {
      okf &= fr[rd[s] + k] == s * 1000 + r * 10 + k + 0.5f;
      oki &= ir[rd[s] + k] == s * 1000 + r * 10 + k;
    }
  CHECK(okf, "alltoallv float");
  CHECK(oki, "alltoallv int32");
  // clang-format off
  expect_error("alltoallv with short counts", [&] {
    world.alltoallv(fs.data(), std::vector<int>(n + 1), sd, fr.data(), rc, rd);
  }, {"one entry per rank"});
  // clang-format on

  // allreduce / allgather
  float f[2] = {1.0f, static_cast<float>(r)};
  double dd[2] = {0.5, static_cast<double>(r)};
  int64_t ll[2] = {1, static_cast<int64_t>(r) << 33};
  world.allreduce_sum(f, 2);
  world.allreduce_sum(dd, 2);
  world.allreduce_sum(ll, 2);
  const int64_t tri = static_cast<int64_t>(n) * (n - 1) / 2;
  CHECK(f[0] == n && f[1] == tri, "allreduce_sum float ", f[0], " ", f[1]);
  CHECK(dd[0] == 0.5 * n && dd[1] == tri, "allreduce_sum double");
  CHECK(ll[0] == n && ll[1] == (tri << 33), "allreduce_sum int64");
  double mx = r;
  int64_t mxl = -r;
  world.allreduce_max(&mx, 1);
  world.allreduce_max(&mxl, 1);
  CHECK(mx == n - 1 && mxl == 0, "allreduce_max");
  int32_t mine[2] = {r, 7 * r};
  std::vector<int32_t> all(2 * n);
  world.allgather(mine, all.data(), 2);
  ok = true;
  for (int s = 0; s < n; ++s) ok &= all[2 * s] == s && all[2 * s + 1] == 7 * s;
  CHECK(ok, "allgather int32");
  double md = r + 0.25;
  std::vector<double> alld(n);
  world.allgather(&md, alld.data(), 1);
  ok = true;
  for (int s = 0; s < n; ++s) ok &= alld[s] == s + 0.25;
  CHECK(ok, "allgather double");

  // point to point around the ring: isend/irecv, and blocking send/recv against posted irecvs
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  std::vector<float> ring_out(5), ring_in(5, -1);
  std::vector<int32_t> iring_out(3), iring_in(3, -1);
  for (int k = 0; k < 5; ++k) ring_out[k] = r * 10 + k + 0.25f;
  for (int k = 0; k < 3; ++k) iring_out[k] = r * 10 + k;
  std::vector<Request> reqs;
  reqs.push_back(world.irecv(ring_in.data(), 5, prev, 11));
  reqs.push_back(world.irecv(iring_in.data(), 3, prev, 12));
  reqs.push_back(world.isend(ring_out.data(), 5, next, 11));
  reqs.push_back(world.isend(iring_out.data(), 3, next, 12));
  wait_all(reqs);
  ok = true;
  for (int k = 0; k < 5; ++k) ok &= ring_in[k] == prev * 10 + k + 0.25f;
  for (int k = 0; k < 3; ++k) ok &= iring_in[k] == prev * 10 + k;
  CHECK(ok, "isend/irecv ring (float, int32)");
  CHECK(!reqs[0].pending(), "requests done after wait_all");
  Request q = world.irecv(ring_in.data(), 5, prev, 13);
  Request qi = world.irecv(iring_in.data(), 3, prev, 14);
  world.send(ring_out.data(), 5, next, 13);
  world.send(iring_out.data(), 3, next, 14);
  q.wait();
  qi.wait();
  Request q2 = world.isend(ring_out.data(), 5, next, 15);
  Request q2i = world.isend(iring_out.data(), 3, next, 16);
  std::fill(ring_in.begin(), ring_in.end(), -1.f);
  world.recv(ring_in.data(), 5, prev, 15);
  world.recv(iring_in.data(), 3, prev, 16);
  q2.wait();
  q2i.wait();
  ok = true;
  for (int k = 0; k < 5; ++k) ok &= ring_in[k] == prev * 10 + k + 0.25f;
  for (int k = 0; k < 3; ++k) ok &= iring_in[k] == prev * 10 + k;
  CHECK(ok, "send/recv ring (float, int32)");

  // errors: a short message is caught by the receive; a bad peer names it
  {
    std::vector<int32_t> small(3, 1), big(5);
    Request rq = world.irecv(big.data(), 5, prev, 17);
    Request sq = world.isend(small.data(), 3, next, 17);
    sq.wait();
    expect_error("short message", [&] { rq.wait(); }, {"expected 5 elements, received 3", str_cat("peer ", prev)});
  }
  expect_error("bad peer", [&] { world.send(ring_out.data(), 1, n + 5, 0); },
               {str_cat("peer ", n + 5), "out of range"});

  // split: even / odd world ranks, ordered by rank
  Group half = world.split(r % 2, r);
  CHECK(half.valid() && half.size() == (n + 1 - r % 2) / 2 && half.rank() == r / 2,
        "split group size ", half.size(), " rank ", half.rank());
  ok = true;
  for (int k = 0; k < half.size(); ++k) ok &= half.world_rank_of(k) == 2 * k + r % 2;
  CHECK(ok && half.world_rank() == r, "split world_rank_of");
  double one = 1;
  half.allreduce_sum(&one, 1);
  CHECK(one == half.size(), "allreduce on the split group");
  Group none = world.split(r == 0 ? -1 : 0, r);
  CHECK(none.valid() == (r != 0), "split with color < 0 joins no group");
  Group moved = std::move(half);
  CHECK(moved.valid() && !half.valid(), "Group is movable");
  world.barrier();
}

// ---------------------------------------------------------------- Topology, TrafficStats

void test_topology(const Topology& topo, int n) {
  bool ok = true;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      LinkClass want = a == b                                               ? LinkClass::kSameRank
                       : a / topo.ranks_per_node == b / topo.ranks_per_node ? LinkClass::kIntraNode
                       : topo.group_of(a) == topo.group_of(b)               ? LinkClass::kInterNode
                                                                            : LinkClass::kInterGroup;
      ok &= topo.link(a, b) == want;
    }
  CHECK(ok, "link classes of ", topo.describe());
  Topology t = Topology::detect(8, 2, 0);
  CHECK(t.world_size == 8 && t.ranks_per_node == 2 && t.num_nodes() == 4 && t.num_groups() == 1,
        "detect forced 8/2: ", t.describe());
  CHECK(t.link(0, 1) == LinkClass::kIntraNode && t.link(1, 2) == LinkClass::kInterNode &&
            t.link(3, 3) == LinkClass::kSameRank && t.node_of(5) == 2 && t.local_rank(5) == 1,
        "forced 8/2 links");
  t = Topology::detect(8, 1, 2);
  CHECK(t.num_nodes() == 8 && t.num_groups() == 4 && t.link(0, 1) == LinkClass::kInterNode &&
            t.link(1, 2) == LinkClass::kInterGroup && t.group_of(7) == 3,
        "detect forced 8/1/2: ", t.describe());
  CHECK(contains(t.describe(), "8 nodes") && contains(t.describe(), "4 switch groups"),
        "describe: ", t.describe());
  if (const char* ls = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    Topology d = Topology::detect(n, 0, 0);
    CHECK(d.ranks_per_node == std::atoi(ls), "detect from OMPI_COMM_WORLD_LOCAL_SIZE=", ls);
  }
  expect_error("rpn not dividing", [] { Topology::detect(8, 3, 0); }, {"8", "3", "ranks per node"});
  expect_error("groups not dividing", [] { Topology::detect(8, 2, 3); }, {"4 nodes", "3"});
  expect_error("negative rpn", [] { Topology::detect(8, -2, 0); }, {"-2"});
  expect_error("link out of range", [] { Topology::detect(4, 2, 0).link(0, 4); }, {"4"});
  CHECK(std::string(link_class_name(LinkClass::kInterGroup)) == "inter_group", "link class name");

  TrafficStats s;
  s.add(LinkClass::kInterNode, 100);
  s.add(LinkClass::kInterGroup, 20);
  s.add(LinkClass::kIntraNode, 7, true);
  TrafficStats s2 = s;
  s2 += s;
  CHECK(s2.inter_node_bytes() == 240 && s2.inter_node_messages() == 4 &&
            s2.meta_bytes[1] == 14 && s2.messages[1] == 0,
        "TrafficStats add/+=");
  nlohmann::json j = s2.to_json();
  CHECK(j["bytes"]["inter_node"] == 200 && j["meta_bytes"]["intra_node"] == 14, "to_json ", j.dump());
  s2.reset();
  CHECK(s2.inter_node_bytes() == 0 && s2.seconds == 0, "reset");
}

// ---------------------------------------------------------------- exchange

struct Pairs {
  explicit Pairs(int rows = 0) : T(rows) {}
  int T = 0;
  std::vector<int32_t> src_row, dst, tag;
  std::vector<float> value;
  void add(int t, int d, int tg) {
    src_row.push_back(t);
    dst.push_back(d);
    tag.push_back(tg);
    value.push_back(0.25f * static_cast<float>((t * 7 + tg * 3) % 64) - 3.0f);
  }
  // Stable by destination, as the padding-free layout produces them.
  void sort_by_dst() {
    std::vector<int> o(dst.size());
    for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<int>(i);
    std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return dst[a] < dst[b]; });
    Pairs s(T);
    for (int i : o) {
      s.src_row.push_back(src_row[i]);
      s.dst.push_back(dst[i]);
      s.tag.push_back(tag[i]);
      s.value.push_back(value[i]);
    }
    *this = std::move(s);
  }
  int size() const { return static_cast<int>(dst.size()); }
};

// Row stamp of (source world rank, token, column): exact in float for world ranks < 8,
// tokens < 1000, columns < 64 (all < 2^23, spacing 0.5).
float stamp(int wr, int t, int c) { return static_cast<float>(wr * 1000000 + t) + 0.5f * c; }

// Row a receiver returns in reduce: values of many magnitudes and signs, so that summation order
// shows in the bits.
float reduce_val(int wr, int i, int c) {
  Rng rng = derive_rng(0xC0FFEEull + static_cast<uint64_t>(wr) * 1000003ull + i, c);
  double m = (rng.uniform() * 2 - 1) * std::pow(10.0, static_cast<double>(rng.below(7)) - 3.0);
  return static_cast<float>(m);
}

// Everyone's pairs on every rank (test-only global view).
struct Global {
  int n = 0;
  std::vector<Pairs> of;  // [n]
};

Global gather_pairs(const Group& g, const Pairs& mine) {
  const int n = g.size();
  Global G;
  G.n = n;
  int32_t cnt[2] = {mine.size(), mine.T};
  std::vector<int32_t> cnts(2 * n);
  g.allgather(cnt, cnts.data(), 2);
  int mx = 0;
  for (int s = 0; s < n; ++s) mx = std::max(mx, cnts[2 * s]);
  std::vector<int32_t> buf(4 * mx, 0), all(4 * mx * n);
  for (int p = 0; p < mine.size(); ++p) {
    buf[4 * p] = mine.src_row[p];
    buf[4 * p + 1] = mine.dst[p];
    buf[4 * p + 2] = mine.tag[p];
    std::memcpy(&buf[4 * p + 3], &mine.value[p], 4);
  }
  if (mx > 0) g.allgather(buf.data(), all.data(), 4 * mx);
  G.of.resize(n);
  for (int s = 0; s < n; ++s) {
    G.of[s].T = cnts[2 * s + 1];
    for (int p = 0; p < cnts[2 * s]; ++p) {
      const int32_t* x = &all[(static_cast<size_t>(s) * mx + p) * 4];
      G.of[s].src_row.push_back(x[0]);
      G.of[s].dst.push_back(x[1]);
      G.of[s].tag.push_back(x[2]);
      float v;
      std::memcpy(&v, &x[3], 4);
      G.of[s].value.push_back(v);
    }
  }
  return G;
}

const char* kAlgos[] = {"flat", "rbd", "halo", "rbd-halo"};
constexpr int kNumAlgos = 4;

// One scenario: every algorithm, every check.
void run_scenario(const std::string& name, const Group& g, const Topology& topo, const Pairs& mine,
                  int H, bool uniform_full) {
  const int n = g.size(), me = g.rank();
  const Global G = gather_pairs(g, mine);
  auto node = [&](int r) { return topo.node_of(g.world_rank_of(r)); };
  const std::string at = str_cat(name, " [group rank ", me, "/", n, ", ", topo.describe(), "] ");

  // What I receive, canonical order: by source rank, then the source's pair order.
  struct Expect {
    int s, p;
  };
  std::vector<Expect> exp;
  for (int s = 0; s < n; ++s)
    for (int p = 0; p < G.of[s].size(); ++p)
      if (G.of[s].dst[p] == me) exp.push_back({s, p});
  // Where each of my pairs lands: its canonical index on its receiver.
  std::vector<int> my_index(mine.size());
  {
    std::vector<int> next(n, 0);
    for (int s = 0; s < n; ++s)
      for (int p = 0; p < G.of[s].size(); ++p) {
        int idx = next[G.of[s].dst[p]]++;
        if (s == me) my_index[p] = idx;
      }
  }

  // Source rows, stamped.
  std::vector<float> src(static_cast<size_t>(mine.T) * H);
  for (int t = 0; t < mine.T; ++t)
    for (int c = 0; c < H; ++c) src[static_cast<size_t>(t) * H + c] = stamp(g.world_rank(), t, c);

  // Naive traffic of my multicast.
  const int my_node = node(me);
  uint64_t flat_inter = 0, flat_intra = 0, flat_self = 0;
  std::set<std::pair<int, int>> row_node;  // distinct (row, remote node)
  std::set<int> remote_nodes;
  for (int p = 0; p < mine.size(); ++p) {
    int d = mine.dst[p];
    if (d == me) ++flat_self;
    else if (node(d) == my_node) ++flat_intra;
    else {
      ++flat_inter;
      row_node.insert({mine.src_row[p], node(d)});
      remote_nodes.insert(node(d));
    }
  }
  std::set<int> group_nodes;
  for (int r = 0; r < n; ++r) group_nodes.insert(node(r));
  // Naive traffic of the reduce: rows I send back. flat: one per received remote pair; rbd: one per
  // pilot I hold (the first pair of (source, row) to my node is mine).
  // halo: rows from remote sources whose rail peer on my node is me (same local index among the
  // node's ranks, modulo the node's size) go back through me, one per pair; rbd-halo: one per
  // distinct row of theirs.
  uint64_t back_flat_inter = 0, back_rbd_inter = 0, back_halo_inter = 0, back_rbdhalo_inter = 0;
  {
    std::map<int, std::vector<int>> members;  // node -> group ranks, ascending
    for (int r = 0; r < n; ++r) members[node(r)].push_back(r);
    auto local = [&](int r) {
      const std::vector<int>& m = members[node(r)];
      return static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
    };
    const std::vector<int>& mine_m = members[my_node];
    for (int s = 0; s < n; ++s) {
      if (node(s) == my_node || mine_m[local(s) % mine_m.size()] != me) continue;
      std::set<int> rows_here;
      for (int p = 0; p < G.of[s].size(); ++p)
        if (node(G.of[s].dst[p]) == my_node) {
          ++back_halo_inter;
          rows_here.insert(G.of[s].src_row[p]);
        }
      back_rbdhalo_inter += rows_here.size();
    }
  }
  for (const Expect& e : exp) {
    if (node(e.s) == my_node) continue;
    ++back_flat_inter;
    const Pairs& P = G.of[e.s];
    int first = -1;
    for (int p = 0; p < P.size() && first < 0; ++p)
      if (P.src_row[p] == P.src_row[e.p] && node(P.dst[p]) == my_node) first = p;
    if (first == e.p) ++back_rbd_inter;
  }

  // Reduce: rows on receivers, and the naive result in the contract's order (bit-exact) and in
  // double precision.
  std::vector<float> rows(exp.size() * H);
  for (size_t i = 0; i < exp.size(); ++i)
    for (int c = 0; c < H; ++c) rows[i * H + c] = reduce_val(g.world_rank(), static_cast<int>(i), c);
  std::vector<float> dst_init(static_cast<size_t>(mine.T) * H);
  for (size_t k = 0; k < dst_init.size(); ++k) dst_init[k] = 0.125f * static_cast<float>(k % 17) - 1.0f;
  std::vector<float> want = dst_init;
  std::vector<double> want_d(dst_init.begin(), dst_init.end()), abs_d(dst_init.size(), 0.0);
  {
    auto back = [&](int p, int c) { return reduce_val(g.world_rank_of(mine.dst[p]), my_index[p], c); };
    for (int t = 0; t < mine.T; ++t) {
      std::vector<int> ps;
      for (int p = 0; p < mine.size(); ++p)
        if (mine.src_row[p] == t) ps.push_back(p);
      std::map<int, std::map<int, std::vector<int>>> by;  // node -> rank -> pairs (pair order)
      for (int p : ps) by[node(mine.dst[p])][mine.dst[p]].push_back(p);
      for (int c = 0; c < H; ++c) {
        float acc = want[static_cast<size_t>(t) * H + c];
        for (auto& [nd, ranks] : by) {
          float s_node = 0;
          bool first_rank = true;
          for (auto& [rk, pp] : ranks) {
            float s_rank = back(pp[0], c);
            for (size_t k = 1; k < pp.size(); ++k) s_rank = s_rank + back(pp[k], c);
            s_node = first_rank ? s_rank : s_node + s_rank;
            first_rank = false;
          }
          acc = acc + s_node;
        }
        want[static_cast<size_t>(t) * H + c] = acc;
        for (int p : ps) {
          want_d[static_cast<size_t>(t) * H + c] += back(p, c);
          abs_d[static_cast<size_t>(t) * H + c] += std::fabs(back(p, c));
        }
      }
    }
  }

  std::vector<std::vector<float>> recv_of(kNumAlgos), reduce_of(kNumAlgos);
  for (int a = 0; a < kNumAlgos; ++a) {
    const std::string al = str_cat(at, kAlgos[a], ": ");
    TrafficStats stats;
    TokenExchange ex(g, topo, parse_a2a(kAlgos[a], "test"), &stats);
    ExchangePlan plan = ex.plan(mine.T, mine.size(), mine.src_row.data(), mine.dst.data(),
                                mine.tag.data(), mine.value.data());
    CHECK(plan.num_recv == static_cast<int>(exp.size()) && plan.num_send_pairs == mine.size() &&
              plan.num_src_rows == mine.T,
          al, "num_recv ", plan.num_recv, " expected ", exp.size());
    if (plan.num_recv != static_cast<int>(exp.size())) continue;
    bool meta_ok = true;
    for (size_t i = 0; i < exp.size(); ++i) {
      const Pairs& P = G.of[exp[i].s];
      meta_ok &= plan.recv_src_rank[i] == exp[i].s && plan.recv_tag[i] == P.tag[exp[i].p] &&
                 plan.recv_value[i] == P.value[exp[i].p];
    }
    CHECK(meta_ok, al, "recv_src_rank / recv_tag / recv_value");
    CHECK(n == 1 || stats.meta_bytes[0] + stats.meta_bytes[1] + stats.meta_bytes[2] + stats.meta_bytes[3] > 0,
          al, "plan counts metadata bytes");

    // multicast
    stats.reset();
    std::vector<float> recv(exp.size() * H, -7.0f);
    ex.multicast(plan, src.data(), recv.data(), H);
    int wrong = 0;
    std::string first_wrong;
    for (size_t i = 0; i < exp.size(); ++i) {
      int ws = g.world_rank_of(exp[i].s), t = G.of[exp[i].s].src_row[exp[i].p];
      bool row_ok = true;
      for (int c = 0; c < H; ++c) row_ok &= recv[i * H + c] == stamp(ws, t, c);
      if (!row_ok) {
        if (!wrong) {
          int v = static_cast<int>(recv[i * H]);
          first_wrong = str_cat("row ", i, " expected from world rank ", ws, " token ", t,
                                ", got world rank ", v / 1000000, " token ", v % 1000000);
        }
        ++wrong;
      }
    }
    CHECK(wrong == 0, al, "multicast: ", wrong, " of ", exp.size(), " rows wrong; first: ", first_wrong);
    recv_of[a] = recv;
    // exact traffic of the multicast (what this rank sent)
    const uint64_t rb = static_cast<uint64_t>(H) * 4;
    if (a == 0) {
      CHECK(stats.inter_node_bytes() == flat_inter * rb &&
                stats.bytes[static_cast<int>(LinkClass::kIntraNode)] == flat_intra * rb &&
                stats.bytes[static_cast<int>(LinkClass::kSameRank)] == flat_self * rb,
            al, "bytes inter ", stats.inter_node_bytes(), " (want ", flat_inter * rb, ") intra ",
            stats.bytes[1], " (want ", flat_intra * rb, ") self ", stats.bytes[0]);
      // inter-group links are used exactly when the topology has several switch groups
      int64_t inter_group = static_cast<int64_t>(stats.bytes[static_cast<int>(LinkClass::kInterGroup)]);
      g.allreduce_sum(&inter_group, 1);
      if (uniform_full)
        CHECK((inter_group > 0) == (topo.num_groups() > 1), al, "inter-group bytes ", inter_group,
              " with ", topo.num_groups(), " switch groups");
    } else if (a == 1) {
      CHECK(stats.inter_node_bytes() == row_node.size() * rb, al, "inter-node bytes ",
            stats.inter_node_bytes(), " want distinct (row, remote node) ", row_node.size(),
            " x ", rb);
      CHECK(stats.bytes[0] == flat_self * rb, al, "same-rank bytes");
    } else {
      // halo: flat's rows; rbd-halo: rbd's pilots. Both: one message per remote node.
      const uint64_t want_rows = a == 2 ? flat_inter : row_node.size();
      CHECK(stats.inter_node_bytes() == want_rows * rb, al, "inter-node bytes ",
            stats.inter_node_bytes(), " want ", want_rows * rb);
      CHECK(stats.inter_node_messages() == remote_nodes.size(), al, "inter-node messages ",
            stats.inter_node_messages(), " want one per remote node with rows: ", remote_nodes.size());
      if (uniform_full)
        CHECK(stats.inter_node_messages() == group_nodes.size() - 1, al, "inter-node messages ",
              stats.inter_node_messages(), " want nodes - 1 = ", group_nodes.size() - 1);
    }
    CHECK(stats.seconds > 0 || exp.empty(), al, "seconds counted");

    // reduce: rows back to their sources, summed in the contract's order
    stats.reset();
    std::vector<float> dst = dst_init;
    ex.reduce(plan, rows.data(), dst.data(), H);
    CHECK(std::memcmp(dst.data(), want.data(), dst.size() * sizeof(float)) == 0, al,
          "reduce is not bit-identical to the naive sum in the contract's order");
    double worst = 0;
    for (size_t k = 0; k < dst.size(); ++k)
      worst = std::max(worst, std::fabs(dst[k] - want_d[k]) / (abs_d[k] + 1.0));
    CHECK(worst < 1e-5, al, "reduce vs double-precision sum: relative error ", worst);
    reduce_of[a] = dst;
    if (a == 0)
      CHECK(stats.inter_node_bytes() == back_flat_inter * rb, al, "reduce inter-node bytes ",
            stats.inter_node_bytes(), " want ", back_flat_inter * rb);
    if (a == 1)
      CHECK(stats.inter_node_bytes() == back_rbd_inter * rb, al, "reduce inter-node bytes ",
            stats.inter_node_bytes(), " want one per pilot held: ", back_rbd_inter * rb);
    if (a == 2)
      CHECK(stats.inter_node_bytes() == back_halo_inter * rb, al, "reduce inter-node bytes ",
            stats.inter_node_bytes(), " want the rows of the sources I am rail peer of: ",
            back_halo_inter * rb);
    if (a == 3)
      CHECK(stats.inter_node_bytes() == back_rbdhalo_inter * rb, al, "reduce inter-node bytes ",
            stats.inter_node_bytes(), " want one per distinct row of the sources I am rail peer of: ",
            back_rbdhalo_inter * rb);

    // return_values
    std::vector<float> rv(exp.size()), sv(mine.size(), -1.0f);
    for (size_t i = 0; i < exp.size(); ++i) rv[i] = static_cast<float>(g.world_rank() * 1000 + i);
    ex.return_values(plan, rv.data(), sv.data());
    bool rv_ok = true;
    for (int p = 0; p < mine.size(); ++p)
      rv_ok &= sv[p] == static_cast<float>(g.world_rank_of(mine.dst[p]) * 1000 + my_index[p]);
    CHECK(rv_ok, al, "return_values");

    // the plan is reusable: a second multicast gives the same rows
    std::vector<float> again(exp.size() * H, 0.0f);
    ex.multicast(plan, src.data(), again.data(), H);
    CHECK(again == recv, al, "plan reuse");

    // Kept staging rows (keep_staging, the SMPI programs' mode): calls reuse buffers that hold the
    // previous call's rows, and give the same bits, call after call.
    TokenExchange kept(g, topo, parse_a2a(kAlgos[a], "test"), nullptr);
    kept.keep_staging(true);
    for (int round = 0; round < 2; ++round) {
      std::vector<float> r2(exp.size() * H, -3.0f), d2 = dst_init;
      kept.multicast(plan, src.data(), r2.data(), H);
      CHECK(r2 == recv, al, "kept staging, round ", round, ": multicast differs");
      kept.reduce(plan, rows.data(), d2.data(), H);
      CHECK(std::memcmp(d2.data(), dst.data(), dst.size() * sizeof(float)) == 0, al,
            "kept staging, round ", round, ": reduce is not bit-identical");
    }

    // Rows not copied (set_copy_rows(false), the simulated step's mode): the same messages and
    // bytes on every link class as the real exchange, and the caller's buffers left untouched.
    TrafficStats real_stats, sized_stats;
    TokenExchange real(g, topo, parse_a2a(kAlgos[a], "test"), &real_stats);
    TokenExchange sized(g, topo, parse_a2a(kAlgos[a], "test"), &sized_stats);
    sized.keep_staging(true);
    sized.set_copy_rows(false);
    std::vector<float> r3(exp.size() * H, -3.0f), d3 = dst_init, scratch_r(exp.size() * H), scratch_d = dst_init;
    real.multicast(plan, src.data(), scratch_r.data(), H);
    real.reduce(plan, rows.data(), scratch_d.data(), H);
    sized.multicast(plan, src.data(), r3.data(), H);
    sized.reduce(plan, rows.data(), d3.data(), H);
    bool same_traffic = true;
    for (int c = 0; c < kNumLinkClasses; ++c)
      same_traffic &= real_stats.bytes[c] == sized_stats.bytes[c] && real_stats.messages[c] == sized_stats.messages[c];
    CHECK(same_traffic, al, "rows not copied: traffic differs from the real exchange's");
    CHECK(d3 == dst_init, al, "rows not copied: reduce changed dst");
  }
  for (int a = 1; a < kNumAlgos; ++a) {
    CHECK(recv_of[a] == recv_of[0], at, kAlgos[a], " multicast differs from flat");
    CHECK(reduce_of[a].size() == reduce_of[0].size() &&
              std::memcmp(reduce_of[a].data(), reduce_of[0].data(),
                          reduce_of[0].size() * sizeof(float)) == 0,
          at, kAlgos[a], " reduce is not bit-identical to flat");
  }
}

// Routing with k distinct experts of E = experts_per_rank * n, expert e on rank e / experts_per_rank.
Pairs topk_pairs(Rng rng, int T, int k, int n, int experts_per_rank) {
  const int E = experts_per_rank * n;
  Pairs P;
  P.T = T;
  k = std::min(k, E);
  for (int t = 0; t < T; ++t) {
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < k) {
      int e = static_cast<int>(rng.below(E));
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) P.add(t, e / experts_per_rank, e);
  }
  P.sort_by_dst();
  return P;
}

// The fold key (plan's fold_key, used by expert migration): whichever ranks hold the experts, and
// whichever algorithm moves the rows, reduce sums each token's expert outputs in key order, so the
// result is the same bits as the naive left fold in expert order at the source.
void test_keyed_fold(const Group& g, const Topology& topo) {
  const int n = g.size(), me = g.rank(), per = 3, E = per * n, k = 4, T = 24, H = 5;
  // Each token's k distinct experts, in ascending order (the layout order of the model).
  Rng rng = derive_rng(11, me);
  std::vector<std::vector<int>> experts(T);
  for (int t = 0; t < T; ++t) {
    while (static_cast<int>(experts[t].size()) < std::min(k, E)) {
      const int e = static_cast<int>(rng.below(E));
      if (std::find(experts[t].begin(), experts[t].end(), e) == experts[t].end()) experts[t].push_back(e);
    }
    std::sort(experts[t].begin(), experts[t].end());
  }
  // An expert's output for token t of rank s: values whose sum depends on the order of addition.
  auto out = [](int s, int t, int e, int h) {
    return static_cast<float>(std::sin(1.0 + s * 977 + t * 131 + e * 17 + h) * std::pow(10.0, (e * 7 + h) % 9 - 4));
  };
  // Placements: contiguous, and every rank's experts shuffled over the ranks (the same on all).
  std::vector<int> identity(E), shuffled(E);
  for (int e = 0; e < E; ++e) identity[e] = e / per;
  std::vector<int> perm(E);
  std::iota(perm.begin(), perm.end(), 0);
  Rng shared = derive_rng(12, 0);
  for (int i = E - 1; i > 0; --i) std::swap(perm[i], perm[shared.below(i + 1)]);
  for (int e = 0; e < E; ++e) shuffled[perm[e]] = e / per;
  std::vector<float> want(static_cast<size_t>(T) * H, 0.0f);
  for (int t = 0; t < T; ++t)
    for (int e : experts[t])
      for (int h = 0; h < H; ++h) want[t * H + h] = want[t * H + h] + out(me, t, e, h);
  for (const auto* where : {&identity, &shuffled}) {
    // Pairs in layout order (expert, then token) regrouped by destination rank, stable.
    std::vector<std::pair<int, int>> layout;  // (expert, token)
    for (int t = 0; t < T; ++t)
      for (int e : experts[t]) layout.push_back({e, t});
    std::sort(layout.begin(), layout.end());
    std::vector<int> order(layout.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return (*where)[layout[a].first] < (*where)[layout[b].first]; });
    std::vector<int32_t> src_row, dst, tag, key;
    std::vector<float> val;
    for (int q : order) {
      src_row.push_back(layout[q].second);
      dst.push_back((*where)[layout[q].first]);
      tag.push_back(layout[q].first);
      key.push_back(q);
      val.push_back(1.0f);
    }
    for (int a = 0; a < kNumAlgos; ++a) {
      TokenExchange ex(g, topo, parse_a2a(kAlgos[a], "test"), nullptr);
      ExchangePlan plan = ex.plan(T, static_cast<int>(src_row.size()), src_row.data(), dst.data(), tag.data(),
                                  val.data(), key.data());
      // Which (source, token) each received pair is: stamped rows through the multicast.
      std::vector<float> stamp(T), got(plan.num_recv);
      for (int t = 0; t < T; ++t) stamp[t] = static_cast<float>(t);
      ex.multicast(plan, stamp.data(), got.data(), 1);
      std::vector<float> rows(static_cast<size_t>(plan.num_recv) * H);
      for (int i = 0; i < plan.num_recv; ++i)
        for (int h = 0; h < H; ++h)
          rows[i * H + h] = out(plan.recv_src_rank[i], static_cast<int>(got[i]), plan.recv_tag[i], h);
      std::vector<float> dst_rows(static_cast<size_t>(T) * H, 0.0f);
      ex.reduce(plan, rows.data(), dst_rows.data(), H);
      CHECK(std::memcmp(dst_rows.data(), want.data(), want.size() * sizeof(float)) == 0, "keyed fold (",
            kAlgos[a], where == &identity ? ", contiguous" : ", shuffled", " placement, group rank ", me,
            "): reduce is not the left fold in expert order");
    }
  }
}

void test_exchange(const Group& world, const Topology& topo) {
  const int n = world.size(), r = world.rank();
  test_keyed_fold(world, topo);

  // uniform top-k, enough rows that every rank has rows for every node
  run_scenario("uniform", world, topo, topk_pairs(derive_rng(1, r), 64, 4, n, 4), 16, true);

  // duplicates: k = 3 destination ranks drawn with replacement (repeated (row, rank) pairs); some
  // rows unrouted; odd H
  {
    Pairs P;
    P.T = 20;
    Rng rng = derive_rng(2, r);
    for (int t = 0; t < P.T; ++t)
      if (t % 5 != 3)
        for (int j = 0; j < 3; ++j) P.add(t, static_cast<int>(rng.below(n)), j);
    P.sort_by_dst();
    run_scenario("duplicates", world, topo, P, 5, false);
  }

  // rank 0 sends nothing; nobody sends to the last rank
  {
    Pairs P;
    P.T = 6;
    Rng rng = derive_rng(3, r);
    if (r != 0)
      for (int t = 0; t < P.T; ++t)
        for (int j = 0; j < 2; ++j) P.add(t, static_cast<int>(rng.below(std::max(1, n - 1))), j);
    if (n == 1) P = Pairs(6);
    P.sort_by_dst();
    run_scenario("silent sender / idle receiver", world, topo, P, 7, false);
  }

  // all pairs to rank 0 (several per row)
  {
    Pairs P;
    P.T = 10;
    for (int t = 0; t < P.T; ++t)
      for (int j = 0; j < 3; ++j) P.add(t, 0, j);
    run_scenario("all to rank 0", world, topo, P, 4, false);
  }

  // every row to every rank (each row reaches every node), no rows at all
  {
    Pairs P;
    P.T = 8;
    for (int t = 0; t < P.T; ++t)
      for (int d = 0; d < n; ++d) P.add(t, d, d);
    P.sort_by_dst();
    run_scenario("broadcast", world, topo, P, 3, true);
    run_scenario("empty", world, topo, Pairs(3), 4, false);
  }

  // a split group (odd/even world ranks): group ranks differ from world ranks
  if (n >= 2) {
    Group half = world.split(r % 2, r);
    run_scenario("split group", half, topo, topk_pairs(derive_rng(5, r), 32, 3, half.size(), 2), 6,
                 false);
  }

  // a group whose nodes hold different numbers of its ranks (world ranks r % 3 != 2 and the rest):
  // halo's rail peers wrap around, rbd's pilots still land on the right node
  if (n >= 3) {
    Group uneven = world.split(r % 3 == 2 ? 1 : 0, r);
    run_scenario("uneven group", uneven, topo, topk_pairs(derive_rng(6, r), 24, 3, uneven.size(), 3),
                 5, false);
  }

  // bad input: one rank errs with the field named; the others learn which rank erred (flat
  // metadata: rbd; metadata by rails: rbd-halo)
  for (A2a algo : {A2a::kRbd, A2a::kRbdHalo}) {
    TokenExchange ex(world, topo, algo, nullptr);
    const int bad = n - 1;
    std::vector<int32_t> rows = {0, 1}, dsts = {std::min(1, n - 1), 0}, tags = {0, 0};
    std::vector<float> vals = {1, 1};
    if (n > 1) {
      // clang-format off
      expect_error("unsorted dst", [&] {
        if (r == bad) ex.plan(2, 2, rows.data(), dsts.data(), tags.data(), vals.data());
        else ex.plan(0, 0, nullptr, nullptr, nullptr, nullptr);
      }, r == bad ? std::vector<std::string>{"dst_rank[1] = 0", "ascending"}
                  : std::vector<std::string>{str_cat("group rank(s) ", bad)});
    }
    std::vector<int32_t> far = {n};
    expect_error("dst out of range", [&] {
      if (r == bad) ex.plan(2, 1, rows.data(), far.data(), tags.data(), vals.data());
      else ex.plan(0, 0, nullptr, nullptr, nullptr, nullptr);
    }, r == bad ? std::vector<std::string>{str_cat("dst_rank[0] = ", n), "out of range"}
                : std::vector<std::string>{str_cat("group rank(s) ", bad)});
    std::vector<int32_t> zero = {0}, big_row = {7};
    expect_error("src_row out of range", [&] {
      ex.plan(2, 1, big_row.data(), zero.data(), tags.data(), vals.data());
    }, {"src_row[0] = 7", "[0, 2)"});
    // clang-format on
    expect_error("unknown algorithm", [] { parse_a2a("ring", "--a2a"); }, {"'ring'"});
    // a plan of one algorithm is refused by another
    ExchangePlan p = ex.plan(1, 1, zero.data(), zero.data(), tags.data(), vals.data());
    TokenExchange flat(world, topo, A2a::kFlat, nullptr);
    float x = 1, y = 0;
    expect_error("plan/algorithm mismatch", [&] { flat.multicast(p, &x, &y, 1); },
                 {str_cat("'", name(algo), "'"), "'flat'"});
    // after the errors, exchanges still work
    std::vector<float> recv(p.num_recv, 0.0f);
    x = static_cast<float>(r);
    ex.multicast(p, &x, recv.data(), 1);
    bool ok = p.num_recv == (r == 0 ? n : 0);
    for (int i = 0; ok && i < p.num_recv; ++i) ok = recv[i] == i && p.recv_src_rank[i] == i;
    CHECK(ok, "exchange after errors");
  }
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  int rpn = 0, npg = 0;
  for (int i = 1; i + 1 < argc; ++i) {
    std::string a = argv[i];
    if (a == "--ranks-per-node") rpn = std::atoi(argv[++i]);
    else if (a == "--nodes-per-group") npg = std::atoi(argv[++i]);
  }
  int failed_total = 0;
  {
    Group world = Group::world();
    ck.rank = world.rank();
    try {
      Topology topo = Topology::detect(world.size(), rpn, npg);
      if (world.rank() == 0)
        std::printf("test_exchange: %s\n", topo.describe().c_str());
      test_group(world);
      test_topology(topo, world.size());
      test_exchange(world, topo);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] uncaught: %s\n", world.rank(), e.what());
      std::fflush(stderr);
      MpiRuntime::abort(2);
    }
    failed_total = ck.report(world);
  }
  return failed_total ? 1 : 0;
}
