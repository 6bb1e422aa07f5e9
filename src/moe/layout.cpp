// Padding-free and capacity-padded dispatch layouts. See layout.h.
// Legend: T tokens, k slots, E experts, p = t·k + j flat pair, R kept rows, C capacity.
#include "moe/layout.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/device_select.h"
#include "kernels/permute.h"

namespace moe::mixture {
namespace {

void check_args(const char* who, const int32_t* topk_idx_TK, int T, int k, int E) {
  MOE_CHECK(T >= 0 && k >= 1 && E >= 1, who, ": bad sizes T=", T, " k=", k, " E=", E);
  MOE_CHECK(T == 0 || topk_idx_TK != nullptr, who, ": topk_idx is null");
}

// Pairs per expert over all T·k pairs (kernels/permute.h); rejects expert ids outside [0, E).
std::vector<int32_t> count_pairs(const char* who, const int32_t* topk_idx_TK, size_t P, int E) {
  std::vector<int32_t> count(E, 0);
  try {
    kernels::count_pairs_per_expert(count.data(), topk_idx_TK, P, E);
  } catch (const Error& e) {
    throw Error(str_cat(who, ": ", e.what()));
  }
  return count;
}

// What both builders start with: the arguments checked, l's sizes set, and the pairs per expert
// (which validates the expert ids).
template <class Layout>
std::vector<int32_t> start_layout(Layout& l, const char* who, const int32_t* topk_idx_TK, int T, int k, int E) {
  check_args(who, topk_idx_TK, T, k, E);
  l.T = T;
  l.k = k;
  l.E = E;
  return count_pairs(who, topk_idx_TK, static_cast<size_t>(T) * k, E);
}

}  // namespace

int expert_capacity(int T, int k, int E, float capacity_factor, int min_capacity) {
  MOE_CHECK(capacity_factor > 0.0f, "expert_capacity: capacity_factor must be > 0, got ",
            capacity_factor);
  MOE_CHECK(T >= 0 && k >= 1 && E >= 1, "expert_capacity: bad sizes T=", T, " k=", k, " E=", E);
  double c = std::ceil(static_cast<double>(T) * k * static_cast<double>(capacity_factor) / E);
  if (c < min_capacity) c = min_capacity;
  if (c > T) c = T;
  return static_cast<int>(c);
}

DispatchLayout build_dispatch_layout(const int32_t* topk_idx_TK, int T, int k, int E,
                                     float capacity_factor, int min_capacity,
                                     MemTracker* tracker) {
  DispatchLayout l;
  const std::vector<int32_t> count = start_layout(l, "build_dispatch_layout", topk_idx_TK, T, k, E);
  const size_t P = static_cast<size_t>(T) * k;
  l.capacity = capacity_factor > 0.0f ? expert_capacity(T, k, E, capacity_factor, min_capacity) : 0;

  l.num_tokens_per_expert_E.resize(E, tracker);
  l.offsets_E1.resize(static_cast<size_t>(E) + 1, tracker);
  int32_t* kept = l.num_tokens_per_expert_E.data();
  int32_t* off = l.offsets_E1.data();
  off[0] = 0;
  for (int e = 0; e < E; ++e) {
    kept[e] = l.capacity > 0 && count[e] > l.capacity ? l.capacity : count[e];
    off[e + 1] = off[e] + kept[e];
  }
  l.num_rows = off[E];
  l.num_dropped = static_cast<int>(P) - l.num_rows;

  // Place pairs in p order: rows of one expert keep token order (stable), and the first C of each
  // expert are the kept ones.
  // The counts and offsets stay on the host (they size the grouped GEMM); the row maps live on
  // the active device with the routing they index.
  const Device dev = kernels::active_device();
  l.slot_of_row_R.resize(static_cast<size_t>(l.num_rows), tracker, dev);
  l.row_of_slot_TK.resize(P, tracker, dev);
  kernels::place_pairs(l.slot_of_row_R.data(), l.row_of_slot_TK.data(), topk_idx_TK, off, P, E);
  return l;
}

PaddedLayout build_padded_layout(const int32_t* topk_idx_TK, int T, int k, int E,
                                 float capacity_factor, int min_capacity, MemTracker* tracker) {
  PaddedLayout l;
  // The counts themselves are not needed: positions fill in p order.
  start_layout(l, "build_padded_layout", topk_idx_TK, T, k, E);
  const size_t P = static_cast<size_t>(T) * k;
  l.C = expert_capacity(T, k, E, capacity_factor > 0.0f ? capacity_factor : 1.0f, min_capacity);

  l.slot_of_pos_EC.resize(l.num_rows(), tracker);
  l.pos_of_slot_TK.resize(P, tracker);
  l.offsets_E1.resize(static_cast<size_t>(E) + 1, tracker);
  int32_t* slot_of_pos = l.slot_of_pos_EC.data();
  int32_t* pos_of_slot = l.pos_of_slot_TK.data();
  for (size_t i = 0; i < l.num_rows(); ++i) slot_of_pos[i] = -1;
  for (int e = 0; e <= E; ++e) l.offsets_E1[e] = e * l.C;
  std::vector<int32_t> fill(E, 0);
  for (size_t p = 0; p < P; ++p) {
    int32_t e = topk_idx_TK[p];
    if (fill[e] < l.C) {
      int32_t pos = e * l.C + fill[e]++;
      slot_of_pos[pos] = static_cast<int32_t>(p);
      pos_of_slot[p] = pos;
      ++l.num_kept;
    } else {
      pos_of_slot[p] = -1;
    }
  }
  l.num_dropped = static_cast<int>(P) - l.num_kept;
  return l;
}

}  // namespace moe::mixture
