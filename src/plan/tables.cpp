// Interpolation in log space over measured grids. See tables.h.
#include "plan/tables.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace moe::plan {
namespace {

using nlohmann::json;

// Position of x in an ascending grid as (index i, weight w): value = (1-w)·v[i] + w·v[i+1] in
// log2 space, clamped to the ends.
struct Pos {
  size_t i = 0;
  double w = 0;
};
Pos locate(const std::vector<double>& g, double x) {
  if (g.size() < 2 || x <= g.front()) return {0, 0};
  if (x >= g.back()) return {g.size() - 2, 1};
  size_t i = std::upper_bound(g.begin(), g.end(), x) - g.begin() - 1;
  const double w = (std::log2(x) - std::log2(g[i])) / (std::log2(g[i + 1]) - std::log2(g[i]));
  return {i, w};
}
void check_grid(const std::vector<double>& g, const std::string& where, const char* name) {
  MOE_CHECK(!g.empty(), where, ": grid \"", name, "\" is empty");
  for (size_t i = 0; i < g.size(); ++i) {
    MOE_CHECK(g[i] > 0, where, ": grid \"", name, "\" holds ", g[i], " (must be > 0)");
    MOE_CHECK(i == 0 || g[i] > g[i - 1], where, ": grid \"", name, "\" is not ascending");
  }
}
void check_values(const std::vector<double>& v, size_t n, const std::string& where, const char* name) {
  MOE_CHECK(v.size() == n, where, ": \"", name, "\" has ", v.size(), " values, expected ", n);
  for (double x : v) MOE_CHECK(x > 0 && std::isfinite(x), where, ": \"", name, "\" holds ", x, " (must be > 0)");
}
std::vector<double> numbers(const json& j, const char* f, const std::string& where) {
  MOE_CHECK(j.is_object() && j.contains(f) && j[f].is_array(), where, ": missing list \"", f, "\"");
  std::vector<double> v;
  for (const json& x : j[f]) {
    MOE_CHECK(x.is_number(), where, ": \"", f, "\" holds ", io::excerpt(x), ", not a number");
    v.push_back(x.get<double>());
  }
  return v;
}
// A grid axis: list f, ascending and positive.
std::vector<double> grid(const json& j, const char* f, const std::string& where) {
  std::vector<double> g = numbers(j, f, where);
  check_grid(g, where, f);
  return g;
}
// A table's values: list f of n positive numbers (the product of its grids' sizes).
std::vector<double> values(const json& j, const char* f, size_t n, const std::string& where) {
  std::vector<double> v = numbers(j, f, where);
  check_values(v, n, where, f);
  return v;
}

}  // namespace

double Table1D::at(double xq) const {
  MOE_CHECK(!x.empty(), "internal: lookup in an empty table");
  Pos p = locate(x, xq);
  if (x.size() == 1) return y[0];
  // Linear in y: a cost that is ~0 on one side of a threshold (e.g. page faults) stays ~0 only there.
  return (1 - p.w) * y[p.i] + p.w * y[p.i + 1];
}

double Table1D::time_at(double bytes) const {
  if (bytes > x.back()) return y.back() * bytes / x.back();
  return at(bytes);
}

double GemmTable::gflops_at(double mq, double nq, double kq) const {
  MOE_CHECK(!gflops.empty(), "internal: lookup in an empty GEMM table");
  Pos pm = locate(m, mq), pn = locate(n, nq), pk = locate(k, kq);
  auto v = [&](size_t a, size_t b, size_t c) {
    a = std::min(a, m.size() - 1);
    b = std::min(b, n.size() - 1);
    c = std::min(c, k.size() - 1);
    return std::log2(gflops[(a * n.size() + b) * k.size() + c]);
  };
  double acc = 0;
  for (int da = 0; da < 2; ++da)
    for (int db = 0; db < 2; ++db)
      for (int dc = 0; dc < 2; ++dc) {
        const double w = (da ? pm.w : 1 - pm.w) * (db ? pn.w : 1 - pn.w) * (dc ? pk.w : 1 - pk.w);
        if (w > 0) acc += w * v(pm.i + da, pn.i + db, pk.i + dc);
      }
  return std::exp2(acc);
}

double GemmTable::seconds(double mq, double nq, double kq) const {
  if (mq <= 0 || nq <= 0 || kq <= 0) return 0;
  return 2.0 * mq * nq * kq / (gflops_at(mq, nq, kq) * 1e9);
}

namespace {
double rate2(const std::vector<double>& t, const std::vector<double>& hd, const std::vector<double>& r,
             double tq, double hq) {
  Pos pt = locate(t, tq), ph = locate(hd, hq);
  auto v = [&](size_t a, size_t b) {
    a = std::min(a, t.size() - 1);
    b = std::min(b, hd.size() - 1);
    return std::log2(r[a * hd.size() + b]);
  };
  double acc = 0;
  for (int da = 0; da < 2; ++da)
    for (int db = 0; db < 2; ++db) {
      const double w = (da ? pt.w : 1 - pt.w) * (db ? ph.w : 1 - ph.w);
      if (w > 0) acc += w * v(pt.i + da, ph.i + db);
    }
  return std::exp2(acc);
}
}  // namespace

double AttentionTable::fwd(double T, double h) const {
  return 4.0 * T * T * h / (rate2(t, hd, fwd_gflops, T, h) * 1e9);
}
double AttentionTable::bwd(double T, double h) const {
  return 8.0 * T * T * h / (rate2(t, hd, bwd_gflops, T, h) * 1e9);
}

json to_json(const Table1D& t) { return json{{"x", t.x}, {"y", t.y}}; }
json to_json(const GemmTable& t) {
  return json{{"m", t.m}, {"n", t.n}, {"k", t.k}, {"gflops", t.gflops}};
}
json to_json(const AttentionTable& t) {
  return json{{"seq_len", t.t}, {"head_dim", t.hd}, {"fwd_gflops", t.fwd_gflops}, {"bwd_gflops", t.bwd_gflops}};
}

Table1D table1d_from_json(const json& j, const std::string& where) {
  Table1D t;
  t.x = grid(j, "x", where);
  t.y = values(j, "y", t.x.size(), where);
  return t;
}

GemmTable gemm_table_from_json(const json& j, const std::string& where) {
  GemmTable t;
  t.m = grid(j, "m", where);
  t.n = grid(j, "n", where);
  t.k = grid(j, "k", where);
  t.gflops = values(j, "gflops", t.m.size() * t.n.size() * t.k.size(), where);
  return t;
}

AttentionTable attention_table_from_json(const json& j, const std::string& where) {
  AttentionTable t;
  t.t = grid(j, "seq_len", where);
  t.hd = grid(j, "head_dim", where);
  t.fwd_gflops = values(j, "fwd_gflops", t.t.size() * t.hd.size(), where);
  t.bwd_gflops = values(j, "bwd_gflops", t.t.size() * t.hd.size(), where);
  return t;
}

}  // namespace moe::plan
