#include "parallel/zero1.h"

#include <climits>

#include "core/error.h"
#include "parallel/grid.h"

namespace moe::parallel {

size_t ShardSpan::mine_begin() const {
  size_t at = begin;
  for (int r = 0; r < rank; ++r) at += static_cast<size_t>(counts[r]);
  return at;
}

ZeroShard ZeroShard::whole(const model::ParamLayout& layout) {
  ZeroShard z;
  z.total_ = layout.total();
  if (z.total_ > 0) z.ranges_.emplace_back(0, z.total_);
  z.owned_ = z.total_;
  return z;
}

ZeroShard ZeroShard::split(const model::ParamLayout& layout, int data_rank, int data_size,
                           int dp_rank, int dp_size) {
  MOE_CHECK(data_size >= 1 && dp_size >= 1 && data_rank >= 0 && data_rank < data_size &&
                dp_rank >= 0 && dp_rank < dp_size,
            "ZeRO-1 shard: rank ", data_rank, " of ", data_size, " (data), ", dp_rank, " of ",
            dp_size, " (dp) out of range");
  ZeroShard z;
  z.sharded_ = true;
  z.total_ = layout.total();
  const auto& specs = layout.specs();
  for (size_t i = 0; i < specs.size();) {
    size_t j = i;
    while (j < specs.size() && specs[j].is_expert == specs[i].is_expert) ++j;
    ShardSpan s;
    s.begin = specs[i].offset;
    s.end = specs[j - 1].offset + specs[j - 1].numel;
    s.expert = specs[i].is_expert;
    const int P = s.expert ? dp_size : data_size;
    s.rank = s.expert ? dp_rank : data_rank;
    const size_t n = s.end - s.begin, q = n / P, rem = n % P;
    for (int r = 0; r < P; ++r) {
      const size_t c = q + (static_cast<size_t>(r) < rem ? 1 : 0);
      MOE_CHECK(c <= static_cast<size_t>(INT_MAX), "ZeRO-1 shard: a block of ", c,
                " elements exceeds MPI's int counts");
      s.counts.push_back(static_cast<int>(c));
    }
    z.spans_.push_back(std::move(s));
    i = j;
  }
  z.finish();
  return z;
}

ZeroShard ZeroShard::split(const model::ParamLayout& layout, const Grid& grid) {
  ZeroShard z = split(layout, grid.data.rank(), grid.data.size(), grid.dp.rank(), grid.dp.size());
  for (ShardSpan& s : z.spans_) s.group = s.expert ? &grid.dp : &grid.data;
  return z;
}

void ZeroShard::finish() {
  ranges_.clear();
  owned_ = 0;
  for (const ShardSpan& s : spans_) {
    const size_t b = s.mine_begin(), e = s.mine_end();
    if (e > b) ranges_.emplace_back(b, e);
    owned_ += e - b;
  }
}

void ZeroShard::reduce_scatter(float* grads) const {
  for (const ShardSpan& s : spans_) {
    MOE_CHECK(s.group, "ZeroShard::reduce_scatter: a shard without groups");
    if (s.group->size() > 1) s.group->reduce_scatter_sum(grads + s.begin, s.counts);
  }
}

void ZeroShard::allgather(float* params) const {
  for (const ShardSpan& s : spans_) {
    MOE_CHECK(s.group, "ZeroShard::allgather: a shard without groups");
    if (s.group->size() > 1) s.group->allgatherv(params + s.begin, s.counts);
  }
}

void ZeroShard::gather_full(const float* local, Device local_device, float* full) const {
  size_t at = 0;
  for (const auto& [b, e] : ranges_) {
    device_copy(Device::kCpu, full + b, local_device, local + at, (e - b) * sizeof(float));
    at += e - b;
  }
  if (!sharded_) return;
  for (const ShardSpan& s : spans_) {
    MOE_CHECK(s.group, "ZeroShard::gather_full: a shard without groups");
    if (s.group->size() > 1) s.group->allgatherv(full + s.begin, s.counts);
  }
}

void ZeroShard::take_slice(const float* full, float* local, Device local_device) const {
  size_t at = 0;
  for (const auto& [b, e] : ranges_) {
    device_copy(local_device, local + at, Device::kCpu, full + b, (e - b) * sizeof(float));
    at += e - b;
  }
}

}  // namespace moe::parallel
