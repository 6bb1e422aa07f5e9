// The checkpoint manifest (DIR/step-N/manifest.json) as untrusted input: parsed and validated in
// full before any shard is opened, so a hostile or damaged checkpoint is a moe::Error naming the
// manifest and the field, never a read outside the folder, a skipped checksum or a crash.
// No MPI here (the fuzz target links this file alone). Rules:
//   - shard names are plain file names inside the checkpoint folder: [A-Za-z0-9._-], no "..",
//     not starting with '.', ending ".safetensors"; a shard that is a symlink is refused;
//   - tensor names are [A-Za-z0-9._-] without ".." (Hugging Face names);
//   - every tensor of the index names a shard listed in "shards", each with its byte size and its
//     FNV-1a checksum (16 hex digits), so no tensor escapes the checksum;
//   - step, bad_steps: integers in [0, 2^31); data_rng_state, seed: decimal strings of a u64;
//   - the file is at most kMaxManifestBytes and nests at most io::kMaxJsonDepth levels.
// Checkpoint folder names: exactly "step-N", N canonical decimal (no sign, no leading zeros) in
// [0, 2^31); anything else (step-abc, step-007, step-99999999999, step-5.tmp) is not a checkpoint.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace moe::train {

constexpr const char* kCheckpointFormat = "moetrain-checkpoint-1";
constexpr size_t kMaxManifestBytes = size_t{256} << 20;

struct CheckpointMeta {
  int step = 0;                 // optimizer steps completed
  uint64_t data_rng_state = 0;  // data sampler state after `step` steps (the data cursor)
  uint64_t seed = 0;
  int bad_steps = 0;  // non-finite steps skipped so far
  // The step count a --time-budget run chose after its warm-up (0: a run with a fixed --steps, or
  // one written before the choice); a resumed --time-budget run keeps it.
  int time_budget_steps = 0;
  nlohmann::json config;            // the model's config.json
  nlohmann::json parallel;          // layout that wrote it (information; any layout can load it)
  nlohmann::json expert_placement;  // {"layer": [ep rank of logical expert e, ...]}
  // noaux_tc routers' e_score_correction_bias, {"layer": [E floats]} (train/score_bias.h); null
  // when the model has none. Checked against the model on resume (ScoreBias::load_json).
  nlohmann::json router_bias;
  // What the run trained on (io::Corpus::Identity): {"file": path, "bytes": n, "sample": 16 hex
  // digits}; compared at resume, so data replaced under the same name is refused (issue 42,
  // class 5). null in checkpoints written before it.
  nlohmann::json data;
};

struct ShardInfo {
  uint64_t bytes = 0;
  std::string fnv1a64;  // 16 lowercase hex digits
};

struct Manifest {
  CheckpointMeta meta;
  std::map<std::string, std::string> tensors;  // tensor name -> shard file name
  std::map<std::string, ShardInfo> shards;     // shard file name -> size and checksum
};

// Validates manifest text (rules above); errors name `mpath`.
Manifest parse_manifest(const std::string& text, const std::string& mpath);
// Reads and validates DIR/manifest.json (not following a symlink).
Manifest read_manifest(const std::string& dir);

bool is_plain_shard_name(const std::string& name);
bool is_plain_tensor_name(const std::string& name);
// "step-N" -> N for a conforming checkpoint folder name, -1 for anything else.
int checkpoint_step_of(const std::string& folder_name);

// Opens DIR/shard read-only without following a symlink and checks that it is a regular file
// whose size is the manifest's; returns the fd (the caller closes it). Errors name dir and shard.
int open_shard(const std::string& dir, const std::string& shard, const ShardInfo& info);
// Checks every listed shard: a regular file inside dir, of the recorded size and checksum, a
// valid safetensors file whose floats are all finite (and AdamW second moments >= 0).
void verify_shards(const std::string& dir, const Manifest& m);

// 64-bit FNV-1a of the bytes read from fd (to its end); errors name `path`. poll_stop: between
// blocks, io::check_stop (verifying a checkpoint at setup; never while one is saved on SIGTERM).
uint64_t fd_checksum(int fd, const std::string& path, bool poll_stop = false);
std::string hex64(uint64_t v);

}  // namespace moe::train
