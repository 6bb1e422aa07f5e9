// ZeRO-1 (`train --zero1`): the AdamW moments are split over the ranks that hold the same
// gradients, so each rank keeps 1/P of them. One step becomes
//   reduce-scatter of the gradients (instead of sync_gradients' all-reduce) -> AdamW on this
//   rank's slice only -> all-gather of the updated weights.
//
// The split (ZeroShard, the one place that decides it). The flat parameter layout is cut into the
// spans sync_gradients reduces in one call: maximal runs of contiguous tensors of one kind.
// Replicated tensors (attention, norms, router, shared experts, embeddings) have the same gradient
// on every data rank of a stage, so their spans split over the data group (EP × DP ranks); routed
// experts are the same on the DP ranks only, so theirs split over the dp group. A span of n
// elements over P ranks: group rank r owns the contiguous block
//     [r·q + min(r, s), (r + 1)·q + min(r + 1, s)),   q = n / P, s = n % P
// of the span, i.e. ⌈n/P⌉ elements for the first s ranks and ⌊n/P⌋ for the others (every rank's
// slice of a span is equal or one element larger), blocks in group-rank order. With one rank in a
// group (DP = EP = 1, or DP = 1 for the experts) that rank owns the whole span: --zero1 is then a
// no-op for those tensors, bit for bit.
//
// Checkpoints keep full logical tensors: gather_full puts the slices back together, take_slice
// cuts a full tensor (a loaded checkpoint, from any layout, with or without ZeRO) into this
// rank's slice.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "comm/group.h"
#include "core/device.h"
#include "model/params.h"

namespace moe::parallel {

struct Grid;

// One span of the flat layout and its split over its group.
struct ShardSpan {
  size_t begin = 0, end = 0;           // [begin, end) of the flat layout
  bool expert = false;                 // routed experts: split over dp; otherwise over data
  std::vector<int> counts;             // elements of each group rank's block, in rank order
  int rank = 0;                        // this rank's place in the group
  const comm::Group* group = nullptr;  // null for a shard built without a grid (tests)
  size_t mine_begin() const;           // flat offset of this rank's block
  size_t mine_end() const { return mine_begin() + static_cast<size_t>(counts[rank]); }
};

class ZeroShard {
 public:
  // The whole layout on this rank (no ZeRO): one piece [0, total).
  static ZeroShard whole(const model::ParamLayout& layout);
  // The split of the rule above, for a rank at (data_rank of data_size, dp_rank of dp_size).
  static ZeroShard split(const model::ParamLayout& layout, int data_rank, int data_size,
                         int dp_rank, int dp_size);
  // The same for this rank of the grid, with the grid's groups for the collectives below.
  static ZeroShard split(const model::ParamLayout& layout, const Grid& grid);

  bool sharded() const { return sharded_; }
  const std::vector<ShardSpan>& spans() const { return spans_; }
  // This rank's slice: flat ranges [first, second) in layout order; the moments hold them back to
  // back (owned() elements).
  const std::vector<std::pair<size_t, size_t>>& ranges() const { return ranges_; }
  size_t owned() const { return owned_; }
  size_t total() const { return total_; }

  // Collective over each span's group. `grads` (the full flat block, on any device): afterwards
  // this rank's slice holds the gradients summed over the group (as sync_gradients would leave
  // them there); the rest of the block holds partial sums.
  void reduce_scatter(float* grads) const;
  // Collective: every rank's slice of `params` (full flat block) to every rank of its groups.
  void allgather(float* params) const;
  // Collective: `full` (host, total() elements) = the logical tensor whose slices the ranks hold in
  // `local` (owned() elements, on `local_device`).
  void gather_full(const float* local, Device local_device, float* full) const;
  // Local: this rank's slice of `full` (host, total() elements) into `local` (on `local_device`).
  void take_slice(const float* full, float* local, Device local_device) const;

 private:
  void finish();
  bool sharded_ = false;
  std::vector<ShardSpan> spans_;
  std::vector<std::pair<size_t, size_t>> ranges_;
  size_t owned_ = 0, total_ = 0;
};

}  // namespace moe::parallel
