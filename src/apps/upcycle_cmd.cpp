#include "apps/upcycle_cmd.h"

#include <cmath>
#include <cstdio>

#include "apps/cli_checks.h"
#include "core/error.h"
#include "model/config.h"
#include "train/run_guard.h"

namespace moe::apps {

void add_upcycle_command(CLI::App& app, train::UpcycleOptions& o) {
  CLI::App* u = add_command(
      app, "upcycle", "dense model folder -> MoE model folder (sparse upcycling) for train --init-from");
  u->add_option("dense", o.dense_dir, "a dense model's Hugging Face folder (e.g. from `moetrain export`)")->required();
  u->add_option("-o,--out", o.out_dir, "the MoE model folder to write")->required();
  u->add_option("--experts", o.experts, "E: copies of each dense MLP")->required();
  u->add_option("--topk", o.topk, "K: copies each token uses")->required();
  u->add_option("--shared", o.shared, "N shared experts (slice j mod S of the dense MLP)")->capture_default_str();
  u->add_option("--split", o.split,
                "S: cut each copy into S experts of intermediate_size / S columns (E*S experts, top-k K*S)")
      ->capture_default_str();
  u->add_option("--noise", o.noise, "Gaussian noise on each copy, times the dense matrix's RMS")->capture_default_str();
  u->add_option("--router-init", o.router_init, "zero, or a standard deviation for N(0, STD)")->capture_default_str();
  u->add_option("--first-dense", o.first_dense,
                "layers [0, N) stay dense (default: the dense config's first_k_dense_replace)");
  u->add_option("--aux-loss-alpha", o.aux_loss_alpha, "the MoE config's balance loss weight")->capture_default_str();
  u->add_option("--seed", o.seed, "seed of the noise and the router")->capture_default_str()->check(CLI::NonNegativeNumber);
}

int run_upcycle_command(CLI::App& app, train::UpcycleOptions& o) {
  if (!app.got_subcommand("upcycle")) return -1;
  // Started once per rank, every copy would write the same folder at the same time.
  const int ranks = train::launcher_world_size();
  if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
  MOE_CHECK(ranks == 1, "upcycle writes one folder from one process, but this is one of ", ranks,
            " ranks started by a launcher (mpirun/srun): run `moetrain upcycle` without it");
  MOE_CHECK(std::isfinite(o.aux_loss_alpha) && o.aux_loss_alpha >= 0 && o.aux_loss_alpha <= 1,
            "--aux-loss-alpha must be in [0, 1], got ", o.aux_loss_alpha);
  const train::UpcycleResult r = train::upcycle(o);
  const model::ModelConfig& c = r.config;
  const model::ParamCounts pc = model::count_params(c);
  std::printf("upcycled %s -> %s: %d of %d layers MoE (from layer %d), E=%d experts of width %d, k=%d, %d shared; "
              "%.2fM params (%.2fM active)\n",
              o.dense_dir.c_str(), o.out_dir.c_str(), r.moe_layers, c.num_hidden_layers, c.first_k_dense_replace,
              c.n_routed_experts, c.moe_intermediate_size, c.num_experts_per_tok, c.n_shared_experts, pc.total / 1e6,
              pc.active / 1e6);
  if (c.num_experts_per_tok == 1)
    std::fprintf(stderr,
                 "moetrain: note: with one expert per token its weight is its softmax probability (Hugging Face "
                 "DeepSeek renormalises the top-k weights only for k > 1), so the upcycled model does not start at the "
                 "dense model's loss; --topk 2, or --split 2, keeps it\n");
  return 0;
}

}  // namespace moe::apps
