// libFuzzer target: model::config_from_json of io::parse_json of the fuzz bytes (the depth- and
// size-bounded parse every config goes through). A moe::Error or a JSON exception is the expected
// answer to bad input. An accepted config must survive the
// round trip through config_to_json (the config.json training writes): reading it back must give
// the same config. Any other exception, a sanitizer report or a crash is a finding.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j;
  try {
    j = moe::io::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
  } catch (const moe::Error&) {
    return 0;
  }
  moe::model::ModelConfig c;
  try {
    c = moe::model::config_from_json(j, "fuzz.json");
  } catch (const moe::Error&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  // Accepted: what training writes must read back as the same config (no exception allowed).
  const nlohmann::json out = moe::model::config_to_json(c);
  const moe::model::ModelConfig back =
      moe::model::config_from_json(nlohmann::json::parse(out.dump()), "round trip");
  if (moe::model::config_to_json(back) != out) __builtin_trap();
  return 0;
}
