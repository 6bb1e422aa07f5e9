#include "train/export.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <vector>

#include "core/error.h"
#include "io/output_file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "model/weights_io.h"
#include "train/checkpoint.h"
#include "train/run_guard.h"
#include "train/score_bias.h"
#include "train/staged_folder.h"

namespace moe::train {
namespace fs = std::filesystem;

ExportResult export_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                               size_t max_shard_bytes, bool drop_mtp) {
  MOE_CHECK(max_shard_bytes > 0, "export: shard size must be positive");
  CheckpointMeta meta = read_checkpoint_meta(checkpoint, /*verify=*/true);
  model::ModelConfig cfg = model::config_from_json(meta.config, checkpoint + "/manifest.json");
  if (drop_mtp) cfg.num_nextn_predict_layers = 0;  // the layout (and config.json) without the module
  // The output folder: not the checkpoint it reads, writable and ours alone (a second export or a
  // training run into it is refused) before the weights are read.
  std::error_code same_ec;
  MOE_CHECK(!fs::equivalent(out_dir, checkpoint, same_ec), "export OUT ", out_dir,
            ": is the checkpoint folder it reads; an output never overwrites one of the run's inputs");
  check_output_dir(out_dir, "export OUT");
  DirLock lock = DirLock::acquire(out_dir, "export OUT", str_cat("moetrain export ", checkpoint, " ", out_dir));
  // Every file it writes: a new or regular file (never a link, FIFO or device), none of the
  // checkpoint's files (io/output_file.h), checked before anything is removed or written.
  for (const char* f : {"config.json", "model.safetensors", "model.safetensors.index.json"})
    io::check_output_path(out_dir + "/" + f, "export OUT", {checkpoint});
  model::ParamLayout layout(cfg);
  std::vector<float> params(layout.total());
  load_checkpoint_tensors(checkpoint, layout, params.data(), nullptr, nullptr);

  // Every file goes into a staging folder beside OUT that replaces it in one rename once all are
  // written (train/staged_folder.h): an export that fails or is stopped halfway leaves OUT as it
  // was. An earlier export's weights and config go with the old folder (another shard count must
  // leave no stale shard a loader could pick); other files in OUT move into the new one.
  static const std::regex earlier_export(R"(config\.json|model(-[0-9]+-of-[0-9]+)?\.safetensors|model\.safetensors\.index\.json(\.tmp.*)?)");
  StagedFolder staged(out_dir, "export OUT");
  const std::string& stage = staged.path();
  // Group tensors into shards of at most max_shard_bytes (a tensor larger than that is alone).
  std::vector<std::vector<const model::ParamSpec*>> shards(1);
  size_t in_shard = 0, total = 0;
  for (const model::ParamSpec& s : layout.specs()) {
    const size_t b = s.numel * sizeof(float);
    if (in_shard > 0 && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += b;
    total += b;
  }
  const int n = static_cast<int>(shards.size());
  // noaux_tc: the routers' selection biases (state, not parameters) go into the last file by
  // DeepSeek-V3's tensor names, so eval and generate route as training did.
  ScoreBias bias(cfg, std::nullopt);
  if (bias.active()) bias.load_json(meta.router_bias, checkpoint + "/manifest.json: field \"router_bias\"");
  nlohmann::json weight_map = nlohmann::json::object();
  for (int i = 0; i < n; ++i) {
    char name[64];
    if (n == 1)
      std::snprintf(name, sizeof name, "model.safetensors");
    else
      std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", i + 1, n);
    io::SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (const model::ParamSpec* s : shards[i]) {
      w.add_f32(s->name, s->shape, params.data() + s->offset);
      weight_map[s->name] = name;
    }
    if (i == n - 1 && bias.active()) {
      bias.add_tensors(w);
      for (int l : model::score_bias_layers(cfg)) weight_map[model::score_bias_name(l)] = name;
    }
    io::check_output_path(out_dir + "/" + name, "export OUT", {checkpoint});
    w.write(stage + "/" + name, "export OUT");
  }
  if (n > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    io::write_file_atomic(stage + "/model.safetensors.index.json", index.dump(2) + "\n", "export OUT");
  }
  model::save_config(cfg, stage + "/config.json");
  staged.publish(earlier_export);  // OUT becomes the new folder whole
  return {n, total};
}

}  // namespace moe::train
