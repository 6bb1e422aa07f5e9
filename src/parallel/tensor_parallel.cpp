#include "parallel/tensor_parallel.h"

#include <cstring>
#include <vector>

#include "core/error.h"

namespace moe::parallel {

model::ParamLayout unsplit_layout(const model::ParamLayout& local, const model::ModelConfig& cfg) {
  return model::ParamLayout(cfg, local.shard(), local.stage());
}

namespace {

// Rows and columns of a 2-D tensor's full shape, and its slice's width along the split dimension.
struct Split {
  size_t rows = 0, cols = 0;
};
Split split_of(const model::ParamSpec& s) {
  // A split vector (qwen2_moe's q/k/v biases, split with their projections' rows) is one column.
  if (s.full_shape.size() == 1 && s.tp_dim == 0) return {static_cast<size_t>(s.full_shape[0]), 1};
  MOE_CHECK(s.full_shape.size() == 2, "tensor parallelism: parameter ", s.name, " is split but not a matrix");
  return {static_cast<size_t>(s.full_shape[0]), static_cast<size_t>(s.full_shape[1])};
}

// Slice r of t of a row-major full [rows, cols] tensor along `dim`, as one contiguous block:
// dim 0 is rows [r·rows/t, ...) (a contiguous run of the full tensor); dim 1 is columns
// [r·cols/t, ...) of every row.
void copy_slice(const model::ParamSpec& s, int r, int t, const float* full, float* slice, bool to_full) {
  const Split sp = split_of(s);
  if (s.tp_dim == 0) {
    const size_t n = sp.rows / t * sp.cols;
    float* f = const_cast<float*>(full) + n * r;
    if (to_full)
      std::memcpy(f, slice, n * sizeof(float));
    else
      std::memcpy(slice, f, n * sizeof(float));
    return;
  }
  const size_t w = sp.cols / t;
  for (size_t i = 0; i < sp.rows; ++i) {
    float* f = const_cast<float*>(full) + i * sp.cols + w * r;
    if (to_full)
      std::memcpy(f, slice + i * w, w * sizeof(float));
    else
      std::memcpy(slice + i * w, f, w * sizeof(float));
  }
}

}  // namespace

void tp_gather(const model::ParamLayout& local, const float* local_block, const model::ParamLayout& full,
               float* full_block, const comm::Group& tp) {
  MOE_CHECK(local.tp().size == tp.size() && local.tp().rank == tp.rank(), "tp_gather: the layout is rank ",
            local.tp().rank, " of ", local.tp().size, ", the group rank ", tp.rank(), " of ", tp.size());
  std::vector<float> all;
  for (const model::ParamSpec& s : local.specs()) {
    const model::ParamSpec& f = full.find(s.name);
    float* out = full_block + f.offset;
    if (s.tp_dim < 0) {
      std::memcpy(out, local_block + s.offset, s.numel * sizeof(float));
      continue;
    }
    // Every rank's slice, in rank order, then each put at its place.
    all.resize(s.numel * tp.size());
    std::memcpy(all.data() + s.numel * tp.rank(), local_block + s.offset, s.numel * sizeof(float));
    tp.allgatherv(all.data(), std::vector<int>(tp.size(), static_cast<int>(s.numel)));
    for (int r = 0; r < tp.size(); ++r) copy_slice(s, r, tp.size(), out, all.data() + s.numel * r, true);
  }
}

void tp_slice(const model::ParamLayout& full, const float* full_block, const model::ParamLayout& local,
              float* local_block) {
  for (const model::ParamSpec& s : local.specs()) {
    const float* in = full_block + full.find(s.name).offset;
    if (s.tp_dim < 0)
      std::memcpy(local_block + s.offset, in, s.numel * sizeof(float));
    else
      copy_slice(s, local.tp().rank, local.tp().size, in, local_block + s.offset, false);
  }
}

}  // namespace moe::parallel
