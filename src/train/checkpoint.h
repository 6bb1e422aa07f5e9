// Checkpoints that survive a crash and reshard on load. A checkpoint is a folder DIR/step-N:
//   shard-RRRRR.safetensors  written by the ranks that hold tensors: weights, AdamW m and v
//                            ("adam_m.<name>", "adam_v.<name>"), every tensor by its logical
//                            Hugging Face name (experts by logical expert id, never by rank)
//   manifest.json            written LAST: config, parallel layout, step, data cursor, RNG state,
//                            expert placement, tensor index (name -> shard), size + checksum per shard
// It is written as DIR/step-N.tmp and renamed once the manifest is in place, so a folder without
// its manifest (a crash mid-write) never counts; older folders are pruned only after that.
// Loading reads each tensor a rank needs by name from whichever shard holds it, so a checkpoint
// written by one layout (EP 4, PP 2, DP 2, ...) loads into any other. A checkpoint may come from
// someone else: loading validates the manifest in full (checkpoint_manifest.h), reads only plain
// files inside the folder (no symlinks), and refuses non-finite weights and moments.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/group.h"
#include "model/params.h"
#include "train/checkpoint_manifest.h"  // CheckpointMeta, the manifest rules

namespace moe::train {

// A rank's tensors and which of them it writes (each logical tensor is written by one rank).
struct CheckpointTensors {
  const model::ParamLayout* layout = nullptr;
  const float* params = nullptr;
  const float* adam_m = nullptr;
  const float* adam_v = nullptr;
  std::function<bool(const model::ParamSpec&)> owned;  // this rank writes the tensor
};

// Collective over `world`. Writes DIR/step-<meta.step> and keeps the newest `keep` complete
// checkpoints (0 = all). On failure on any rank (disk full, unwritable), every rank throws a
// moe::Error naming the path, the partial .tmp folder is removed, older checkpoints stay valid.
// Returns the folder written.
std::string save_checkpoint(const comm::Group& world, const std::string& dir, int keep,
                            const CheckpointMeta& meta, const CheckpointTensors& tensors);

// The newest complete checkpoint folder under dir ("" if none): real (not symlinked) folders
// named step-N (checkpoint_step_of: N canonical decimal < 2^31) holding a manifest; other
// entries (step-abc, step-99999999999, step-N.tmp, files) are ignored.
std::string find_latest_checkpoint(const std::string& dir);

// Reads and validates the manifest; with verify, checks that every shard is a plain file in the
// folder with its recorded size and checksum (errors name the folder and the shard).
CheckpointMeta read_checkpoint_meta(const std::string& path, bool verify = true);

// Fills every tensor of `layout` (weights, and m / v when not null) from the checkpoint by name.
// Errors name the checkpoint and the tensor (missing, wrong shape, a shard of the wrong size, a
// NaN/Inf weight or moment, a negative second moment).
void load_checkpoint_tensors(const std::string& path, const model::ParamLayout& layout,
                             float* params, float* adam_m, float* adam_v);

// 64-bit FNV-1a of a file's bytes (the shard checksum).
uint64_t file_checksum(const std::string& path);

}  // namespace moe::train
