// The state of aux-loss-free balancing (DeepSeek-V3, topk_method noaux_tc) in a training run:
// every MoE layer's e_score_correction_bias [E], fp32, not a parameter. Every rank of a layout
// holds all of it (a few floats per layer) and moves it by the same global loads after each step
// (mixture::update_score_bias), so every parallel layout keeps the bias of one process; a rank
// hands its model the rows of its own stage. The checkpoint manifest carries it (to_json), exactly:
// a float printed as the shortest double that reads back to it.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace moe::train {

class ScoreBias {
 public:
  // Zero bias for every MoE layer when cfg uses noaux_tc; otherwise inactive (holds nothing).
  // rate_flag: --balance.bias-rate (gamma, the step of each update); unset = the config's
  // bias_update_speed. A rate given for a model without noaux_tc is an error naming the flag.
  ScoreBias(const model::ModelConfig& cfg, std::optional<float> rate_flag);
  bool active() const { return !layers_.empty(); }
  const model::ModelConfig& config() const { return cfg_; }
  float rate() const { return rate_; }
  // loads_LE: the step's global loads, [MoE layers in layer order][E] (the metrics' expert_loads).
  void update(const std::vector<int64_t>& loads_LE);
  // Sets the bias of the MoE layers the model's stage holds.
  void apply(model::Model& m) const;
  const float* layer(int i) const { return bias_.data() + static_cast<size_t>(i) * E_; }  // i-th MoE layer
  // {"<layer id>": [E numbers], ...}; null when inactive.
  nlohmann::json to_json() const;
  // Reads to_json's form; errors name `where` (e.g. "<manifest>: field \"router_bias\"") and the
  // layer or value at fault: a missing layer, a wrong length, a non-finite or non-number entry.
  void load_json(const nlohmann::json& j, const std::string& where);
  // Every MoE layer's bias as a weight-file tensor (model/weights_io.h: score_bias_name), the
  // DeepSeek-V3 name that Hugging Face loaders read; the writer points into this object.
  void add_tensors(io::SafetensorsWriter& w) const;
  // Fills every layer's bias from `read(name, out_E)` (a weight file's tensor); errors name the
  // tensor and `where` when one is missing (an export without it would route differently).
  void load_tensors(const std::function<bool(const std::string&, float*)>& read, const std::string& where);

 private:
  model::ModelConfig cfg_;
  std::vector<int> layers_;  // MoE layer ids
  int E_ = 0;
  float rate_ = 0.0f;
  std::vector<float> bias_;  // [layers_, E]
};

}  // namespace moe::train
