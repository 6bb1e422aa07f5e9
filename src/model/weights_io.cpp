#include "model/weights_io.h"

#include "core/error.h"
#include "io/safetensors.h"

namespace moe::model {

void save_weights(const Model& m, const std::string& path) {
  io::SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const ParamSpec& s : m.layout().specs()) w.add_f32(s.name, s.shape, m.params() + s.offset);
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
