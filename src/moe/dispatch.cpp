// Dispatch and combine for both layouts. See dispatch.h.
// Both layouts reduce to the same two index maps: the row of each pair (row_of_slot_TK, -1 =
// dropped) and the pair of each row (slot_of_row, -1 = padding row). The kernels below take those
// maps, so the padded baseline runs exactly the same loops as the padding-free path.
// Legend: T tokens, H hidden, k slots, p = t·k + j, N rows of the expert buffer.
#include "moe/dispatch.h"

#include <cstddef>

#include "core/error.h"
#include "kernels/permute.h"

namespace moe::mixture {
namespace {

// Index maps of one layout, as the kernels see them.
struct RowMap {
  int T, k;
  size_t N;                    // rows of the expert buffer (R, or E·C)
  const int32_t* row_of_slot;  // [T·k] row of each pair, -1 = dropped
  const int32_t* slot_of_row;  // [N] pair of each row, -1 = padding
};

RowMap map_of(const DispatchLayout& l) {
  return {l.T, l.k, static_cast<size_t>(l.num_rows), l.row_of_slot_TK.data(),
          l.slot_of_row_R.data()};
}
RowMap map_of(const PaddedLayout& l) {
  return {l.T, l.k, l.num_rows(), l.pos_of_slot_TK.data(), l.slot_of_pos_EC.data()};
}

void check_h(const char* who, int H) { MOE_CHECK(H > 0, who, ": hidden must be > 0, got ", H); }

// The four operations over a RowMap; each public function below names itself and its layout.
void gather(const char* who, float* rows, const float* x_TH, const RowMap& m, int H) {
  check_h(who, H);
  kernels::gather_rows(rows, x_TH, m.slot_of_row, m.N, m.k, H);
}

void gather_grad(const char* who, float* dx_TH, const float* drows, const RowMap& m, int H) {
  check_h(who, H);
  kernels::gather_rows_backward(dx_TH, drows, m.row_of_slot, m.T, m.k, H);
}

void combine(const char* who, float* out_TH, const float* y, const float* weight_TK, const RowMap& m, int H,
             bool accumulate) {
  check_h(who, H);
  kernels::combine_rows(out_TH, y, weight_TK, m.row_of_slot, m.T, m.k, H, accumulate);
}

void combine_grad(const char* who, float* dy, float* dweight_TK, const float* dout_TH, const float* y,
                  const float* weight_TK, const RowMap& m, int H) {
  check_h(who, H);
  kernels::combine_rows_backward(dy, dweight_TK, dout_TH, y, weight_TK, m.row_of_slot, m.T, m.k, H);
}

}  // namespace

void gather_rows_forward(float* rows_RH, const float* x_TH, const DispatchLayout& l, int H) {
  gather("gather_rows_forward", rows_RH, x_TH, map_of(l), H);
}

void gather_rows_backward(float* dx_TH, const float* drows_RH, const DispatchLayout& l, int H) {
  gather_grad("gather_rows_backward", dx_TH, drows_RH, map_of(l), H);
}

void combine_forward(float* out_TH, const float* y_RH, const float* weight_TK,
                     const DispatchLayout& l, int H, bool accumulate) {
  combine("combine_forward", out_TH, y_RH, weight_TK, map_of(l), H, accumulate);
}

void combine_backward(float* dy_RH, float* dweight_TK, const float* dout_TH, const float* y_RH,
                      const float* weight_TK, const DispatchLayout& l, int H) {
  combine_grad("combine_backward", dy_RH, dweight_TK, dout_TH, y_RH, weight_TK, map_of(l), H);
}

void padded_dispatch_forward(float* buf_ECH, const float* x_TH, const PaddedLayout& l, int H) {
  gather("padded_dispatch_forward", buf_ECH, x_TH, map_of(l), H);
}

void padded_gather_backward(float* dx_TH, const float* dbuf_ECH, const PaddedLayout& l, int H) {
  gather_grad("padded_gather_backward", dx_TH, dbuf_ECH, map_of(l), H);
}

void padded_combine_forward(float* out_TH, const float* y_ECH, const float* weight_TK,
                            const PaddedLayout& l, int H, bool accumulate) {
  combine("padded_combine_forward", out_TH, y_ECH, weight_TK, map_of(l), H, accumulate);
}

void padded_combine_backward(float* dy_ECH, float* dweight_TK, const float* dout_TH,
                             const float* y_ECH, const float* weight_TK, const PaddedLayout& l,
                             int H) {
  combine_grad("padded_combine_backward", dy_ECH, dweight_TK, dout_TH, y_ECH, weight_TK, map_of(l), H);
}

}  // namespace moe::mixture
