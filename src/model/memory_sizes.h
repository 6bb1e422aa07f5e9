// Bytes the trainer allocates, as functions of the shapes: the same arithmetic the model's
// allocations follow (tests check these against the measured high-water marks to the byte), so the
// planner's memory model and the program cannot drift apart.
#pragma once
#include <cstddef>

#include "core/modes.h"
#include "model/config.h"

namespace moe::model {

// Activations one layer keeps between its forward and its backward for one micro-batch of
// B sequences of T tokens (fp32/int32 elements: multiply by 4 for bytes).
//   keep_all:  everything; moe_recompute: an MoE layer keeps its attention part and the FFN input
//   only; full_recompute: the layer input only.
// `rows_per_expert_pair` = T·B·k received rows for dropless routing on one rank (with expert
// parallelism, the rows a rank receives: pass the expected count).
struct LayerActivationSizes {
  size_t attention = 0;        // x, ln1, h, ln2 (4·N·H), q, k, v, attn_out (4·N·A, A = nh·hd: H for
                               // DeepSeek) + 2 rstd (2·N) + state (+ QK-norm's q, k and rstd)
  size_t attention_state = 0;  // of which the flash attention kernel's saved state
                               // (kernels::attention_saved_floats): row lse B·nh·T + out N·A
  size_t dense_ffn = 0;        // g, u, h: 3·N·I
  size_t moe_ffn = 0;          // router (N·E scores, 2·N·k top-k, E aux), layout (2E+1 + R + N·k),
                               // rows in/out (2·R·H), expert g/u/h (3·R·F), shared g/u/h (3·N·Fs)
  size_t input = 0;            // N·H (what full recompute keeps)
};
LayerActivationSizes layer_activation_elems(const ModelConfig& c, int B, int T, size_t moe_rows);

// Elements a layer keeps under a recompute mode.
size_t layer_kept_elems(const ModelConfig& c, int layer, int B, int T, size_t moe_rows, Recompute recompute);

// The head stage keeps final input + norm (2·N·H), rstd and per-token losses (2·N), logits and
// probabilities (2·N·V); and DeepSeek-V3's multi-token-prediction module when the config has one.
size_t head_kept_elems(const ModelConfig& c, int B, int T);

}  // namespace moe::model
