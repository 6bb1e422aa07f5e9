#include "balance/placement.h"

#include <algorithm>

#include "core/error.h"

namespace moe::balance {

LayerPlacement LayerPlacement::contiguous(int num_experts, int ep_size) {
  MOE_CHECK(ep_size >= 1 && num_experts >= 0 && num_experts % ep_size == 0, "expert placement: ", ep_size,
            " expert-parallel ranks do not divide the ", num_experts, " routed experts");
  const int per = num_experts / ep_size;
  std::vector<std::vector<int>> at(ep_size);
  for (int e = 0; e < num_experts; ++e) at[e / per].push_back(e);
  return from_ranks(at, "the contiguous placement");
}

LayerPlacement LayerPlacement::from_ranks(const std::vector<std::vector<int>>& experts_at, const std::string& what) {
  LayerPlacement p;
  p.ep_ = static_cast<int>(experts_at.size());
  MOE_CHECK(p.ep_ >= 1, what, ": no expert-parallel ranks");
  const size_t per = experts_at[0].size();
  for (int r = 0; r < p.ep_; ++r)
    MOE_CHECK(experts_at[r].size() == per, what, ": rank ", r, " holds ", experts_at[r].size(),
              " experts, rank 0 holds ", per, " (every rank holds the same number)");
  p.E_ = static_cast<int>(per) * p.ep_;
  p.rank_of_.assign(p.E_, -1);
  p.slot_of_.assign(p.E_, -1);
  p.expert_at_.resize(p.E_);
  for (int r = 0; r < p.ep_; ++r) {
    for (size_t s = 0; s < per; ++s) {
      const int e = experts_at[r][s];
      MOE_CHECK(e >= 0 && e < p.E_, what, ": rank ", r, " slot ", s, ": expert ", e, " is outside [0, ", p.E_, ")");
      MOE_CHECK(p.rank_of_[e] < 0, what, ": expert ", e, " is placed twice (rank ", p.rank_of_[e], " and rank ", r, ")");
      p.rank_of_[e] = r;
      p.slot_of_[e] = static_cast<int>(s);
      p.expert_at_[r * per + s] = e;
    }
  }
  return p;
}

std::vector<int> LayerPlacement::experts_of(int rank) const {
  const size_t per = per_rank();
  return std::vector<int>(expert_at_.begin() + rank * per, expert_at_.begin() + (rank + 1) * per);
}

bool LayerPlacement::is_contiguous() const {
  for (int e = 0; e < E_; ++e)
    if (expert_at_[e] != e) return false;
  return true;
}

void LayerPlacement::swap_experts(int a, int b) {
  MOE_CHECK(a >= 0 && a < E_ && b >= 0 && b < E_, "swap_experts: experts ", a, ", ", b, " outside [0, ", E_, ")");
  const int ra = rank_of_[a], sa = slot_of_[a], rb = rank_of_[b], sb = slot_of_[b];
  rank_of_[a] = rb;
  slot_of_[a] = sb;
  rank_of_[b] = ra;
  slot_of_[b] = sa;
  expert_at_[static_cast<size_t>(ra) * per_rank() + sa] = b;
  expert_at_[static_cast<size_t>(rb) * per_rank() + sb] = a;
}

Placement Placement::contiguous(const std::vector<bool>& is_moe, int num_experts, int ep_size) {
  Placement p;
  p.layers.resize(is_moe.size());
  for (size_t l = 0; l < is_moe.size(); ++l)
    if (is_moe[l]) p.layers[l] = LayerPlacement::contiguous(num_experts, ep_size);
  return p;
}

bool Placement::is_contiguous() const {
  return std::all_of(layers.begin(), layers.end(), [](const LayerPlacement& l) { return l.is_contiguous(); });
}

nlohmann::json Placement::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (size_t l = 0; l < layers.size(); ++l) {
    if (layers[l].empty()) continue;
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < layers[l].ep_size(); ++r) ranks.push_back(layers[l].experts_of(r));
    j[std::to_string(l)] = ranks;
  }
  return j;
}

Placement Placement::from_json(const nlohmann::json& j, const std::vector<bool>& is_moe, int num_experts,
                               int ep_size, const std::string& what) {
  MOE_CHECK(j.is_object(), what, " must be a JSON object {layer: placement}");
  Placement p = contiguous(is_moe, num_experts, ep_size);
  for (const auto& [key, value] : j.items()) {
    size_t l = 0;
    bool number = !key.empty() && key.size() < 6 && std::all_of(key.begin(), key.end(), ::isdigit);
    if (number) l = std::stoul(key);
    MOE_CHECK(number && l < is_moe.size() && is_moe[l], what, ": \"", key.substr(0, 32),
              "\" is not an MoE layer of this model");
    const std::string where = what + ", layer " + key;
    MOE_CHECK(value.is_array() && static_cast<int>(value.size()) == (value.size() && value[0].is_array() ? ep_size : num_experts),
              where, ": expected ", ep_size, " lists of experts (one per EP rank) or ", num_experts,
              " ranks (one per expert), got ", value.dump().substr(0, 64));
    std::vector<std::vector<int>> at(ep_size);
    auto as_int = [&](const nlohmann::json& v, int hi, const char* name) {
      MOE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < hi, where, ": ", name, " ",
                v.dump().substr(0, 32), " is outside [0, ", hi, ")");
      return v.get<int>();
    };
    if (!value.empty() && value[0].is_array()) {
      for (int r = 0; r < ep_size; ++r) {
        MOE_CHECK(value[r].is_array(), where, ": rank ", r, ": expected a list of experts");
        for (const auto& e : value[r]) at[r].push_back(as_int(e, num_experts, "expert"));
      }
    } else {
      for (int e = 0; e < num_experts; ++e) at[as_int(value[e], ep_size, "EP rank")].push_back(e);
    }
    p.layers[l] = LayerPlacement::from_ranks(at, where);
    MOE_CHECK(p.layers[l].num_experts() == num_experts, where, ": places ", p.layers[l].num_experts(),
              " experts, the model has ", num_experts);
  }
  return p;
}

std::vector<double> rank_loads(const LayerPlacement& p, const std::vector<double>& expert_load) {
  MOE_CHECK(static_cast<int>(expert_load.size()) == p.num_experts(), "rank_loads: ", expert_load.size(),
            " expert loads for ", p.num_experts(), " experts");
  std::vector<double> out(p.ep_size(), 0.0);
  for (int e = 0; e < p.num_experts(); ++e) out[p.rank_of(e)] += expert_load[e];
  return out;
}

double imbalance(const LayerPlacement& p, const std::vector<double>& expert_load) {
  const std::vector<double> r = rank_loads(p, expert_load);
  double sum = 0, mx = 0;
  for (double x : r) {
    sum += x;
    mx = std::max(mx, x);
  }
  return sum > 0 ? mx / (sum / static_cast<double>(r.size())) : 1.0;
}

std::vector<SwapStep> hill_climb(LayerPlacement& p, const std::vector<double>& expert_load, int max_swaps) {
  std::vector<SwapStep> done;
  if (p.ep_size() < 2) return done;
  std::vector<double> load = rank_loads(p, expert_load);
  while (static_cast<int>(done.size()) < max_swaps) {
    // The most and the least loaded ranks (lowest rank on ties).
    int hi = 0, lo = 0;
    for (int r = 1; r < p.ep_size(); ++r) {
      if (load[r] > load[hi]) hi = r;
      if (load[r] < load[lo]) lo = r;
    }
    if (load[hi] <= load[lo]) break;
    // The swap that most lowers max(load[hi], load[lo]); it must lower load[hi].
    double best = load[hi];
    SwapStep pick;
    for (int x : p.experts_of(hi)) {
      for (int y : p.experts_of(lo)) {
        const double d = expert_load[x] - expert_load[y];
        const double worse = std::max(load[hi] - d, load[lo] + d);
        if (worse < best) {
          best = worse;
          pick = {x, y};
        }
      }
    }
    if (pick.a < 0) break;
    const double d = expert_load[pick.a] - expert_load[pick.b];
    load[hi] -= d;
    load[lo] += d;
    p.swap_experts(pick.a, pick.b);
    done.push_back(pick);
  }
  return done;
}

}  // namespace moe::balance
