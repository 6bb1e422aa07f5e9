#include "model/memory_sizes.h"

#include <algorithm>

#include "core/error.h"

namespace moe::model {

LayerActivationSizes layer_activation_elems(const ModelConfig& c, int B, int T, size_t R) {
  const size_t N = static_cast<size_t>(B) * T, H = c.hidden_size, nh = c.num_attention_heads;
  const size_t E = c.n_routed_experts, k = c.num_experts_per_tok, F = c.moe_intermediate_size;
  const size_t Fs = c.shared_ffn(), I = c.intermediate_size;
  // q, k, v and the attention output span the query heads: A = nh·hd (H for DeepSeek).
  const size_t A = nh * c.head_dim(), nkv = c.kv_heads(), hd = c.head_dim();
  LayerActivationSizes s;
  if (c.uses_mla()) {
    // Multi-head latent attention (model/mla_block.h): x, ln1, h, ln2 (4·N·H), attn_out
    // N·nh·dv, 2 rstd; the latents before and after their norms with their rstd (query: only with
    // q_lora_rank); Q, K, V of the head width D = max(dn + dr, dv); the kernel's state of width D.
    const size_t dv = c.v_head_dim, rq = c.q_lora_rank, rkv = c.kv_lora_rank;
    const size_t D = std::max<size_t>(c.qk_head_dim(), dv);
    s.attention_state = static_cast<size_t>(B) * nh * T + N * nh * D;
    s.attention = 4 * N * H + N * nh * dv + 2 * N + (rq > 0 ? 2 * N * rq + N : 0) + 2 * N * rkv + N +
                  3 * N * nh * D + s.attention_state;
  } else {
    s.attention_state = static_cast<size_t>(B) * nh * T + N * A;
    s.attention = 4 * N * H + 4 * N * A + 2 * N + s.attention_state;
    // QK-norm (qwen3_moe) keeps q, k before the norm and the norm's rstd per head.
    if (c.qk_norm()) s.attention += N * (A + nkv * hd) + N * (nh + nkv);
  }
  s.dense_ffn = 3 * N * I;
  const size_t aux = c.router_aux_alpha() > 0 ? (c.seq_aux ? static_cast<size_t>(B) * E : E) : 0;
  s.moe_ffn = N * E + 2 * N * k + aux + (2 * E + 1) + R + N * k + 2 * R * H + 3 * R * F + 3 * N * Fs;
  // Gated shared expert (qwen2_moe): its output [N,H], gate value, index, weight, row map [N].
  if (c.gated_shared_expert() && Fs > 0) s.moe_ffn += N * H + 4 * N;
  s.input = N * H;
  return s;
}

size_t layer_kept_elems(const ModelConfig& c, int layer, int B, int T, size_t moe_rows, Recompute recompute) {
  const LayerActivationSizes s = layer_activation_elems(c, B, T, moe_rows);
  const bool moe = c.is_moe_layer(layer);
  if (recompute == Recompute::kFull) return s.input;
  if (recompute == Recompute::kMoe && moe) return s.attention;
  return s.attention + (moe ? s.moe_ffn : s.dense_ffn);
}

size_t head_kept_elems(const ModelConfig& c, int B, int T) {
  const size_t N = static_cast<size_t>(B) * T, H = c.hidden_size, V = c.vocab_size;
  size_t e = 2 * N * H + 2 * N + 2 * N * V;
  if (c.num_nextn_predict_layers > 0) {
    // The MTP module (model.h, Model::mtp_forward): embed(t+1) and the two normed inputs (3·N·H)
    // with their rstd (2·N), its block (every activation: layer num_hidden_layers, dropless rows)
    // whose input is N·H of those, its output and final norm (2·N·H) with rstd (N), its logits and
    // probabilities (2·N·V) and losses (N).
    const int L = c.num_hidden_layers;
    const size_t rows = c.is_moe_layer(L) ? N * c.num_experts_per_tok : 0;
    e += 3 * N * H + 2 * N + layer_kept_elems(c, L, B, T, rows, Recompute::kNone) + 2 * N * H + N + 2 * N * V + N;
  }
  return e;
}

}  // namespace moe::model
