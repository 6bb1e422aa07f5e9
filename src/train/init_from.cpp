#include "train/init_from.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "io/data_file.h"
#include "train/hf_folder.h"

namespace moe::train {

namespace {

// Every field of `given` equals the folder's (the tokenizer is compared against the data instead).
void check_same(const model::ModelConfig& folder, const model::ModelConfig& given, const std::string& folder_src,
                const std::string& given_src) {
  nlohmann::json a = model::config_to_json(folder), b = model::config_to_json(given);
  for (nlohmann::json* j : {&a, &b}) j->erase("moetrain_tokenizer_fingerprint");
  for (const auto& [key, value] : a.items())
    MOE_CHECK(b.contains(key) && b[key] == value, given_src, " disagrees with --init-from's ", folder_src, ": ", key,
              " = ", b.contains(key) ? b[key].dump() : "missing", " there, ", value.dump(), " in the folder");
}

}  // namespace

model::ModelConfig init_from_config(const ModelOptions& opts) {
  std::error_code ec;
  MOE_CHECK(std::filesystem::is_directory(opts.init_from, ec), "--init-from ", opts.init_from,
            ": no such folder (expected a Hugging Face model folder: config.json and model.safetensors, or shards "
            "with model.safetensors.index.json, e.g. from `moetrain export`)");
  MOE_CHECK(io::entry_exists(opts.init_from + "/config.json") || !io::entry_exists(opts.init_from + "/manifest.json"),
            "--init-from ", opts.init_from, ": is a checkpoint (manifest.json), not a model folder: export it ",
            "(`moetrain export ", opts.init_from, " OUT`) and start from OUT, or continue it with --resume");
  const HfFolder hf = HfFolder::open(opts.init_from);
  model::ModelConfig cfg = hf.config();
  cfg.validate(hf.config_path());
  hf.check(model::ParamLayout(cfg));  // the whole model, unsplit: every rank finds the same fault
  if (!opts.config_path.empty())
    check_same(cfg, model::load_config(opts.config_path), hf.config_path(), "--config " + opts.config_path);
  else if (!opts.preset.empty())
    check_same(cfg, model::preset(opts.preset), hf.config_path(), "--preset " + opts.preset);
  MOE_CHECK(opts.vocab_size == 0 || opts.vocab_size == cfg.vocab_size, "--vocab-size ", opts.vocab_size,
            " disagrees with --init-from's ", hf.config_path(), ": vocab_size = ", cfg.vocab_size, " in the folder");
  return cfg;
}

void init_from_folder(const std::string& dir, model::Model& model, ScoreBias& bias) {
  const HfFolder hf = HfFolder::open(dir);
  std::vector<float> host(model.num_params());
  hf.read(model.layout(), host.data());
  device_copy(model.device(), model.params(), Device::kCpu, host.data(), host.size() * sizeof(float));
  const nlohmann::json b = hf.score_bias_json();
  if (!b.is_null()) bias.load_json(b, dir + ": e_score_correction_bias tensors");
}

}  // namespace moe::train
