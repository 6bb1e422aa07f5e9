// `moetrain inspect`: flags -> report::inspect. See inspect_cmd.h.
#include "apps/inspect_cmd.h"

#include <cstdio>

#include "report/inspect.h"

namespace moe::apps {

void add_inspect_command(CLI::App& app, InspectCli& s) {
  CLI::App* c = app.add_subcommand("inspect", "what a checkpoint, export, safetensors file, config or dataset holds");
  c->add_option("path", s.path, "a step-N checkpoint, a model folder, a .safetensors, a config.json or a dataset")
      ->required();
}

int run_inspect_command(CLI::App& app, const InspectCli& s) {
  if (!app.got_subcommand("inspect")) return -1;
  const std::string text = report::inspect(s.path);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace moe::apps
