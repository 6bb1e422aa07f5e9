// `moetrain export CKPT OUT`: a checkpoint (any layout) -> a Hugging Face model folder:
// config.json plus model.safetensors, or model-0000i-of-0000n.safetensors shards and
// model.safetensors.index.json when the weights exceed the shard size.
#pragma once
#include <cstddef>
#include <string>

namespace moe::train {

struct ExportResult {
  int num_files = 0;
  size_t bytes = 0;
};

// drop_mtp: leave DeepSeek-V3's multi-token-prediction module out (its tensors, and
// num_nextn_predict_layers 0 in config.json): a model for inference only.
ExportResult export_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                               size_t max_shard_bytes, bool drop_mtp = false);

}  // namespace moe::train
