// `moetrain inspect PATH`: the CLI of report/inspect.h.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace moe::apps {

struct InspectCli {
  std::string path;
};
void add_inspect_command(CLI::App& app, InspectCli& state);
// Runs inspect when it was chosen (returns the exit code); -1 otherwise. Errors are moe::Error.
int run_inspect_command(CLI::App& app, const InspectCli& state);

}  // namespace moe::apps
