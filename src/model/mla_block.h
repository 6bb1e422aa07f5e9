// The attention block of DeepSeek-V2/V3: multi-head latent attention (MLA), as in Hugging Face's
// modeling_deepseek, with explicit forward and backward on the model's kernels (either device).
//   query:  q = q_b(rmsnorm(q_a(x)))                   or q = q_proj(x) when q_lora_rank is 0
//   latent: [c | k_pe] = kv_a_proj_with_mqa(x)        c [rkv] per token, k_pe [dr] per token
//           kv = kv_b(rmsnorm(c))                      per head: k_nope [dn] | v [dv]
//   heads:  Q = [q_nope | rope(q_pe)], K = [k_nope | rope(k_pe)], V = v   (kernels/mla.h)
//   out:    softmax(Q·K^T · softmax_scale) V           [N, nh·dv], then the model's o_proj
// x is the normed layer input gathered over tensor parallelism ([N, H]); this rank runs its own
// heads (q_b / q_proj and kv_b split by rows) and the latents whole (replicated weights, so each
// rank's gradient of them is its heads' share, summed over the TP group like the norms').
// The latent norms use eps 1e-6, as the reference's DeepseekV2/V3RMSNorm default (not
// rms_norm_eps).
#pragma once
#include <vector>

#include "core/buffer.h"
#include "kernels/mla.h"
#include "kernels/rope.h"
#include "model/config.h"
#include "model/params.h"

namespace moe::model {

// What forward keeps for backward (N = B·T rows).
struct MlaActs {
  Buffer<float> qa, qa_normed, rstd_q;     // [N, rq], [N, rq], [N] (query latent; empty without)
  Buffer<float> ckv, ckv_normed, rstd_kv;  // [N, rkv], [N, rkv], [N]
  Buffer<float> Q, K, V;                   // [N, nh·D] the heads the attention kernel read
  Buffer<float> att;                       // attention_saved_floats(B, T, nh, D)
  std::vector<Buffer<float>*> buffers() {
    return {&qa, &qa_normed, &rstd_q, &ckv, &ckv_normed, &rstd_kv, &Q, &K, &V, &att};
  }
};

// The rotary table of the rope columns (qk_rope_head_dim), YaRN-scaled when rope_scaling asks.
kernels::RopeTable mla_rope_table(const ModelConfig& c);
// The heads' shape for nh of this rank's heads, and the query scale that makes the attention
// kernel's 1/sqrt(D) the config's softmax_scale().
kernels::MlaShape mla_shape(const ModelConfig& c, int nh, int B, int T);
float mla_q_scale(const ModelConfig& c, const kernels::MlaShape& s);

// attn_out [N, nh·dv] from x [N, H]. Kept activations go to `mem`, temporaries to `work`.
void mla_forward(MlaActs& a, float* attn_out, const float* x, const LayerTensors& W,
                 const ModelConfig& c, int nh, int B, int T, const kernels::RopeTable& rope,
                 MemTracker* mem, MemTracker* work, Device dev);
// dx [N, H] += the input's gradient; G's MLA tensors += theirs. dattn_out [N, nh·dv].
void mla_backward(float* dx, const LayerTensors& G, const float* dattn_out, const MlaActs& a,
                  const float* x, const LayerTensors& W, const ModelConfig& c, int nh, int B, int T,
                  const kernels::RopeTable& rope, MemTracker* work, Device dev);

}  // namespace moe::model
