// Model weights <-> safetensors with Hugging Face DeepSeek names (one tensor per parameter, experts
// by logical expert id), so the files load in the PyTorch reference and in Hugging Face tooling.
#pragma once
#include <string>

#include "model/model.h"

namespace moe::model {

void save_weights(const Model& m, const std::string& path);
// Every parameter must be present with its exact shape and dtype F32; extra tensors are an error
// too (a file for another config). Errors name the file and the tensor.
void load_weights(Model& m, const std::string& path);

}  // namespace moe::model
