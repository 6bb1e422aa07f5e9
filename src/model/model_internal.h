// What model.cpp, model_layer.cpp (one decoder layer forward and backward) and model_mtp.cpp (the
// multi-token prediction module) share: what a layer and a micro-batch keep for backward, and the
// layer tensors as the kernels' weight and gradient structs. Internal to model/.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "model/attention_proj.h"
#include "model/mla_block.h"
#include "model/model.h"

namespace moe::model {

namespace mx = moe::mixture;

// What one layer's forward keeps for its backward. Shapes use N = B·T tokens; under tensor
// parallelism n = N/tp rows of this rank's shard, Ha = nh·hd/tp (its heads: H/tp for DeepSeek),
// I = intermediate_size/tp.
struct Model::LayerActs {
  Buffer<float> x;                    // [n,H] layer input (residual stream): always kept
  Buffer<float> ln1;                  // [N,H] rmsnorm(x), gathered over TP (the q/k/v input)
  Buffer<float> rstd1;                // [n]
  Buffer<float> q, k, v;              // [N,Ha] after rope (q, k); k, v repeated to nh heads under GQA; MLA: in `mla`
  QkvKept qkv;                        // QK-norm (qwen3_moe): q, k before their norm, and its rstd
  Buffer<float> att;                  // attention_saved_floats: row LSE [B,nh,T] + a copy of out [N,Ha]
  Buffer<float> attn_out;             // [N,Ha] heads concatenated, before o_proj
  Buffer<float> h;                    // [n,H] x + attention
  Buffer<float> ln2;                  // rmsnorm(h), the FFN input: [n,H] for MoE, gathered [N,H] for dense
  Buffer<float> rstd2;                // [n]
  Buffer<float> mlp_g, mlp_u, mlp_h;  // [N,I] dense SwiGLU
  MlaActs mla;                        // DeepSeek-V2/V3's attention (config.uses_mla())
  mx::MoeActivations moe;             // MoE layer
  std::vector<int32_t> topk_first;    // [N,k] routing of the first forward (checked on recompute)
  bool complete = false;              // everything backward needs is present
};

class Model::MicroBatch {
 private:
  friend class Model;
  int B = 0, T = 0;
  Buffer<int32_t> inputs, targets;                 // [n] on the model's device (this shard's)
  std::vector<std::unique_ptr<LayerActs>> layers;  // this stage's layers, in order
  std::vector<std::vector<int>> loads;             // [moe layers][E]
  size_t moe_dispatch_bytes = 0;                   // see Model::moe_dispatch_bytes
  int dropped = 0;
  Buffer<float> final_in, final_ln, final_rstd, logits, probs, losses;
  // Multi-token prediction (Model::has_mtp()): the module's input rows, its block, its head.
  std::unique_ptr<LayerActs> mtp_layer;                         // the block (layer num_hidden_layers)
  Buffer<float> mtp_e, mtp_en, mtp_rstd_e, mtp_hn, mtp_rstd_h;  // [n,H] embed(t+1), the norms
  Buffer<float> mtp_out;                                        // [n,H] the block's output (norm' reads it)
  Buffer<float> mtp_ln, mtp_rstd, mtp_logits, mtp_probs, mtp_losses;
  Buffer<int32_t> mtp_targets;  // [n] token t+2 (0 where there is none)
  std::vector<int> mtp_masked;  // rows without a token t+2 (t = T-1)
  float mtp_row_scale = 0.0f;   // d(mtp loss)/d(a valid row's ce)
  LossParts loss;
  bool have = false;  // kept for backward
};

// A layer's tensors as the MoE block's gradients, and as the attention projections' weights and
// gradients (moe_weights is in model.h).
mx::MoeGrads moe_grads(const LayerTensors& L);
QkvWeights qkv_weights(const LayerTensors& L);
QkvGrads qkv_grads(const LayerTensors& L);

}  // namespace moe::model
