// Model weights <-> safetensors with Hugging Face DeepSeek names (one tensor per parameter, experts
// by logical expert id), so the files load in the PyTorch reference and in Hugging Face tooling.
#pragma once
#include <string>
#include <vector>

#include "model/model.h"

namespace moe::model {

// with_router_bias: also each noaux_tc MoE layer's selection bias as
// model.layers.<l>.mlp.gate.e_score_correction_bias [E] (DeepSeek-V3's name; state, not a
// parameter), so that eval and generate route as training did.
void save_weights(const Model& m, const std::string& path, bool with_router_bias = false);
// The bias tensor's name, and the MoE layers of `c` that carry one (noaux_tc; none otherwise).
std::string score_bias_name(int layer);
std::vector<int> score_bias_layers(const ModelConfig& c);
// Every parameter must be present with its exact shape and dtype F32; extra tensors are an error
// too (a file for another config). Errors name the file and the tensor.
void load_weights(Model& m, const std::string& path);

}  // namespace moe::model
