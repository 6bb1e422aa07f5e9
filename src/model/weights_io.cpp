#include "model/weights_io.h"

#include "core/error.h"
#include "io/safetensors.h"

namespace moe::model {

std::string score_bias_name(int layer) {
  return "model.layers." + std::to_string(layer) + ".mlp.gate.e_score_correction_bias";
}

std::vector<int> score_bias_layers(const ModelConfig& c) {
  std::vector<int> out;
  if (!c.aux_free_balancing()) return out;
  for (int l = 0; l < c.num_hidden_layers; ++l)
    if (c.is_moe_layer(l)) out.push_back(l);
  return out;
}

void save_weights(const Model& m, const std::string& path, bool with_router_bias) {
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const ParamSpec& s : m.layout().specs()) w.add_f32(s.name, s.shape, m.params() + s.offset);
  std::vector<std::vector<float>> bias;  // the writer keeps pointers until write()
  if (with_router_bias)
    for (int l : score_bias_layers(m.config()))
      if (m.score_bias_data(l)) bias.push_back(m.score_bias(l));
  size_t i = 0;
  if (with_router_bias)
    for (int l : score_bias_layers(m.config()))
      if (m.score_bias_data(l))
        w.add_f32(score_bias_name(l), {m.config().n_routed_experts}, bias[i++].data());
  w.write(path);
}

void load_weights(Model& m, const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  for (const ParamSpec& s : m.layout().specs()) {
    MOE_CHECK(f.has(s.name), path, ": tensor \"", s.name, "\" is missing");
    f.read_f32(s.name, m.params() + s.offset, s.shape);
  }
  for (const io::TensorInfo& t : f.tensors())
    MOE_CHECK(m.layout().contains(t.name), path, ": unexpected tensor \"", t.name,
              "\" (not a parameter of this config)");
}

}  // namespace moe::model
