// The token dispatcher of the MoE layer (Megatron-Core's phases): it moves the rows of the kept
// (token, expert) pairs from the tokens to the experts and back, and carries the adjoints:
//   plan               the metadata of this layer's routing (under expert parallelism: the
//                      counts' all-to-all); fixes num_rows and the experts' segment offsets
//   dispatch           x [T,H] -> x_rows [N,H], rows of one expert contiguous
//   combine            y_rows [N,H] -> y [T,H] = sum over each token's pairs, k ascending, of w·y_row
//   combine_backward   dy [T,H] -> dy_rows [N,H] = w·dy, and dLoss/dw [T,k] = dot(y_row, dy)
//   dispatch_backward  dx_rows [N,H] -> dx [T,H] += the sum of each token's rows (fixed order)
// Two dispatchers share this interface: one for experts all on this rank (padding-free or the
// capacity-padded baseline) and one over the expert-parallel token exchange (flat, rbd or halo).
// Only the exchange dispatcher's plan / dispatch / combine / their adjoints communicate; the MoE
// layer (moe_layer.cpp) is the same straight line for both. Every sum is in a fixed order
// (no atomics), so every layout and device gives the same result.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "moe/moe_layer.h"

namespace moe::mixture {

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  virtual void plan(MoeActivations& act, int T) const = 0;
  virtual size_t num_rows(const MoeActivations& act) const = 0;
  virtual int num_local_experts() const = 0;
  virtual const int32_t* expert_offsets(const MoeActivations& act) const = 0;  // [El+1], host
  virtual void dispatch(float* x_rows, const float* x, const MoeActivations& act) const = 0;
  virtual void combine(float* y, const float* y_rows, const MoeActivations& act) const = 0;
  // Writes all of dweight_TK (dropped pairs: 0) and every row of dy_rows that a pair owns; padding
  // rows (the padded layout's) are left as they are.
  virtual void combine_backward(float* dy_rows, float* dweight_TK, const float* dy,
                                const MoeActivations& act) const = 0;
  virtual void dispatch_backward(float* dx, const float* dx_rows,
                                 const MoeActivations& act) const = 0;
};

// The dispatcher of cfg: over cfg.ep's exchange when it has one, else local (padded or not).
// Temporary buffers are charged to cfg.scratch_tracker.
std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeConfig& cfg);

}  // namespace moe::mixture
