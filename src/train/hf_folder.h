// A Hugging Face model folder (config.json plus model.safetensors, or shards named by
// model.safetensors.index.json) as weights: the one reader behind eval and generate
// (load_model_for_inference) and train --init-from, whatever the layout. Every file is opened as
// a checkpoint's shards are (io/data_file.h): a plain file inside the folder, never a symbolic
// link followed out of it, index names plain file names, sizes on the descriptor.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"

namespace moe::train {

// The dtypes a weight may have in the folder; each is widened to the fp32 master weight on read.
constexpr const char* kHfWeightDtypes = "F32, BF16 or F16";

class HfFolder {
 public:
  // Reads config.json and the index (or finds model.safetensors) and maps every weight file the
  // folder names (headers validated on open; no tensor data is touched).
  static HfFolder open(const std::string& dir);
  const std::string& dir() const { return dir_; }
  const model::ModelConfig& config() const { return cfg_; }
  const std::string& config_path() const { return config_path_; }

  // Every parameter of `full` (the whole model: every stage, every expert, unsplit) is in the
  // folder with its shape and a dtype of kHfWeightDtypes; nothing else is, but for the
  // e_score_correction_bias [E] of the MoE layers of a noaux_tc model and DeepSeek-V3's copies of
  // the embedding and head in its MTP layer (ignored: tied here). One error line names the first
  // tensor at fault and its file (the index for a tensor it does not list).
  void check(const model::ParamLayout& full) const;
  // This rank's tensors (`local`: its stage, its experts, its TP slices) into `params` (host, laid
  // out by `local`), widened to fp32; only those bytes are read. A non-finite value is an error
  // naming the file, the tensor and the element.
  void read(const model::ParamLayout& local, float* params) const;
  // noaux_tc: the folder's e_score_correction_bias tensors in ScoreBias::load_json's form
  // ({"<layer>": [E numbers]}); null when the folder has none (the run starts from zero bias).
  nlohmann::json score_bias_json() const;

 private:
  const io::SafetensorsFile* file_of(const std::string& tensor) const;  // null: not in the folder
  std::string where(const std::string& tensor) const;                   // the file that lists it

  std::string dir_, config_path_, index_path_;
  model::ModelConfig cfg_;
  std::map<std::string, std::string> name_to_file_;   // tensor -> plain file name in dir_
  std::map<std::string, io::SafetensorsFile> files_;  // plain file name -> mapped file
};

}  // namespace moe::train
