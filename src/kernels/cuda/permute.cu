// Token permutation kernels on the GPU. Row kernels run one block per output row with threads
// across H; every sum runs in the CPU's order (per token over k ascending), without float atomics.
// place_pairs is a stable radix sort of (expert, pair) followed by the rank of each pair within
// its expert, which is exactly the CPU's counting-sort placement. See permute.h for the legend.
#include <climits>
#include "kernels/cuda/radix_sort.cuh"
#include <vector>

#include "kernels/cuda/reduce.cuh"
#include "kernels/element_math.h"
#include "kernels/permute.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kMaxSharedHistogram = 12288;  // experts counted in shared memory (48 KB)

// count[e] += pairs choosing e; the first p with an id outside [0, E) is kept in *bad.
__global__ void count_kernel(int* count, unsigned long long* bad, const int32_t* idx, size_t P,
                             int E) {
  MOE_DYNAMIC_SHARED(int, hist);
  const bool shared = E <= kMaxSharedHistogram;
  if (shared) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
  }
  MOE_GRID_STRIDE(p, P) {
    const int32_t e = idx[p];
    if (e < 0 || e >= E)
      atomicMin(bad, static_cast<unsigned long long>(p));
    else
      atomicAdd(shared ? &hist[e] : &count[e], 1);
  }
  if (shared) {
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (hist[e]) atomicAdd(&count[e], hist[e]);
  }
}

// Sort input: key = expert id (E for an id outside [0, E)), value = pair index.
__global__ void sort_input_kernel(uint32_t* keys, int32_t* vals, const int32_t* idx, size_t P,
                                  int E) {
  MOE_GRID_STRIDE(p, P) {
    const int32_t e = idx[p];
    keys[p] = e >= 0 && e < E ? static_cast<uint32_t>(e) : static_cast<uint32_t>(E);
    vals[p] = static_cast<int32_t>(p);
  }
}

// start[e] = first position of expert e in the sorted keys (lower bound), e in [0, E].
__global__ void expert_start_kernel(int32_t* start, const uint32_t* keys, int P, int E) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e > E) return;
  int lo = 0, hi = P;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (keys[mid] < static_cast<uint32_t>(e))
      lo = mid + 1;
    else
      hi = mid;
  }
  start[e] = lo;
}

// The pair at sorted position i is the (i - start[e])-th pair of expert e in p order.
__global__ void place_kernel(int32_t* slot_of_row, int32_t* row_of_slot, const uint32_t* keys,
                             const int32_t* vals, const int32_t* start, const int32_t* offsets,
                             int P, int E) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= P) return;
  const int e = static_cast<int>(keys[i]);
  const int32_t p = vals[i];
  if (e >= E) {
    row_of_slot[p] = -1;
    return;
  }
  const int rank = i - start[e];
  if (rank < offsets[e + 1] - offsets[e]) {
    const int32_t r = offsets[e] + rank;
    slot_of_row[r] = p;
    row_of_slot[p] = r;
  } else {
    row_of_slot[p] = -1;
  }
}

__global__ void gather_rows_kernel(float* rows, const float* x, const int32_t* slot_of_row,
                                   size_t N, int k, int H) {
  MOE_ROW_STRIDE(n, N) {
    const int32_t p = slot_of_row[n];
    float* dst = rows + n * H;
    const float* src = p < 0 ? nullptr : x + static_cast<size_t>(p / k) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) dst[c] = src ? src[c] : 0.0f;
  }
}

__global__ void gather_rows_backward_kernel(float* dx, const float* drows,
                                            const int32_t* row_of_slot, size_t T, int k, int H) {
  MOE_ROW_STRIDE(t, T) {
    const int32_t* rs = row_of_slot + t * k;
    float* d = dx + t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = d[c];
      for (int j = 0; j < k; ++j)
        if (rs[j] >= 0) acc += drows[static_cast<size_t>(rs[j]) * H + c];
      d[c] = acc;
    }
  }
}

__global__ void combine_rows_kernel(float* out, const float* y, const float* weight,
                                    const int32_t* row_of_slot, size_t T, int k, int H,
                                    bool accumulate) {
  MOE_ROW_STRIDE(t, T) {
    const int32_t* rs = row_of_slot + t * k;
    const float* w = weight + t * k;
    float* o = out + t * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) {
      float acc = accumulate ? o[c] : 0.0f;
      for (int j = 0; j < k; ++j)
        if (rs[j] >= 0) acc += w[j] * y[static_cast<size_t>(rs[j]) * H + c];
      o[c] = acc;
    }
  }
}

// dy[row(p)] = weight[p] · dout[p / k]: rows of distinct pairs are distinct, so no conflicts.
__global__ void combine_dy_kernel(float* dy, const float* dout, const float* weight,
                                  const int32_t* row_of_slot, size_t P, int k, int H) {
  MOE_ROW_STRIDE(p, P) {
    const int32_t r = row_of_slot[p];
    if (r < 0) continue;
    const float w = weight[p];
    const float* d = dout + (p / k) * H;
    float* o = dy + static_cast<size_t>(r) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = w * d[c];
  }
}

// dweight[p] += row_dot(y[row(p)], dout[p / k]), one thread per pair.
__global__ void combine_dweight_kernel(float* dweight, const float* dout, const float* y,
                                       const int32_t* row_of_slot, size_t P, int k, int H) {
  MOE_GRID_STRIDE(p, P) {
    const int32_t r = row_of_slot[p];
    dweight[p] = r < 0 ? 0.0f : math::row_dot(y + static_cast<size_t>(r) * H, dout + (p / k) * H, H);
  }
}

// dst[row_of_i[i]] = src[i] (scatter) or dst[i] = value[i] · src[row_of_i[i]] (gather; value
// null means 1).
__global__ void scatter_rows_kernel(float* dst, const float* src, const int32_t* row_of_i, size_t n,
                                    int H) {
  MOE_ROW_STRIDE(i, n) {
    const float* s = src + i * H;
    float* d = dst + static_cast<size_t>(row_of_i[i]) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) d[c] = s[c];
  }
}
__global__ void gather_by_index_kernel(float* dst, const float* src, const int32_t* row_of_i,
                                       const float* value, size_t n, int H) {
  MOE_ROW_STRIDE(i, n) {
    const float* s = src + static_cast<size_t>(row_of_i[i]) * H;
    float* d = dst + i * H;
    if (value) {
      const float w = value[i];
      for (int c = threadIdx.x; c < H; c += blockDim.x) d[c] = w * s[c];
    } else {
      for (int c = threadIdx.x; c < H; c += blockDim.x) d[c] = s[c];
    }
  }
}

// dsrc[row_of_i[i]] = value[i] · d[i] (overwrites)
__global__ void scatter_scaled_kernel(float* dsrc, const float* d, const int32_t* row_of_i,
                                      const float* value, size_t n, int H) {
  MOE_ROW_STRIDE(i, n) {
    const float w = value[i];
    const float* s = d + i * H;
    float* o = dsrc + static_cast<size_t>(row_of_i[i]) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) o[c] = w * s[c];
  }
}
// dvalue[i] = row_dot(src[row_of_i[i]], d[i]) (overwrites), one thread per row.
__global__ void dvalue_kernel(float* dvalue, const float* d, const float* src,
                              const int32_t* row_of_i, size_t n, int H) {
  MOE_GRID_STRIDE(i, n) {
    dvalue[i] = math::row_dot(src + static_cast<size_t>(row_of_i[i]) * H, d + i * H, H);
  }
}


void check_rows(const char* who, int k, int H) {
  MOE_CHECK(k >= 1 && H >= 0, who, ": k=", k, " H=", H);
}

}  // namespace

void count_pairs_per_expert(int32_t* count_E, const int32_t* topk_idx_TK, size_t P, int E) {
  MOE_CHECK(E >= 0, "count_pairs_per_expert: E=", E);
  for (int e = 0; e < E; ++e) count_E[e] = 0;
  if (P == 0) return;
  char* ws =
      static_cast<char*>(workspace(Workspace::kPermuteCount).get(256 + sizeof(int) * static_cast<size_t>(E)));
  auto* bad = reinterpret_cast<unsigned long long*>(ws);
  int* count = reinterpret_cast<int*>(ws + 256);
  const unsigned long long no_bad = ULLONG_MAX;
  MOE_CUDA_CHECK(cudaMemcpyAsync(bad, &no_bad, sizeof(no_bad), cudaMemcpyHostToDevice, stream()));
  if (E > 0) MOE_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(int) * E, stream()));
  const size_t smem = E <= kMaxSharedHistogram ? sizeof(int) * E : 0;
  unsigned blocks = elem_blocks(P);
  if (blocks > 1024) blocks = 1024;
  MOE_LAUNCH(count_kernel, blocks, kThreads, smem, stream())(count, bad, topk_idx_TK, P, E);
  MOE_CUDA_LAUNCHED("count_pairs_per_expert");
  unsigned long long first_bad = 0;
  if (E > 0)
    MOE_CUDA_CHECK(
        cudaMemcpyAsync(count_E, count, sizeof(int) * E, cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(&first_bad, bad, sizeof(first_bad), cudaMemcpyDeviceToHost, stream()));
  MOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  if (first_bad != no_bad) {
    int32_t e = 0;
    MOE_CUDA_CHECK(
        cudaMemcpy(&e, topk_idx_TK + first_bad, sizeof(int32_t), cudaMemcpyDeviceToHost));
    throw Error(str_cat("topk_idx[", first_bad, "] = ", e, " is not an expert in [0, ", E, ")"));
  }
}

void place_pairs(int32_t* slot_of_row_R, int32_t* row_of_slot_TK, const int32_t* topk_idx_TK,
                 const int32_t* offsets_E1, size_t P, int E) {
  MOE_CHECK(E >= 0, "place_pairs: E=", E);
  MOE_CHECK(P <= static_cast<size_t>(INT_MAX), "place_pairs: ", P,
            " pairs exceed the int32 row index");
  if (P == 0) return;
  const int n = static_cast<int>(P);
  // Key bits: E itself (the key of an invalid id) must fit.
  int end_bit = 1;
  while (end_bit < 32 && (static_cast<uint32_t>(E) >> end_bit) != 0) ++end_bit;
  size_t temp_bytes = 0;
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit,
      stream()));
  const size_t key_bytes = align256(sizeof(uint32_t) * P);
  const size_t e_bytes = align256(sizeof(int32_t) * (static_cast<size_t>(E) + 1));
  char* ws =
      static_cast<char*>(workspace(Workspace::kPermuteSort).get(4 * key_bytes + 2 * e_bytes + temp_bytes));
  auto* keys_in = reinterpret_cast<uint32_t*>(ws);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + key_bytes);
  auto* vals_in = reinterpret_cast<int32_t*>(ws + 2 * key_bytes);
  auto* vals_out = reinterpret_cast<int32_t*>(ws + 3 * key_bytes);
  auto* start = reinterpret_cast<int32_t*>(ws + 4 * key_bytes);
  auto* offsets = reinterpret_cast<int32_t*>(ws + 4 * key_bytes + e_bytes);
  void* temp = ws + 4 * key_bytes + 2 * e_bytes;

  MOE_CUDA_CHECK(cudaMemcpyAsync(offsets, offsets_E1, sizeof(int32_t) * (E + 1),
                                 cudaMemcpyHostToDevice, stream()));
  MOE_LAUNCH(sort_input_kernel, elem_blocks(P), kThreads, 0, stream())(keys_in, vals_in, topk_idx_TK, P, E);
  MOE_CUDA_LAUNCHED("place_pairs sort input");
  MOE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in,
                                                 vals_out, n, 0, end_bit, stream()));
  MOE_LAUNCH(expert_start_kernel, blocks_for(static_cast<size_t>(E) + 1), kThreads, 0, stream())(
      start, keys_out, n, E);
  MOE_CUDA_LAUNCHED("place_pairs starts");
  MOE_LAUNCH(place_kernel, blocks_for(P), kThreads, 0, stream())(slot_of_row_R, row_of_slot_TK, keys_out,
                                                                 vals_out, start, offsets, n, E);
  MOE_CUDA_LAUNCHED("place_pairs place");
}

void gather_rows(float* rows_NH, const float* x_TH, const int32_t* slot_of_row_N, size_t N, int k,
                 int H) {
  if (N == 0 || H == 0) return;
  check_rows("gather_rows", k, H);
  MOE_LAUNCH(gather_rows_kernel, row_blocks(N), row_threads(H), 0, stream())(rows_NH, x_TH, slot_of_row_N,
                                                                             N, k, H);
  MOE_CUDA_LAUNCHED("gather_rows");
}

void gather_rows_backward(float* dx_TH, const float* drows_NH, const int32_t* row_of_slot_TK, int T,
                          int k, int H) {
  MOE_CHECK(T >= 0, "gather_rows_backward: T=", T);
  if (T == 0 || H == 0) return;
  check_rows("gather_rows_backward", k, H);
  MOE_LAUNCH(gather_rows_backward_kernel, row_blocks(T), row_threads(H), 0, stream())(
      dx_TH, drows_NH, row_of_slot_TK, T, k, H);
  MOE_CUDA_LAUNCHED("gather_rows_backward");
}

void combine_rows(float* out_TH, const float* y_NH, const float* weight_TK,
                  const int32_t* row_of_slot_TK, int T, int k, int H, bool accumulate) {
  MOE_CHECK(T >= 0, "combine_rows: T=", T);
  if (T == 0 || H == 0) return;
  check_rows("combine_rows", k, H);
  MOE_LAUNCH(combine_rows_kernel, row_blocks(T), row_threads(H), 0, stream())(
      out_TH, y_NH, weight_TK, row_of_slot_TK, T, k, H, accumulate);
  MOE_CUDA_LAUNCHED("combine_rows");
}

void combine_rows_backward(float* dy_NH, float* dweight_TK, const float* dout_TH, const float* y_NH,
                           const float* weight_TK, const int32_t* row_of_slot_TK, int T, int k,
                           int H) {
  MOE_CHECK(T >= 0, "combine_rows_backward: T=", T);
  if (T == 0 || H == 0) return;
  check_rows("combine_rows_backward", k, H);
  const size_t P = static_cast<size_t>(T) * k;
  if (dy_NH) {
    MOE_LAUNCH(combine_dy_kernel, row_blocks(P), row_threads(H), 0, stream())(dy_NH, dout_TH, weight_TK,
                                                                              row_of_slot_TK, P, k, H);
    MOE_CUDA_LAUNCHED("combine_rows_backward dy");
  }
  if (dweight_TK) {
    MOE_LAUNCH(combine_dweight_kernel, elem_blocks(P), kThreads, 0, stream())(dweight_TK, dout_TH, y_NH,
                                                                              row_of_slot_TK, P, k, H);
    MOE_CUDA_LAUNCHED("combine_rows_backward dweight");
  }
}

void scatter_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n, int H) {
  MOE_CHECK(H >= 0, "scatter_rows: H=", H);
  if (n == 0 || H == 0) return;
  MOE_LAUNCH(scatter_rows_kernel, row_blocks(n), row_threads(H), 0, stream())(dst_NH, src_NH, row_of_i, n,
                                                                              H);
  MOE_CUDA_LAUNCHED("scatter_rows");
}

void gather_rows_by_index(float* dst_NH, const float* src_NH, const int32_t* row_of_i, size_t n,
                          int H) {
  MOE_CHECK(H >= 0, "gather_rows_by_index: H=", H);
  if (n == 0 || H == 0) return;
  MOE_LAUNCH(gather_by_index_kernel, row_blocks(n), row_threads(H), 0, stream())(dst_NH, src_NH, row_of_i,
                                                                                 nullptr, n, H);
  MOE_CUDA_LAUNCHED("gather_rows_by_index");
}

void gather_scaled_rows(float* dst_NH, const float* src_NH, const int32_t* row_of_i,
                        const float* value_n, size_t n, int H) {
  MOE_CHECK(H >= 0, "gather_scaled_rows: H=", H);
  if (n == 0 || H == 0) return;
  MOE_LAUNCH(gather_by_index_kernel, row_blocks(n), row_threads(H), 0, stream())(dst_NH, src_NH, row_of_i,
                                                                                 value_n, n, H);
  MOE_CUDA_LAUNCHED("gather_scaled_rows");
}

void gather_scaled_rows_backward(float* dsrc_NH, float* dvalue_n, const float* d_NH,
                                 const float* src_NH, const int32_t* row_of_i, const float* value_n,
                                 size_t n, int H) {
  MOE_CHECK(H >= 0, "gather_scaled_rows_backward: H=", H);
  if (n == 0) return;
  if (H > 0) {
    MOE_LAUNCH(scatter_scaled_kernel, row_blocks(n), row_threads(H), 0, stream())(dsrc_NH, d_NH, row_of_i,
                                                                                  value_n, n, H);
    MOE_CUDA_LAUNCHED("gather_scaled_rows_backward dsrc");
  }
  MOE_LAUNCH(dvalue_kernel, elem_blocks(n), kThreads, 0, stream())(dvalue_n, d_NH, src_NH, row_of_i, n, H);
  MOE_CUDA_LAUNCHED("gather_scaled_rows_backward dvalue");
}

}  // namespace moe::kernels::cuda
