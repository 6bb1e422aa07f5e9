#include "parallel/parallel_dims.h"

#include "core/error.h"

namespace moe::parallel {

void ParallelDims::validate(int world_size, const model::ModelConfig& cfg) const {
  MOE_CHECK(pp >= 1 && dp >= 1 && ep >= 1 && tp >= 1, "parallel degrees must be >= 1, got pp(", pp,
            ") dp(", dp, ") ep(", ep, ") tp(", tp, ")");
  MOE_CHECK(world() == world_size, "pp(", pp, ") * dp(", dp, ") * ep(", ep, ") * tp(", tp, ") = ",
            world(), " != world size ", world_size);
  MOE_CHECK(pp == 1, "pipeline parallelism (--pp ", pp, ") is not implemented yet; use --pp 1");
  MOE_CHECK(tp == 1, "tensor parallelism (--tp ", tp, ") is not implemented yet; use --tp 1");
  if (ep > 1) {
    MOE_CHECK(cfg.num_moe_layers() > 0, "--ep ", ep, " needs a model with MoE layers; this config has none");
    MOE_CHECK(cfg.n_routed_experts % ep == 0, "ep(", ep, ") does not divide n_routed_experts (",
              cfg.n_routed_experts, ")");
  }
}

std::string ParallelDims::describe() const {
  return str_cat("pp ", pp, " x dp ", dp, " x ep ", ep, " x tp ", tp);
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
