// Reading a whole JSON file for the config, profile and HF readers: errors name the file, say
// what it was meant to be ("cannot open <what>") or quote the parser ("not valid JSON (...)").
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace moe::io {

inline nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream f(path);
  MOE_CHECK(f.good(), path, ": cannot open ", what);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(path, ": not valid JSON (", e.what(), ")"));
  }
}

}  // namespace moe::io
