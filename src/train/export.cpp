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
#include "train/checkpoint.h"
#include "train/run_guard.h"

namespace moe::train {
namespace fs = std::filesystem;

ExportResult export_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                               size_t max_shard_bytes) {
  MOE_CHECK(max_shard_bytes > 0, "export: shard size must be positive");
  CheckpointMeta meta = read_checkpoint_meta(checkpoint, /*verify=*/true);
  model::ModelConfig cfg = model::config_from_json(meta.config, checkpoint + "/manifest.json");
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

  std::error_code ec;
  // An earlier export into this folder may have had another shard count: its weight files would
  // sit beside the new ones and a loader could pick the old weights. config.json goes first (the
  // folder counts as complete only once it is written again, last), then every weight file.
  static const std::regex weight_file(R"(model(-[0-9]+-of-[0-9]+)?\.safetensors|model\.safetensors\.index\.json(\.tmp)?)");
  fs::remove(fs::path(out_dir) / "config.json", ec);
  MOE_CHECK(!ec, out_dir, "/config.json: cannot remove the earlier export's file (", ec.message(), ")");
  for (fs::directory_iterator it(out_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!std::regex_match(name, weight_file) || it->is_directory()) continue;
    std::error_code rm;
    fs::remove(it->path(), rm);
    MOE_CHECK(!rm, it->path().string(), ": cannot remove the earlier export's file (", rm.message(), ")");
  }
  MOE_CHECK(!ec, out_dir, ": cannot list the folder (", ec.message(), ")");
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
    io::check_output_path(out_dir + "/" + name, "export OUT", {checkpoint});
    w.write(out_dir + "/" + name, "export OUT");
  }
  if (n > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    io::write_file_atomic(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n", "export OUT");
  }
  model::save_config(cfg, out_dir + "/config.json");  // last: the folder is usable once it exists
  return {n, total};
}

}  // namespace moe::train
