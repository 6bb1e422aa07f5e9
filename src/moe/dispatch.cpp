// Dispatch and combine for both layouts. See dispatch.h.
// Both layouts reduce to the same two index maps: the row of each pair (row_of_slot_TK, -1 =
// dropped) and the pair of each row (slot_of_row, -1 = padding row). The kernels below take those
// maps, so the padded baseline runs exactly the same loops as the padding-free path.
// Legend: T tokens, H hidden, k slots, p = t·k + j, N rows of the expert buffer.
#include "moe/dispatch.h"

#include <cstddef>
#include <cstring>

#include "core/error.h"

namespace moe::mixture {
namespace {

// Index maps of one layout, as the kernels see them.
struct RowMap {
  int T, k;
  size_t N;                      // rows of the expert buffer (R, or E·C)
  const int32_t* row_of_slot;    // [T·k] row of each pair, -1 = dropped
  const int32_t* slot_of_row;    // [N] pair of each row, -1 = padding
};

RowMap map_of(const DispatchLayout& l) {
  return {l.T, l.k, static_cast<size_t>(l.num_rows), l.row_of_slot_TK.data(),
          l.slot_of_row_R.data()};
}
RowMap map_of(const PaddedLayout& l) {
  return {l.T, l.k, l.num_rows(), l.pos_of_slot_TK.data(), l.slot_of_pos_EC.data()};
}

void check_h(const char* who, int H) { MOE_CHECK(H > 0, who, ": hidden must be > 0, got ", H); }

inline void axpy(float* __restrict y, float a, const float* __restrict x, int H) {
  for (int i = 0; i < H; ++i) y[i] += a * x[i];
}
inline void add(float* __restrict y, const float* __restrict x, int H) {
  for (int i = 0; i < H; ++i) y[i] += x[i];
}
// Fixed-order dot product with 8 partial sums (vectorisable, and the same result every run).
inline float dot(const float* __restrict a, const float* __restrict b, int H) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= H; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < H; ++i) s += a[i] * b[i];
  return s;
}

// rows[n] = x[slot_of_row[n] / k], zero for a padding row.
void gather(float* rows, const float* x, const RowMap& m, int H) {
  const size_t row_bytes = static_cast<size_t>(H) * sizeof(float);
  for (size_t n = 0; n < m.N; ++n) {
    int32_t p = m.slot_of_row[n];
    float* dst = rows + n * H;
    if (p < 0) {
      std::memset(dst, 0, row_bytes);
    } else {
      std::memcpy(dst, x + static_cast<size_t>(p / m.k) * H, row_bytes);
    }
  }
}

// dx[t] += sum_j drows[row(t,j)]
void gather_backward(float* dx, const float* drows, const RowMap& m, int H) {
  for (int t = 0; t < m.T; ++t) {
    float* d = dx + static_cast<size_t>(t) * H;
    for (int j = 0; j < m.k; ++j) {
      int32_t r = m.row_of_slot[static_cast<size_t>(t) * m.k + j];
      if (r >= 0) add(d, drows + static_cast<size_t>(r) * H, H);
    }
  }
}

void combine(float* out, const float* y, const float* w, const RowMap& m, int H, bool accumulate) {
  for (int t = 0; t < m.T; ++t) {
    float* o = out + static_cast<size_t>(t) * H;
    if (!accumulate) std::memset(o, 0, static_cast<size_t>(H) * sizeof(float));
    for (int j = 0; j < m.k; ++j) {
      size_t p = static_cast<size_t>(t) * m.k + j;
      int32_t r = m.row_of_slot[p];
      if (r >= 0) axpy(o, w[p], y + static_cast<size_t>(r) * H, H);
    }
  }
}

void combine_bwd(float* dy, float* dw, const float* dout, const float* y, const float* w,
                 const RowMap& m, int H) {
  for (int t = 0; t < m.T; ++t) {
    const float* d = dout + static_cast<size_t>(t) * H;
    for (int j = 0; j < m.k; ++j) {
      size_t p = static_cast<size_t>(t) * m.k + j;
      int32_t r = m.row_of_slot[p];
      if (r < 0) continue;
      size_t off = static_cast<size_t>(r) * H;
      if (dy) axpy(dy + off, w[p], d, H);
      if (dw) dw[p] += dot(y + off, d, H);
    }
  }
}

}  // namespace

void gather_rows_forward(float* rows_RH, const float* x_TH, const DispatchLayout& l, int H) {
  check_h("gather_rows_forward", H);
  gather(rows_RH, x_TH, map_of(l), H);
}

void gather_rows_backward(float* dx_TH, const float* drows_RH, const DispatchLayout& l, int H) {
  check_h("gather_rows_backward", H);
  gather_backward(dx_TH, drows_RH, map_of(l), H);
}

void combine_forward(float* out_TH, const float* y_RH, const float* weight_TK,
                     const DispatchLayout& l, int H, bool accumulate) {
  check_h("combine_forward", H);
  combine(out_TH, y_RH, weight_TK, map_of(l), H, accumulate);
}

void combine_backward(float* dy_RH, float* dweight_TK, const float* dout_TH, const float* y_RH,
                      const float* weight_TK, const DispatchLayout& l, int H) {
  check_h("combine_backward", H);
  combine_bwd(dy_RH, dweight_TK, dout_TH, y_RH, weight_TK, map_of(l), H);
}

void padded_dispatch_forward(float* buf_ECH, const float* x_TH, const PaddedLayout& l, int H) {
  check_h("padded_dispatch_forward", H);
  gather(buf_ECH, x_TH, map_of(l), H);
}

void padded_gather_backward(float* dx_TH, const float* dbuf_ECH, const PaddedLayout& l, int H) {
  check_h("padded_gather_backward", H);
  gather_backward(dx_TH, dbuf_ECH, map_of(l), H);
}

void padded_combine_forward(float* out_TH, const float* y_ECH, const float* weight_TK,
                            const PaddedLayout& l, int H, bool accumulate) {
  check_h("padded_combine_forward", H);
  combine(out_TH, y_ECH, weight_TK, map_of(l), H, accumulate);
}

void padded_combine_backward(float* dy_ECH, float* dweight_TK, const float* dout_TH,
                             const float* y_ECH, const float* weight_TK, const PaddedLayout& l,
                             int H) {
  check_h("padded_combine_backward", H);
  combine_bwd(dy_ECH, dweight_TK, dout_TH, y_ECH, weight_TK, map_of(l), H);
}

}  // namespace moe::mixture
