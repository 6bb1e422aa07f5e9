#include "parallel/parallel_dims.h"

#include "core/error.h"

namespace moe::parallel {

void ParallelDims::validate(int world_size, const model::ModelConfig& cfg) const {
  MOE_CHECK(pp >= 1 && dp >= 1 && ep >= 1 && tp >= 1, "parallel degrees must be >= 1, got pp(", pp,
            ") dp(", dp, ") ep(", ep, ") tp(", tp, ")");
  MOE_CHECK(world() == world_size, "pp(", pp, ") * dp(", dp, ") * ep(", ep, ") * tp(", tp, ") = ",
            world(), " != world size ", world_size);
  MOE_CHECK(pp <= cfg.num_hidden_layers, "pp(", pp, ") exceeds the model's ", cfg.num_hidden_layers,
            " layers: every pipeline stage needs at least one layer");
  if (tp > 1) {
    // Heads and the dense FFN's columns split over TP (model.h: TensorParallel).
    MOE_CHECK(cfg.num_attention_heads % tp == 0, "tp(", tp, ") does not divide num_attention_heads (",
              cfg.num_attention_heads, ")");
    // Grouped-query attention: each rank keeps whole groups (its kv heads and their query heads).
    MOE_CHECK(cfg.kv_heads() % tp == 0, "tp(", tp, ") does not divide num_key_value_heads (",
              cfg.kv_heads(), ")");
    MOE_CHECK(cfg.num_moe_layers() == cfg.num_hidden_layers || cfg.intermediate_size % tp == 0, "tp(", tp,
              ") does not divide intermediate_size (", cfg.intermediate_size, ") of the dense layers");
  }
  if (ep > 1) {
    MOE_CHECK(cfg.num_moe_layers() > 0, "--ep ", ep, " needs a model with MoE layers; this config has none");
    MOE_CHECK(cfg.n_routed_experts % ep == 0, "ep(", ep, ") does not divide n_routed_experts (",
              cfg.n_routed_experts, ")");
  }
}

std::string ParallelDims::describe() const {
  return str_cat("pp ", pp, " x dp ", dp, " x ep ", ep, " x tp ", tp);
}

std::vector<int> split_layers(const model::ModelConfig& cfg, int pp,
                              const std::vector<int>& explicit_layers) {
  const int L = cfg.num_hidden_layers;
  MOE_CHECK(pp >= 1 && pp <= L, "pp(", pp, ") must be between 1 and the model's ", L, " layers");
  if (explicit_layers.empty()) {
    std::vector<int> out(pp, L / pp);
    for (int s = 0; s < L % pp; ++s) out[s] += 1;
    return out;
  }
  MOE_CHECK(static_cast<int>(explicit_layers.size()) == pp, "--pp.layers lists ",
            explicit_layers.size(), " stages but pp is ", pp);
  int sum = 0;
  for (size_t s = 0; s < explicit_layers.size(); ++s) {
    MOE_CHECK(explicit_layers[s] >= 1, "--pp.layers: stage ", s, " has ", explicit_layers[s],
              " layers; every stage needs at least one");
    sum += explicit_layers[s];
  }
  MOE_CHECK(sum == L, "--pp.layers adds up to ", sum, " layers but the model has ", L);
  return explicit_layers;
}

model::StageSpec stage_spec(const std::vector<int>& layers_per_stage, int s) {
  model::StageSpec st;
  for (int i = 0; i < s; ++i) st.first_layer += layers_per_stage[i];
  st.num_layers = layers_per_stage[s];
  st.embedding = s == 0;
  st.head = s + 1 == static_cast<int>(layers_per_stage.size());
  return st;
}

RankCoords coords_of(const ParallelDims& d, int r) {
  RankCoords c;
  c.tp = r % d.tp;
  r /= d.tp;
  c.ep = r % d.ep;
  r /= d.ep;
  c.dp = r % d.dp;
  c.pp = r / d.dp;
  return c;
}

int rank_of(const ParallelDims& d, const RankCoords& c) {
  return ((c.pp * d.dp + c.dp) * d.ep + c.ep) * d.tp + c.tp;
}

}  // namespace moe::parallel
