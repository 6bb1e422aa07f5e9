// Incremental decoding of one sequence with a KV cache: the forward pass of model.h for inference,
// written with the same kernels (so it runs wherever the model's kernels run: CPU or CUDA).
//   prefill:  the prompt's P tokens in one pass at positions [0, P) (the full forward's kernels,
//             causal attention over the prompt); K and V of every layer go into the cache
//   step:     one token at position p: q, k, v of that token (RoPE at p), k and v appended to the
//             cache, attention of q over the cache rows [0, p], the FFN (dense, or the MoE layer on
//             one token: routing is per token, so it equals the full forward's routing)
// The logits returned are those of the last token fed, copied to the host (the one host sync
// per token: sampling runs on the host).
// Multi-head latent attention (DeepSeek-V2/V3) caches the compressed latent instead of K and V:
// per token and layer kv_lora_rank normed latent values and qk_rope_head_dim rotated key values;
// a step attends with the per-head key and value projections absorbed into the query and the
// output (q_nope·W_UK against the latents, then the weighted latent through W_UV), as DeepSeek-V2's
// paper describes for inference. The prompt runs the training forward (mla_block.h).
// Legend: H hidden, V vocab, L layers, nh heads, hd head dim, S = max_len cache rows.
#pragma once
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "kernels/rope.h"
#include "model/attention_proj.h"
#include "model/model.h"

namespace moe::model {

class Decoder {
 public:
  // model: a whole model (every layer, embedding and head) on the active device; it must outlive
  // the decoder and its weights must not change while decoding. max_len: cache rows (positions),
  // at most max_position_embeddings.
  Decoder(const Model& model, int max_len);

  // Feeds n tokens at positions [position(), position() + n) and returns the logits [V] of the
  // last one. n > 1 only as the first call (the prompt); later calls feed one token each.
  // Throws naming max_position_embeddings / max_len when the cache would overflow.
  const std::vector<float>& feed(const int32_t* tokens, int n);
  int position() const { return pos_; }
  int max_len() const { return max_len_; }
  void reset() { pos_ = 0; }
  // Bytes held: the KV cache and the step's workspace (on the model's device).
  const MemTracker& memory() const { return mem_; }
  // Bytes of the cache alone: L·S·2·H floats, or L·S·(kv_lora_rank + qk_rope_head_dim) with MLA.
  size_t cache_bytes() const;

 private:
  void layer(int l, int n);          // x_ [n,H] -> x_ (layer l, new tokens at positions [pos_, pos_+n))
  void attention(int l, int n);      // q_ and the cache -> attn_ [n,H]
  void mla_attention(int l, int n);  // ln_ -> attn_ [n, nh·v_head_dim], the latent cache filled

  const Model& model_;
  const ModelConfig& c_;
  int max_len_ = 0;
  int pos_ = 0;
  Device dev_;
  kernels::RopeTable rope_;       // [max_position_embeddings, hd/2], as the model's
  kernels::RopeTable step_rope_;  // [1, hd/2]: row pos_ of rope_ (one-token steps)
  MemTracker mem_;
  std::vector<Buffer<float>> k_cache_, v_cache_;  // per layer [S, nkv·hd] (nkv = nh without GQA), after RoPE
  // MLA: per layer [S, kv_lora_rank] normed latents and [S, qk_rope_head_dim] rotated keys.
  std::vector<Buffer<float>> latent_cache_, rope_key_cache_;
  Buffer<float> mla_q_, mla_kv_, mla_heads_, mla_tmp_, mla_ctx_;  // MLA step workspace
  // Workspace for n tokens (resized when a call feeds more tokens than before).
  Buffer<int32_t> tokens_;                 // [n]
  Buffer<float> x_, ln_, rstd_, h_, out_;  // [n,H] ([n] for rstd_)
  Buffer<float> q_, attn_;                 // [n, nh·hd]
  Buffer<float> k_rep_, v_rep_;            // prefill under GQA: the cache rows repeated [n, nh·hd]
  QkvScratch qkv_scratch_{&mem_};          // row map and ones (GQA, q/k/v biases)
  Buffer<float> att_;                      // prefill: attention_saved_floats(1, n, nh, hd)
  Buffer<float> scores_;                   // step: [nh, S] attention probabilities
  Buffer<int32_t> top1_idx_;               // step: [nh] (the row softmax's unused top-1)
  Buffer<float> top1_w_;                   // step: [nh]
  Buffer<float> mlp_g_, mlp_u_, mlp_h_;    // dense layers [n, I]
  mixture::MoeActivations moe_;            // MoE layers (reused layer to layer)
  Buffer<float> logits_dev_;               // [V]
  std::vector<float> logits_;              // [V] host
};

}  // namespace moe::model
