// libFuzzer target: the planner's two user files. The first byte picks the reader, the rest is
// the file: even -> a Hugging Face config.json (plan::read_hf_config, through a real file), odd ->
// a cluster profile (plan::profile_from_json of io::parse_json, the bounded parse that
// load_profile uses). A moe::Error or a JSON
// exception is the expected answer to bad input. An accepted model must count to finite, positive
// parameters with active <= total; an accepted profile must survive the round trip through
// profile_to_json (what calibrate and --save-cluster write). Anything else is a finding.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_input_file.h"
#include "io/json_file.h"
#include "plan/cluster.h"
#include "plan/plan_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool profile = data[0] & 1;
  ++data;
  --size;
  if (!profile) {
    static moe::fuzz::InputFile file;
    moe::plan::PlanModel m;
    try {
      m = moe::plan::read_hf_config(file.write(data, size));
    } catch (const moe::Error&) {
      return 0;
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
    const moe::plan::ModelParams p = moe::plan::count_params(m);
    if (!(std::isfinite(p.total) && p.total > 0 && p.active > 0 && p.active <= p.total)) __builtin_trap();
    return 0;
  }
  moe::plan::ClusterProfile c;
  try {
    c = moe::plan::profile_from_json(
        moe::io::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json"),
        "fuzz.json");
  } catch (const moe::Error&) {
    return 0;
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  const nlohmann::json out = moe::plan::profile_to_json(c);
  const moe::plan::ClusterProfile back = moe::plan::profile_from_json(nlohmann::json::parse(out.dump()), "round trip");
  if (moe::plan::profile_to_json(back) != out) __builtin_trap();
  return 0;
}
