// `moetrain export`. See export_cmd.h.
#include "apps/export_cmd.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "train/export.h"
#include "train/run_guard.h"

namespace moe::apps {

void add_export_command(CLI::App& app, ExportCli& s) {
  CLI::App* ex = app.add_subcommand("export", "checkpoint -> Hugging Face folder (config.json + safetensors)");
  ex->add_option("checkpoint", s.checkpoint, "a step-N checkpoint folder")->required();
  ex->add_option("out", s.out, "output folder")->required();
  ex->add_option("--shard-mb", s.shard_mb, "largest safetensors file (MB) before sharding")->capture_default_str();
  ex->add_option("--mtp", s.mtp, "DeepSeek-V3's multi-token-prediction module: keep (V3's layer L) or drop")
      ->check(CLI::IsMember({"keep", "drop"}))
      ->capture_default_str();
}

int run_export_command(CLI::App& app, const ExportCli& s) {
  if (!app.got_subcommand("export")) return -1;
  MOE_CHECK(std::isfinite(s.shard_mb) && s.shard_mb > 0 && s.shard_mb <= 1e9,
            "--shard-mb must be a positive number of megabytes (at most 1e9), got ", s.shard_mb);
  // Started once per rank, every copy would write the same folder at the same time.
  const int ranks = train::launcher_world_size();
  if (ranks > 1 && train::launcher_world_rank() != 0) return 1;  // rank 0 says why, once
  MOE_CHECK(ranks == 1, "export writes one folder from one process, but this is one of ", ranks,
            " ranks started by a launcher (mpirun/srun): run `moetrain export` without it");
  train::ExportResult r = train::export_checkpoint(
      s.checkpoint, s.out, static_cast<size_t>(std::max(1.0, s.shard_mb * 1024 * 1024)), s.mtp == "drop");
  std::printf("exported %s -> %s (%d file(s), %.1f MB)\n", s.checkpoint.c_str(), s.out.c_str(), r.num_files,
              r.bytes / 1e6);
  return 0;
}

}  // namespace moe::apps
