// Cluster presets, profile files and their validation. See cluster.h.
#include "plan/cluster.h"

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"
#include "io/output_file.h"

namespace moe::plan {
namespace {
using nlohmann::json;

std::vector<double> pow4_grid(double lo, double hi) {
  std::vector<double> g;
  for (double v = lo; v <= hi * 1.0001; v *= 4) g.push_back(v);
  return g;
}
}  // namespace

GemmTable roofline_gemm(double peak, double bw, double eff, double eb, double launch) {
  GemmTable t;
  t.m = pow4_grid(16, 65536);
  t.n = t.m;
  t.k = t.m;
  for (double m : t.m)
    for (double n : t.n)
      for (double k : t.k) {
        const double flops = 2 * m * n * k;
        const double sec = std::max(flops / (eff * peak), (m * k + k * n + m * n) * eb / bw) + launch;
        t.gflops.push_back(flops / sec * 1e-9);
      }
  return t;
}

AttentionTable roofline_attention(double peak, double eff) {
  // Fused (flash) attention: the causal half only, so the nominal full-square FLOPs run at about
  // twice the kernel's rate in forward; backward recomputes the scores (2.5x forward's work).
  AttentionTable t;
  t.t = pow4_grid(256, 65536);
  t.hd = {32, 64, 128, 256};
  for (double T : t.t)
    for (double h : t.hd) {
      const double shape = T / (T + 256) * std::min(1.0, h / 64);
      t.fwd_gflops.push_back(2.0 * eff * peak * shape * 1e-9);
      t.bwd_gflops.push_back(1.28 * eff * peak * shape * 1e-9);
    }
  return t;
}

double fan_out_seconds(const LinkClass& l, double bytes, int peers) {
  if (bytes <= 0 || peers <= 0) return 0;
  const double whole = l.injection > 0 ? l.injection : l.bandwidth;
  return std::max(bytes / peers / l.bandwidth, bytes / whole);
}

ClusterProfile cluster_preset(const std::string& name) {
  ClusterProfile p;
  p.name = name;
  p.kind = NodeKind::kGpu;
  p.precision = Precision::kBf16;
  p.fused_attention = true;
  if (name == "frontier") {
    // REFERENCE §4: 8 MI250X GCDs per node, 64 GB HBM2E and 191.5 TFLOPS bf16 each; Infinity
    // Fabric 50-100 GB/s between GCDs of different MI250X (the lower bound for an all-to-all);
    // 4 Slingshot NICs of 25 GB/s per node (12.5 GB/s per GCD); Dragonfly groups of 128 nodes on
    // 32 switches: the 4 nodes of one switch are one hop apart (N_h = 4); global links ~57% of
    // injection bandwidth.
    p.ranks_per_node = 8;
    p.nodes = 9408;
    p.fast_domain_nodes = 4;
    p.nodes_per_group = 128;
    p.nics_per_node = 4;
    p.nic_bandwidth = 25e9;
    p.hbm_bytes = 64e9;
    p.reserved_bytes = 2e9;
    p.peak_flops = 191.5e12;
    p.mem_bandwidth = 1.6e12;
    // Wire latency (platforms/gen_platform.py's frontier figures): 0.9 us between GCDs (measured
    // shared-memory latency), 1 us per NIC end + 0.35 us per switch hop (assumed) between nodes.
    // Each GCD reaches each of its 7 peers over Infinity Fabric links of its own pair (REFERENCE
    // §4's 50-100 GB/s is per pair), so a fan-out to all of them runs at 7 x 50 GB/s, as on the
    // simulated platform (platforms/gen_platform.py: each intra-node flow has its own 50 GB/s).
    p.intra_node = {50e9, 5e-6, 0.9e-6, 7 * 50e9};
    p.inter_node = {12.5e9, 10e-6, 2.35e-6};
    p.inter_group = {0.57 * 12.5e9, 15e-6, 2.7e-6};
    p.gemm_nt = p.gemm_nn = p.gemm_tn = roofline_gemm(p.peak_flops, p.mem_bandwidth, 0.70, 2, 8e-6);
    p.attention = roofline_attention(p.peak_flops, 0.45);
    p.notes = "preset from REFERENCE §4 (published figures); GEMM/attention tables are a roofline";
  } else if (name == "dgx-h100") {
    // 8 H100 SXM 80 GB per node, 989 TFLOPS dense bf16, 3.35 TB/s HBM3; NVLink 450 GB/s per GPU
    // per direction; 8 x 50 GB/s NICs per node (one per GPU), a non-blocking fat tree.
    p.ranks_per_node = 8;
    p.nodes = 0;
    p.fast_domain_nodes = 1;
    p.nodes_per_group = 0;
    p.nics_per_node = 8;
    p.nic_bandwidth = 50e9;
    p.hbm_bytes = 80e9;
    p.reserved_bytes = 3e9;
    p.peak_flops = 989e12;
    p.mem_bandwidth = 3.35e12;
    // Wire latency (platforms/gen_platform.py's dgx-h100 figures): 0.9 us inside the node, 1 us
    // per NIC end + 3 x 0.3 us leaf-spine-leaf between nodes (assumed).
    // NVSwitch: a GPU's 450 GB/s is shared by its peers (injection = bandwidth).
    p.intra_node = {450e9, 3e-6, 0.9e-6, 450e9};
    p.inter_node = {50e9, 8e-6, 2.9e-6};
    p.inter_group = {50e9, 10e-6, 2.9e-6};
    p.gemm_nt = p.gemm_nn = p.gemm_tn = roofline_gemm(p.peak_flops, p.mem_bandwidth, 0.75, 2, 5e-6);
    p.attention = roofline_attention(p.peak_flops, 0.5);
    p.notes = "preset from vendor figures; GEMM/attention tables are a roofline";
  } else {
    throw Error(str_cat("unknown cluster \"", name,
                        "\" (presets: frontier, dgx-h100; or a profile.json from moetrain calibrate)"));
  }
  // Memory-bound work on bf16 activations: each element written once and read ~1.5 times in
  // forward, twice that in backward. AdamW: fp32 master, m, v read and written, bf16 grad read,
  // bf16 weight written: ~28 bytes per parameter.
  p.elem_fwd = {{1.0}, {2.5 * 2 / p.mem_bandwidth}};
  p.elem_bwd = {{1.0}, {2 * 2.5 * 2 / p.mem_bandwidth}};
  p.recompute_fwd = p.recompute_bwd = {{1.0}, {1e-30}};
  p.optimizer_s_per_param = 28 / p.mem_bandwidth;
  p.validate("cluster " + name);
  return p;
}

std::vector<std::string> cluster_preset_names() { return {"frontier", "dgx-h100"}; }

double ClusterProfile::rank_memory(int ranks_on_node) const {
  return kind == NodeKind::kCpu ? hbm_bytes / std::max(1, ranks_on_node) : hbm_bytes;
}

double ClusterProfile::compute_share_at(int ranks_on_node) const {
  if (kind != NodeKind::kCpu) return 1.0;
  if (!compute_share.empty()) return compute_share.at(ranks_on_node);
  // Without a measurement: ranks beyond the cores time-share them.
  return cores_per_node > 0 ? std::min(1.0, static_cast<double>(cores_per_node) / ranks_on_node) : 1.0;
}

const CommCurve* ClusterProfile::find_comm(const std::string& op, std::optional<A2a> algo, int world,
                                           int group, int rpn) const {
  const CommCurve* best = nullptr;
  int best_d = 1 << 30;
  for (const CommCurve& c : comm) {
    if (c.op != op || c.algo != algo || c.group != group) continue;
    if (op == "a2a" && c.ranks_per_node != rpn) continue;
    const int d = std::abs(c.world - world);
    if (d < best_d) {
      best = &c;
      best_d = d;
    }
  }
  return best;
}

void ClusterProfile::validate(const std::string& w) const {
  auto positive = [&](const char* f, double v) {
    MOE_CHECK(v > 0 && std::isfinite(v), w, ": \"", f, "\" must be positive, got ", v);
  };
  auto non_negative = [&](const char* f, double v) {
    MOE_CHECK(v >= 0 && std::isfinite(v), w, ": \"", f, "\" must be >= 0, got ", v);
  };
  positive("ranks_per_node", ranks_per_node);
  non_negative("nodes", nodes);
  positive("fast_domain_nodes", fast_domain_nodes);
  non_negative("nodes_per_group", nodes_per_group);
  positive("nics_per_node", nics_per_node);
  positive("nic_bandwidth", nic_bandwidth);
  positive("hbm_bytes", hbm_bytes);
  non_negative("reserved_bytes", reserved_bytes);
  MOE_CHECK(reserved_bytes < hbm_bytes, w, ": \"reserved_bytes\" (", reserved_bytes,
            ") is not below \"hbm_bytes\" (", hbm_bytes, ")");
  positive("peak_flops", peak_flops);
  positive("mem_bandwidth", mem_bandwidth);
  for (const auto& [name, link] : {std::pair{"intra_node", &intra_node}, std::pair{"inter_node", &inter_node},
                                   std::pair{"inter_group", &inter_group}}) {
    const std::string f = str_cat("links.", name, ".");
    positive((f + "bandwidth").c_str(), link->bandwidth);
    non_negative((f + "latency").c_str(), link->latency);
    non_negative((f + "wire_latency").c_str(), link->wire_latency);
    non_negative((f + "injection").c_str(), link->injection);
  }
  MOE_CHECK(!elem_fwd.empty() && !elem_bwd.empty() && !recompute_fwd.empty() && !recompute_bwd.empty(), w,
            ": \"elementwise\" tables are missing");
  positive("optimizer_s_per_param", optimizer_s_per_param);
  non_negative("cores_per_node", cores_per_node);
  MOE_CHECK(!gemm_nt.empty() && !gemm_nn.empty() && !gemm_tn.empty(), w, ": \"gemm\" tables are missing");
  MOE_CHECK(!attention.empty(), w, ": \"attention\" table is missing");
  if (nodes > 0 && nodes_per_group > 0)
    MOE_CHECK(nodes_per_group <= nodes, w, ": \"nodes_per_group\" (", nodes_per_group,
              ") exceeds \"nodes\" (", nodes, ")");
}

json profile_to_json(const ClusterProfile& p) {
  auto link = [](const LinkClass& l) {
    json j{{"bandwidth", l.bandwidth}, {"latency", l.latency}, {"wire_latency", l.wire_latency}};
    if (l.injection > 0) j["injection"] = l.injection;
    return j;
  };
  json comm = json::array();
  for (const CommCurve& c : p.comm)
    comm.push_back({{"op", c.op},
                    {"algo", c.algo ? name(*c.algo) : ""},
                    {"world", c.world},
                    {"group", c.group},
                    {"ranks_per_node", c.ranks_per_node},
                    {"bytes", c.seconds.x},
                    {"seconds", c.seconds.y}});
  json j = {{"name", p.name},
            {"kind", name(p.kind)},
            {"precision", name(p.precision)},
            {"ranks_per_node", p.ranks_per_node},
            {"nodes", p.nodes},
            {"fast_domain_nodes", p.fast_domain_nodes},
            {"nodes_per_group", p.nodes_per_group},
            {"nics_per_node", p.nics_per_node},
            {"nic_bandwidth", p.nic_bandwidth},
            {"hbm_bytes", p.hbm_bytes},
            {"reserved_bytes", p.reserved_bytes},
            {"peak_flops", p.peak_flops},
            {"mem_bandwidth", p.mem_bandwidth},
            {"fused_attention", p.fused_attention},
            // clang-format off
            {"links", {{"intra_node", link(p.intra_node)}, {"inter_node", link(p.inter_node)},
                       {"inter_group", link(p.inter_group)}}},
            // clang-format on
            {"gemm", {{"nt", to_json(p.gemm_nt)}, {"nn", to_json(p.gemm_nn)}, {"tn", to_json(p.gemm_tn)}}},
            {"attention", to_json(p.attention)},
            // clang-format off
            {"elementwise", {{"fwd", to_json(p.elem_fwd)}, {"bwd", to_json(p.elem_bwd)},
                             {"recompute_fwd", to_json(p.recompute_fwd)},
                             {"recompute_bwd", to_json(p.recompute_bwd)}}},
            // clang-format on
            {"optimizer_s_per_param", p.optimizer_s_per_param},
            {"cores_per_node", p.cores_per_node},
            {"comm", comm},
            {"notes", p.notes}};
  if (!p.compute_share.empty()) j["compute_share"] = to_json(p.compute_share);
  return j;
}

namespace {
class Fields {
 public:
  Fields(const json& j, std::string w) : j_(j), w_(std::move(w)) {}
  const json& need(const json& o, const char* f, const std::string& path) const {
    MOE_CHECK(o.is_object() && o.contains(f), w_, ": missing field \"", path, "\"");
    return o[f];
  }
  double number(const json& o, const char* f, const std::string& path) const {
    const json& v = need(o, f, path);
    MOE_CHECK(v.is_number(), w_, ": field \"", path, "\" must be a number, got ", io::excerpt(v));
    // 1e999 parses as inf: a profile number must be finite.
    MOE_CHECK(std::isfinite(v.get<double>()), w_, ": field \"", path, "\" must be finite, got ",
              io::excerpt(v));
    return v.get<double>();
  }
  double number(const char* f) const { return number(j_, f, f); }
  int integer(const char* f) const {
    const json& v = need(j_, f, f);
    MOE_CHECK(v.is_number_integer(), w_, ": field \"", f, "\" must be an integer, got ", io::excerpt(v));
    // get<int64_t>, not get<int>: 4294967297 must not wrap to 1.
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max())
                              : v.get<int64_t>() >= std::numeric_limits<int>::min() &&
                                    v.get<int64_t>() <= std::numeric_limits<int>::max();
    MOE_CHECK(in_range, w_, ": field \"", f, "\" = ", io::excerpt(v), " is out of range [",
              std::numeric_limits<int>::min(), ", ", std::numeric_limits<int>::max(), "]");
    return static_cast<int>(v.get<int64_t>());
  }
  std::string string(const char* f) const {
    const json& v = need(j_, f, f);
    MOE_CHECK(v.is_string(), w_, ": field \"", f, "\" must be a string, got ", io::excerpt(v));
    return v.get<std::string>();
  }
  // A mode's word (core/modes.h): "frontier.json: \"kind\" is \"tpu\" (expected gpu or cpu)".
  template <class E>
  E mode(const char* f, E) const {
    const std::string s = string(f);
    const std::optional<E> m = find_mode<E>(s);
    MOE_CHECK(m, w_, ": \"", f, "\" is \"", s, "\" (expected ", accepted_names<E>(), ")");
    return *m;
  }
  LinkClass link(const char* f) const {
    const json& links = need(j_, "links", "links");
    const std::string path = std::string("links.") + f;
    const json& l = need(links, f, path);
    const double wire = l.is_object() && l.contains("wire_latency")
                            ? number(l, "wire_latency", path + ".wire_latency")
                            : 0;  // profiles written before the field: no per-phase term
    const double injection = l.is_object() && l.contains("injection")
                                 ? number(l, "injection", path + ".injection")
                                 : 0;  // one path shared by the peers
    return {number(l, "bandwidth", path + ".bandwidth"), number(l, "latency", path + ".latency"), wire,
            injection};
  }

 private:
  const json& j_;
  std::string w_;
};
}  // namespace

ClusterProfile profile_from_json(const json& j, const std::string& w) {
  MOE_CHECK(j.is_object(), w, ": a cluster profile must be a JSON object");
  Fields f(j, w);
  ClusterProfile p;
  p.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : w;
  p.kind = f.mode("kind", NodeKind());
  p.precision = f.mode("precision", Precision());
  p.ranks_per_node = f.integer("ranks_per_node");
  p.nodes = f.integer("nodes");
  p.fast_domain_nodes = f.integer("fast_domain_nodes");
  p.nodes_per_group = f.integer("nodes_per_group");
  p.nics_per_node = f.integer("nics_per_node");
  p.nic_bandwidth = f.number("nic_bandwidth");
  p.hbm_bytes = f.number("hbm_bytes");
  p.reserved_bytes = f.number("reserved_bytes");
  p.peak_flops = f.number("peak_flops");
  p.mem_bandwidth = f.number("mem_bandwidth");
  MOE_CHECK(j.contains("fused_attention") && j["fused_attention"].is_boolean(), w,
            ": field \"fused_attention\" must be true or false");
  p.fused_attention = j["fused_attention"].get<bool>();
  p.intra_node = f.link("intra_node");
  p.inter_node = f.link("inter_node");
  p.inter_group = f.link("inter_group");
  const json& g = f.need(j, "gemm", "gemm");
  p.gemm_nt = gemm_table_from_json(f.need(g, "nt", "gemm.nt"), w + ": gemm.nt");
  p.gemm_nn = gemm_table_from_json(f.need(g, "nn", "gemm.nn"), w + ": gemm.nn");
  p.gemm_tn = gemm_table_from_json(f.need(g, "tn", "gemm.tn"), w + ": gemm.tn");
  p.attention = attention_table_from_json(f.need(j, "attention", "attention"), w + ": attention");
  const json& e = f.need(j, "elementwise", "elementwise");
  p.elem_fwd = table1d_from_json(f.need(e, "fwd", "elementwise.fwd"), w + ": elementwise.fwd");
  p.elem_bwd = table1d_from_json(f.need(e, "bwd", "elementwise.bwd"), w + ": elementwise.bwd");
  p.recompute_fwd = table1d_from_json(f.need(e, "recompute_fwd", "elementwise.recompute_fwd"), w + ": elementwise.recompute_fwd");
  p.recompute_bwd = table1d_from_json(f.need(e, "recompute_bwd", "elementwise.recompute_bwd"), w + ": elementwise.recompute_bwd");
  p.optimizer_s_per_param = f.number("optimizer_s_per_param");
  p.cores_per_node = f.integer("cores_per_node");
  if (j.contains("compute_share"))
    p.compute_share = table1d_from_json(j["compute_share"], w + ": compute_share");
  if (j.contains("comm")) {
    MOE_CHECK(j["comm"].is_array(), w, ": field \"comm\" must be a list");
    int i = 0;
    for (const json& c : j["comm"]) {
      const std::string where = str_cat(w, ": comm[", i++, "]");
      Fields cf(c, where);
      CommCurve cc;
      cc.op = cf.string("op");
      MOE_CHECK(cc.op == "a2a" || cc.op == "p2p" || cc.op == "allreduce", where, ": op \"", cc.op,
                "\" (expected a2a, p2p or allreduce)");
      if (cc.op == "a2a") cc.algo = cf.mode("algo", A2a());
      cc.world = cf.integer("world");
      cc.group = cf.integer("group");
      cc.ranks_per_node = cf.integer("ranks_per_node");
      MOE_CHECK(cc.world > 0 && cc.group > 0 && cc.ranks_per_node >= 0, where,
                ": world and group must be positive and ranks_per_node >= 0");
      cc.seconds = table1d_from_json(json{{"x", c.value("bytes", json::array())},
                                          {"y", c.value("seconds", json::array())}},
                                     where);
      p.comm.push_back(cc);
    }
  }
  if (j.contains("notes") && j["notes"].is_string()) p.notes = j["notes"].get<std::string>();
  p.validate(w);
  return p;
}

ClusterProfile load_profile(const std::string& path) {
  ClusterProfile p = profile_from_json(io::read_json_file(path, "cluster profile"), path);
  p.name = path;
  return p;
}

void save_profile(const ClusterProfile& p, const std::string& path, const std::string& flag) {
  io::write_file_atomic(path, profile_to_json(p).dump(1) + "\n", flag);
}

ClusterProfile resolve_cluster(const std::string& s) {
  const bool path = s.size() > 5 && s.substr(s.size() - 5) == ".json";
  return path || s.find('/') != std::string::npos ? load_profile(s) : cluster_preset(s);
}

}  // namespace moe::plan
