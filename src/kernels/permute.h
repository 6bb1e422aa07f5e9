// Token permutation kernels of the MoE layer on raw index maps: the padding-free layout's counting
// sort, gather / scatter-add of token rows, the weighted combine and its backward, and the
// expert-parallel regroup. The MoE layer (moe/) calls only these for its hot loops, so each has a
// CPU implementation (namespace moe::kernels) and a CUDA one with the same signature (namespace
// moe::kernels::cuda, src/kernels/cuda/, device pointers) that is tested against it.
// Sums are in a fixed order (per token over k ascending; no atomics), so every device and layout
// gives the same result for the same inputs. Backward adds (+=), see gemm.h.
// Legend: T tokens, k slots, p = t·k + j flat pair, E experts, N rows of an expert buffer (R kept
// rows, or E·C when padded), H hidden.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe::kernels {

// count_E[e] = number of pairs p with topk_idx_TK[p] == e. count_E is HOST memory on every device:
// on a GPU this is the one explicit device-to-host sync of a MoE layer (the counts size the
// grouped expert GEMM). Throws naming p when an id is outside [0, E) (on every device).
void count_pairs_per_expert(int32_t* count_E, const int32_t* topk_idx_TK, size_t P, int E);
// The stable placement of the counting sort: pairs in p order, rows of expert e from offsets_E1[e]
// on; only the first offsets_E1[e+1] - offsets_E1[e] pairs of e are kept (a capacity), the rest
// get row_of_slot_TK[p] = -1. slot_of_row_R [offsets_E1[E]], row_of_slot_TK [P]. offsets_E1 is
// HOST memory (from count_pairs_per_expert); the other arrays are on the active device.
void place_pairs(int32_t* slot_of_row_R, int32_t* row_of_slot_TK, const int32_t* topk_idx_TK,
                 const int32_t* offsets_E1, size_t P, int E);

// rows_NH[n] = x_TH[slot_of_row_N[n] / k]; a row whose slot is -1 (padding) is zeroed.
void gather_rows(float* rows_NH, const float* x_TH, const int32_t* slot_of_row_N, size_t N, int k,
                 int H);
// dx_TH[t] += sum_{j ascending} drows_NH[row_of_slot_TK[t·k + j]] (rows of -1 skipped).
void gather_rows_backward(float* dx_TH, const float* drows_NH, const int32_t* row_of_slot_TK, int T,
                          int k, int H);
// out_TH[t] (= or +=) sum_{j ascending} weight_TK[p] · y_NH[row_of_slot_TK[p]], p = t·k + j.
void combine_rows(float* out_TH, const float* y_NH, const float* weight_TK,
                  const int32_t* row_of_slot_TK, int T, int k, int H, bool accumulate);
// dy_NH[row(p)] = weight_TK[p] · dout_TH[t] ; dweight_TK[p] = dot(y_NH[row(p)], dout_TH[t]), for
// every kept pair (rows of distinct pairs are distinct); a dropped pair gets dweight 0, and rows
// no pair owns (padding) are left as they are. Either output may be nullptr. The dot is the
// fixed-order row_dot of element_math.h.
void combine_rows_backward(float* dy_NH, float* dweight_TK, const float* dout_TH, const float* y_NH,
                           const float* weight_TK, const int32_t* row_of_slot_TK, int T, int k,
                           int H);

// Expert-parallel regroup: dst_NH[row_of_i[i]] = src_NH[i] for i < n (received pairs into
// local-expert-contiguous order), and its inverse dst_NH[i] = src_NH[row_of_i[i]].
void scatter_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n, int H);
void gather_rows_by_index(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n,
                          int H);
// The expert side of the EP combine: dst_NH[i] = value_n[i] · src_NH[row_of_i[i]].
void gather_scaled_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i,
                        const float* value_n, size_t n, int H);
// Its backward on the expert side: dsrc_NH[row_of_i[i]] = value_n[i] · d_NH[i] (overwrites; rows
// are distinct) and dvalue_n[i] = dot(src_NH[row_of_i[i]], d_NH[i]).
void gather_scaled_rows_backward(float* dsrc_NH, float* dvalue_n, const float* d_NH,
                                 const float* src_NH, const int32_t* row_of_i, const float* value_n,
                                 size_t n, int H);


// The CUDA implementations (src/kernels/cuda/), same contract, device pointers; the leaf
// kernels above forward to them when the active device is CUDA (kernels/device_select.h).
namespace cuda {
void count_pairs_per_expert(int32_t* count_E, const int32_t* topk_idx_TK, size_t P, int E);
void place_pairs(int32_t* slot_of_row_R, int32_t* row_of_slot_TK, const int32_t* topk_idx_TK,
                 const int32_t* offsets_E1, size_t P, int E);
void gather_rows(float* rows_NH, const float* x_TH, const int32_t* slot_of_row_N, size_t N, int k,
                 int H);
void gather_rows_backward(float* dx_TH, const float* drows_NH, const int32_t* row_of_slot_TK, int T,
                          int k, int H);
void combine_rows(float* out_TH, const float* y_NH, const float* weight_TK,
                  const int32_t* row_of_slot_TK, int T, int k, int H, bool accumulate);
void combine_rows_backward(float* dy_NH, float* dweight_TK, const float* dout_TH, const float* y_NH,
                           const float* weight_TK, const int32_t* row_of_slot_TK, int T, int k,
                           int H);
void scatter_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n, int H);
void gather_rows_by_index(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n,
                          int H);
void gather_scaled_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i,
                        const float* value_n, size_t n, int H);
void gather_scaled_rows_backward(float* dsrc_NH, float* dvalue_n, const float* d_NH,
                                 const float* src_NH, const int32_t* row_of_i, const float* value_n,
                                 size_t n, int H);
}  // namespace cuda

}  // namespace moe::kernels
