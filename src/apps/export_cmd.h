// `moetrain export CHECKPOINT OUT`: a step-N checkpoint -> a Hugging Face folder (train/export.h).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moe::apps {

struct ExportCli {
  std::string checkpoint, out;
  double shard_mb = 2048;
  std::string mtp = "keep";
};
void add_export_command(CLI::App& app, ExportCli& state);
// Runs export when it was chosen (returns the exit code); -1 otherwise. Errors are moe::Error.
int run_export_command(CLI::App& app, const ExportCli& state);

}  // namespace moe::apps
