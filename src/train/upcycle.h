// `moetrain upcycle DENSE -o OUT`: sparse upcycling (Komatsuzaki et al. 2022) of a dense
// DeepSeek-config model folder into an MoE model folder that `train --init-from` loads.
//
// Rule. The dense MLP (gate/up [I, H], down [H, I]) of every layer >= first_dense becomes
//   E·S routed experts of width F = I / S: expert c·S + s (copy c < E, slice s < S) takes rows
//   [s·F, (s+1)·F) of gate and up and S × columns [s·F, (s+1)·F) of down;
//   top-k K·S, norm_topk_prob true, softmax scores, greedy top-k;
//   router zero (every score ties; ties go to the lower id, so each token picks copies 0..K-1
//   whole) or N(0, STD); N shared experts, shared expert j a copy of slice j mod S (unscaled).
// Which layers: every layer from first_dense on (default the dense config's first_k_dense_replace,
// 0 for a dense model: all of them).
// Why S × down: with renormalised weights each of the K·S chosen experts weighs 1/(K·S), and a
// whole copy's S slices sum to the dense MLP / S before the factor. So with no noise and no shared
// experts the MoE layer computes the dense MLP exactly (to round-off): for S = 1 whatever the
// router, for S > 1 with the zero router (the slices of one copy are chosen together). Not for
// K·S = 1: Hugging Face DeepSeek renormalises only k > 1, so one expert weighs its probability. This is the
// fine-grained ("granularity G = S") upcycling of He et al. 2024 (arXiv 2410.07524), where E·S
// experts of width I/S keep the active FLOPs of K copies and the top-k grows by S.
// --noise STD adds Gaussian noise of STD × the RMS of the dense matrix to each expert's copy (the
// copies then differ, so training can tell them apart). Attention, norms, embedding and head are
// copied; layers < first_dense stay dense. The output folder is written whole or not at all
// (train/staged_folder.h), never over the input.
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace moe::train {

struct UpcycleOptions {
  std::string dense_dir, out_dir;
  int experts = 0;                   // E: copies of the dense MLP
  int topk = 0;                      // K: copies per token
  int shared = 0;                    // N: shared experts
  int split = 1;                     // S: each copy cut into S slices of the intermediate columns
  double noise = 0.0;                // relative to each dense matrix's RMS
  std::string router_init = "zero";  // "zero" or a standard deviation ("0.02")
  int first_dense = -1;              // layers [0, this) stay dense; -1: the dense config's first_k_dense_replace
  float aux_loss_alpha = 0.01f;      // the MoE config's balance loss (tiny's)
  uint64_t seed = 0;
};

// The MoE config the rule above makes of `dense`; errors name the flag and the value.
model::ModelConfig upcycled_config(const model::ModelConfig& dense, const UpcycleOptions& o);

struct UpcycleResult {
  model::ModelConfig config;
  int moe_layers = 0;
};
UpcycleResult upcycle(const UpcycleOptions& o);

}  // namespace moe::train
