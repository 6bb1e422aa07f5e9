// Measured (or roofline-generated) performance tables and their interpolation: the planner never
// uses one peak number for a shape it has a table for. Interpolation is linear in log2 of every
// coordinate and in log2 of the value (throughputs and times vary by orders of magnitude);
// outside the grid the nearest grid value is used (clamped), which for GEMM throughput means the
// largest measured shape's rate.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace moe::plan {

// y(x): e.g. all-to-all seconds by bytes per rank. Beyond the last point a time table
// extrapolates linearly in x (bandwidth-bound), below the first it is clamped (latency-bound).
struct Table1D {
  std::vector<double> x, y;  // x ascending, y > 0
  bool empty() const { return x.empty(); }
  double at(double x) const;
  double time_at(double bytes) const;  // at() with linear extrapolation above the last point
};

// GEMM throughput (GFLOP/s) on a grid of (m, n, k): C[m,n] += A[m,k] · B[k,n].
struct GemmTable {
  std::vector<double> m, n, k;  // ascending grids
  std::vector<double> gflops;   // [m.size()][n.size()][k.size()]
  bool empty() const { return gflops.empty(); }
  double gflops_at(double m, double n, double k) const;
  double seconds(double m, double n, double k) const;  // 2·m·n·k / throughput
};

// Attention (scores, softmax, values) per (sequence, head) on a grid of (seq_len T, head_dim), as
// throughput over nominal FLOPs: forward 4·T²·hd (q·kᵀ and att·v over the full T×T square),
// backward 8·T²·hd. Stored as rates so that a longer sequence than measured extrapolates as T².
struct AttentionTable {
  std::vector<double> t, hd;                   // ascending grids
  std::vector<double> fwd_gflops, bwd_gflops;  // [t.size()][hd.size()]
  bool empty() const { return fwd_gflops.empty(); }
  double fwd(double T, double head_dim) const;  // seconds per (sequence, head)
  double bwd(double T, double head_dim) const;
};

nlohmann::json to_json(const Table1D& t);
nlohmann::json to_json(const GemmTable& t);
nlohmann::json to_json(const AttentionTable& t);
// `where` names the place in the profile file for errors.
Table1D table1d_from_json(const nlohmann::json& j, const std::string& where);
GemmTable gemm_table_from_json(const nlohmann::json& j, const std::string& where);
AttentionTable attention_table_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace moe::plan
