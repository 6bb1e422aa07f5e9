// The held-out loss of a run: cross-entropy of fixed validation batches (io::Corpus::val_batches),
// the same batches at every evaluation and in every parallel layout.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "parallel/grid.h"

namespace moe::train {

// Validation cross-entropy of the fixed held-out batches: each data rank evaluates its share,
// passing activations through the pipeline stages (forward only, blocking p2p).
double validation_loss(model::Model& m, const std::vector<int32_t>& val, int B_local, int T, int n,
                       const parallel::Grid& g);

}  // namespace moe::train
