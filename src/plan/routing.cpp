// Routing statistics from measured expert loads. See routing.h.
#include "plan/routing.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <nlohmann/json.hpp>

#include "balance/placement.h"
#include "core/error.h"
#include "io/json_file.h"

namespace moe::plan {

namespace {
// A metrics.jsonl line with expert_loads of 61 layers x 256 experts is ~100 KB; /dev/zero or a
// file without newlines must be an error, not an endless getline.
constexpr size_t kMaxLineBytes = size_t{64} << 20;

// Next line of f into line (without the '\n'); false at the end of the file.
bool read_line(std::istream& f, std::string& line, const std::string& path, int n) {
  line.clear();
  std::streambuf* sb = f.rdbuf();
  for (;;) {
    const int c = sb->sbumpc();
    if (c == std::char_traits<char>::eof()) return !line.empty();
    if (c == '\n') return true;
    MOE_CHECK(line.size() < kMaxLineBytes, path, ": line ", n, " is longer than ", kMaxLineBytes,
              " bytes (not a metrics.jsonl?)");
    line.push_back(static_cast<char>(c));
  }
}
}  // namespace

RoutingStats read_routing_stats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MOE_CHECK(f.good(), path, ": cannot open metrics file");
  std::error_code ec;
  MOE_CHECK(!std::filesystem::is_directory(path, ec), path, ": is a folder, not a metrics file");
  RoutingStats s;
  s.source = path;
  std::string line;
  int n = 0;
  while (read_line(f, line, path, n + 1)) {
    ++n;
    if (line.empty()) continue;
    // Depth-bounded parse (io::parse_json): the error names the file and the line.
    const nlohmann::json j = io::parse_json(line, str_cat(path, ": line ", n));
    if (!j.contains("expert_loads")) continue;
    const auto& loads = j["expert_loads"];
    MOE_CHECK(loads.is_array(), path, ": line ", n, ": \"expert_loads\" must be a list of lists");
    std::vector<std::vector<double>> step;
    for (const auto& layer : loads) {
      MOE_CHECK(layer.is_array() && !layer.empty(), path, ": line ", n, ": \"expert_loads\" must be a list of lists");
      std::vector<double> v;
      for (const auto& x : layer) {
        // 1e999 parses as inf and sums of counts near 1e308 overflow to inf: either way every
        // imbalance becomes NaN. A load is a token count: finite, at most 2^53 (exact in a double).
        constexpr double kMaxCount = 9007199254740992.0;
        MOE_CHECK(x.is_number() && x.get<double>() >= 0 && x.get<double>() <= kMaxCount, path,
                  ": line ", n, ": expert load ", io::excerpt(x), " is not a count (0 to 2^53)");
        v.push_back(x.get<double>());
      }
      MOE_CHECK(s.experts == 0 || static_cast<int>(v.size()) == s.experts, path, ": line ", n, ": ",
                v.size(), " experts in a layer, earlier lines had ", s.experts);
      s.experts = static_cast<int>(v.size());
      step.push_back(std::move(v));
    }
    if (!step.empty()) s.steps.push_back(std::move(step));
  }
  MOE_CHECK(!s.steps.empty(), path, ": no \"expert_loads\" in any line (a metrics.jsonl of moetrain train with MoE layers?)");
  return s;
}

Imbalance routing_imbalance(const RoutingStats& s, int ep, int node_ranks) {
  Imbalance im;
  if (ep <= 1 || s.steps.empty()) return im;
  MOE_CHECK(s.experts % ep == 0, s.source, ": ep(", ep, ") does not divide the ", s.experts,
            " experts of the expert loads");
  const balance::LayerPlacement place = balance::LayerPlacement::contiguous(s.experts, ep);
  double time_sum = 0, node_sum = 0;
  int time_n = 0;
  const int g = node_ranks >= 1 && ep % node_ranks == 0 ? node_ranks : 1;
  for (const auto& step : s.steps) {
    std::vector<double> step_rows(ep, 0.0);  // summed over the step's layers (memory)
    for (const auto& layer : step) {
      const std::vector<double> rows = balance::rank_loads(place, layer);
      const double total = std::accumulate(rows.begin(), rows.end(), 0.0);
      if (total <= 0) continue;
      time_sum += balance::imbalance(place, layer);
      ++time_n;
      std::vector<double> node(ep / g, 0.0);
      for (int r = 0; r < ep; ++r) node[r / g] += rows[r];
      node_sum += *std::max_element(node.begin(), node.end()) / (total / static_cast<double>(node.size()));
      for (int r = 0; r < ep; ++r) step_rows[r] += rows[r];
    }
    const double total = std::accumulate(step_rows.begin(), step_rows.end(), 0.0);
    if (total > 0) im.memory = std::max(im.memory, *std::max_element(step_rows.begin(), step_rows.end()) / (total / ep));
  }
  im.time = time_n > 0 ? time_sum / time_n : 1.0;
  im.node_time = time_n > 0 ? node_sum / time_n : 1.0;
  return im;
}

void check_routing_matches(const RoutingStats& s, int model_experts, const std::string& model_name) {
  MOE_CHECK(s.experts == model_experts, s.source, ": the expert loads have ", s.experts,
            " experts per MoE layer, model ", model_name, " has ", model_experts,
            " (loads of another model?)");
}

}  // namespace moe::plan
