// Tensor parallelism's parameters outside the step (model.h: TensorParallel runs the step): the
// conversion between a TP rank's slices (ParamSpec::tp_dim) and the logical tensors, which is what
// checkpoints and weight files hold, so they do not depend on the TP degree.
#pragma once
#include "comm/group.h"
#include "model/params.h"

namespace moe::parallel {

// The layout of `local`'s tensors unsplit: the same stage and experts, every tensor whole.
model::ParamLayout unsplit_layout(const model::ParamLayout& local, const model::ModelConfig& cfg);

// Collective over the TP group `tp` (every member passes its own block): `full_block` (host,
// full.total() elements, laid out by unsplit_layout) = the logical tensors whose slices the ranks
// hold in `local_block` (host, laid out by `local`).
void tp_gather(const model::ParamLayout& local, const float* local_block, const model::ParamLayout& full,
               float* full_block, const comm::Group& tp);

// Local: this rank's slices of the logical tensors in `full_block` into `local_block`.
void tp_slice(const model::ParamLayout& full, const float* full_block, const model::ParamLayout& local,
              float* local_block);

}  // namespace moe::parallel
