// A run's checkpoints and its final weights file, whatever the layout. Both hold the logical
// tensors by their Hugging Face names (train/checkpoint.h writes and reads the files), so they
// resume or load on any layout. The conversions between one rank's state and them live here:
// ZeRO-1's slices of the AdamW moments (parallel/zero1.h), tensor parallelism's slices of the split
// matrices (parallel/tensor_parallel.h), a GPU's buffers copied through the host, and which rank
// writes each logical tensor (exactly one).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "balance/placement.h"
#include "model/model.h"
#include "parallel/grid.h"
#include "parallel/zero1.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

namespace moe::train {

class Checkpointer {
 public:
  // dir: the checkpoint folder (train/checkpoint.h); keep: complete checkpoints kept (0 = all);
  // parallel_json: the layout recorded in each manifest.
  Checkpointer(const parallel::Grid& grid, const model::ModelConfig& cfg, std::string dir, int keep,
               nlohmann::json parallel_json);
  // Collective. Restores `path` into this rank's model and optimizer: the expert placement first
  // (kept when the EP group has the size that wrote it; another size reshards from the contiguous
  // placement), then the weights and AdamW moments by name. Returns the checkpoint's meta (the
  // caller restores the step, the data order and the router bias from it).
  CheckpointMeta resume(const std::string& path, model::Model& model, AdamW& opt,
                        const parallel::ZeroShard& shard);
  // Collective. Writes the checkpoint of meta.step (the caller fills step, data_rng_state, seed,
  // bad_steps and router_bias; config, layout and placement come from here). Returns its folder.
  std::string save(CheckpointMeta meta, model::Model& model, AdamW& opt,
                   const parallel::ZeroShard& shard);
  // The newest complete checkpoint of this run (or the one it resumed from); "" when none.
  const std::string& last() const { return last_; }
  std::string last_or_none() const { return last_.empty() ? std::string("none") : last_; }
  // Collective: every parameter into one safetensors file at `path`, written by world rank 0.
  // router_bias: ScoreBias::to_json() (null without noaux_tc), written as the bias tensors.
  void write_weights(const model::Model& model, const std::vector<int>& layers_per_stage,
                     const nlohmann::json& router_bias,
                     const std::string& path) const;

 private:
  // Whether this rank writes `s` into checkpoints: data-parallel index 0 and TP index 0, and for
  // tensors replicated over the EP group its first rank.
  bool owned(const model::ParamSpec& s) const;

  const parallel::Grid& grid_;
  model::ModelConfig cfg_;
  std::string dir_;
  int keep_;
  nlohmann::json parallel_json_;
  std::string last_;
};

// The expert placement a resume restores: the checkpoint's, when it was written by an EP group of
// this size (another size reshards from the contiguous placement: none). Errors name the field.
std::optional<balance::Placement> restored_placement(const CheckpointMeta& meta, const model::ModelConfig& cfg,
                                                     int ep, const std::string& path);

}  // namespace moe::train
