// Where each (token, slot) pair of the router's top-k goes: X-MoE's padding-free token buffer
// (DispatchLayout: rows sorted by expert, uneven contiguous segments, no padding rows) and the
// capacity-padded baseline (PaddedLayout: [E, C] positions, padding rows included). Both are pure
// functions of (topk_idx, T, k, E, capacity) with no hidden state, and never communicate.
// Legend: T tokens, k slots per token, E experts, p = t·k + j a flat pair index, R kept rows,
// C capacity per expert.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/buffer.h"

namespace moe::mixture {

constexpr int kDefaultMinCapacity = 4;  // GShard / DeepSpeed / X-MoE min_capacity

// Rows per expert under a capacity factor: C = max(ceil(T·k·cf/E), min_capacity), capped at T
// (a token picks an expert at most once, so an expert never receives more than T pairs: rows beyond
// T could only ever be padding). cf must be > 0. The planner sizes [E, C, H] buffers with this.
int expert_capacity(int T, int k, int E, float capacity_factor, int min_capacity = kDefaultMinCapacity);

// Keep rule shared by both layouts when a capacity applies: each expert keeps its first C pairs in
// token order (p ascending; GShard/Tutel's rule), later pairs are dropped. X-MoE's code drops the
// lowest-weight pairs instead; token order keeps the layout a function of topk_idx alone.

struct DispatchLayout {
  int T = 0, k = 0, E = 0;
  int capacity = 0;                         // C per expert; 0 = dropless
  int num_rows = 0;                         // R = kept pairs = offsets_E1[E]
  int num_dropped = 0;                      // T·k - R
  Buffer<int32_t> num_tokens_per_expert_E;  // [E] kept rows of each expert
  Buffer<int32_t> offsets_E1;               // [E+1] exclusive prefix sums; offsets_E1[E] = R
  Buffer<int32_t> slot_of_row_R;            // [R] flat pair p carried by row r (token = p / k)
  Buffer<int32_t> row_of_slot_TK;           // [T·k] inverse of slot_of_row_R; -1 = dropped
};

// Counting sort of the T·k pairs by expert, stable (rows of one expert in p order): deterministic.
// capacity_factor <= 0: dropless (default). Buffers are charged to tracker.
DispatchLayout build_dispatch_layout(const int32_t* topk_idx_TK, int T, int k, int E,
                                     float capacity_factor = 0.0f,
                                     int min_capacity = kDefaultMinCapacity,
                                     MemTracker* tracker = nullptr);

struct PaddedLayout {
  int T = 0, k = 0, E = 0;
  int C = 0;                       // rows per expert, padding included
  int num_kept = 0;                // real rows among the E·C
  int num_dropped = 0;             // T·k - num_kept
  Buffer<int32_t> slot_of_pos_EC;  // [E·C] flat pair at position e·C + c; -1 = padding row
  Buffer<int32_t> pos_of_slot_TK;  // [T·k] e·C + c of pair p; -1 = dropped
  Buffer<int32_t> offsets_E1;      // [E+1] e·C: the grouped expert code runs over it unchanged
  size_t num_rows() const { return static_cast<size_t>(E) * C; }
  size_t padding_rows() const { return num_rows() - static_cast<size_t>(num_kept); }
};

// The capacity-padded layout, same keep rule. capacity_factor <= 0 means 1.0 (the padded path
// always has a capacity). Buffers are charged to tracker.
PaddedLayout build_padded_layout(const int32_t* topk_idx_TK, int T, int k, int E,
                                 float capacity_factor = 1.0f,
                                 int min_capacity = kDefaultMinCapacity,
                                 MemTracker* tracker = nullptr);

}  // namespace moe::mixture
