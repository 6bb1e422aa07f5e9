// Dispatch (token rows -> expert rows) and combine (expert rows -> weighted token sum), for the
// padding-free layout and the capacity-padded baseline. These are the steps that gain an exchange
// under expert parallelism (gather -> exchange -> experts -> exchange -> combine); on one rank
// they are local copies. Backward of gather is a scatter-add, backward of combine is a gather plus a
// dot product per pair; both sum in a fixed order (token ascending, slot j = 0..k-1), so results
// are bit-for-bit deterministic. Every *_backward ADDS (+=) into its outputs.
// Legend: T tokens, H hidden, k slots, R kept rows, E·C padded rows; row(t,j) = row_of_slot[t·k+j].
#pragma once

#include "moe/layout.h"

namespace moe::mixture {

// ---- padding-free (X-MoE PFT) ----

// rows_RH[r] = x_TH[slot_of_row[r] / k]
void gather_rows_forward(float* rows_RH, const float* x_TH, const DispatchLayout& l, int H);
// dx_TH[t] += sum over kept j of drows_RH[row(t,j)]
void gather_rows_backward(float* dx_TH, const float* drows_RH, const DispatchLayout& l, int H);

// out_TH[t] += sum over kept j (j = 0..k-1) of weight_TK[t,j] · y_RH[row(t,j)]
// (accumulate = false: out_TH[t] = that sum; a token with every pair dropped gets 0).
void combine_forward(float* out_TH, const float* y_RH, const float* weight_TK,
                     const DispatchLayout& l, int H, bool accumulate = true);
// dy_RH[row(t,j)] = weight[t,j] · dout[t] ; dweight_TK[t,j] = dot(y_RH[row(t,j)], dout[t]).
// Writes every row and every dweight (a dropped pair gets 0). Either output may be nullptr.
void combine_backward(float* dy_RH, float* dweight_TK, const float* dout_TH, const float* y_RH,
                      const float* weight_TK, const DispatchLayout& l, int H);

// ---- capacity-padded baseline ([E, C, H] buffers) ----
// As Tutel does it: an index-based copy of each kept row to its position e·C + c; every padding row
// is written with zeros (and then goes through the experts: the cost being measured).

// buf_ECH[pos] = x_TH[slot_of_pos[pos] / k], or 0 for a padding row. Writes all E·C rows.
void padded_dispatch_forward(float* buf_ECH, const float* x_TH, const PaddedLayout& l, int H);
// dx_TH[t] += sum over kept j of dbuf_ECH[pos(t,j)] (padding rows are never read)
void padded_gather_backward(float* dx_TH, const float* dbuf_ECH, const PaddedLayout& l, int H);
// out_TH[t] += sum over kept j of weight[t,j] · y_ECH[pos(t,j)]  (accumulate = false: =)
void padded_combine_forward(float* out_TH, const float* y_ECH, const float* weight_TK,
                            const PaddedLayout& l, int H, bool accumulate = true);
// dy_ECH[pos(t,j)] = weight[t,j] · dout[t] (padding rows untouched: the caller zeroes them);
// dweight_TK[t,j] = dot(y_ECH[pos(t,j)], dout[t]) (a dropped pair gets 0).
void padded_combine_backward(float* dy_ECH, float* dweight_TK, const float* dout_TH,
                             const float* y_ECH, const float* weight_TK, const PaddedLayout& l,
                             int H);

}  // namespace moe::mixture
