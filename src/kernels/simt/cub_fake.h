// cub::DeviceRadixSort::SortPairs for the SIMT shim builds (CUB's device algorithms have no CPU
// path): the same contract. A call with d_temp_storage == nullptr only writes the temporary
// storage size; a real call needs that much device memory at d_temp_storage, sorts the pairs
// stably by bits [begin_bit, end_bit) of the key (unsigned keys as they are, signed ones with the
// sign bit flipped, as CUB orders them) and runs on the stream like any other device work.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/simt/simt_device.h"

namespace cub {

struct DeviceRadixSort {
  // What CUB asks for, roughly: double buffers of keys and values plus a histogram per pass.
  template <class K, class V>
  static size_t temp_bytes_for(int64_t n) {
    return static_cast<size_t>(n) * (sizeof(K) + sizeof(V)) + 4096;
  }

  template <class K, class V, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const K* d_keys_in,
                               K* d_keys_out, const V* d_values_in, V* d_values_out,
                               NumItemsT num_items, int begin_bit = 0,
                               int end_bit = sizeof(K) * 8, cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<K>, "the SIMT shim's SortPairs sorts integer keys");
    (void)stream;
    using moe::simt::set_last_error;
    const int64_t n = static_cast<int64_t>(num_items);
    auto bad = [](std::string why) {
      set_last_error(cudaErrorInvalidValue, "cub::DeviceRadixSort::SortPairs: " + why);
      return cudaErrorInvalidValue;
    };
    if (n < 0) return bad("num_items " + std::to_string(n));
    if (begin_bit < 0 || end_bit > static_cast<int>(sizeof(K) * 8) || begin_bit > end_bit)
      return bad("bit range [" + std::to_string(begin_bit) + ", " + std::to_string(end_bit) +
                 ") outside the key's " + std::to_string(sizeof(K) * 8) + " bits");
    const size_t need = temp_bytes_for<K, V>(n);
    if (!d_temp_storage) {
      temp_storage_bytes = need;
      return cudaSuccess;
    }
    if (temp_storage_bytes < need)
      return bad("temp_storage_bytes " + std::to_string(temp_storage_bytes) + " < " +
                 std::to_string(need) + " (ask with d_temp_storage == nullptr first)");
    if (!moe::simt::device_range(d_temp_storage, need))
      return bad("d_temp_storage is not device memory of " + std::to_string(need) + " bytes");
    const size_t kb = sizeof(K) * static_cast<size_t>(n), vb = sizeof(V) * static_cast<size_t>(n);
    if (n > 0 && (!moe::simt::device_range(d_keys_in, kb) || !moe::simt::device_range(d_keys_out, kb) ||
                  !moe::simt::device_range(d_values_in, vb) || !moe::simt::device_range(d_values_out, vb)))
      return bad("keys or values are not device memory of " + std::to_string(n) + " items");
    if (moe::simt::sticky_error() != cudaSuccess) return moe::simt::sticky_error();
    moe::simt::enqueue("cub::DeviceRadixSort::SortPairs", [=] {
      using U = std::make_unsigned_t<K>;
      const U flip = std::is_signed_v<K> ? U(U(1) << (sizeof(K) * 8 - 1)) : U(0);
      const int width = end_bit - begin_bit;
      const U mask = width >= static_cast<int>(sizeof(U) * 8) ? U(~U(0)) : U((U(1) << width) - 1);
      auto digit = [&](K k) { return U((U(k) ^ flip) >> begin_bit) & mask; };
      std::vector<int64_t> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return digit(d_keys_in[a]) < digit(d_keys_in[b]);
      });
      std::vector<K> keys(static_cast<size_t>(n));
      std::vector<V> vals(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = d_keys_in[order[i]];
        vals[i] = d_values_in[order[i]];
      }
      std::copy(keys.begin(), keys.end(), d_keys_out);
      std::copy(vals.begin(), vals.end(), d_values_out);
    });
    return cudaSuccess;
  }
};

}  // namespace cub
