// CLI11 checks and arguments shared by the commands' flags.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "core/error.h"

namespace moe::apps {

// Unsigned options (seeds): CLI11 would read "-1" as 2^64 - 1. Checked on the text instead.
inline const CLI::Validator kNonNegativeInteger(
    [](std::string& v) -> std::string {
      const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
      return digits && v.size() <= 20 ? std::string() : str_cat("must be a non-negative integer, got ", v);
    },
    "INT>=0");

// A subcommand of parent whose repeated flags take the last value (a later flag wins).
inline CLI::App* add_command(CLI::App& parent, const std::string& name, const std::string& description) {
  CLI::App* command = parent.add_subcommand(name, description);
  command->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  return command;
}

// The MODEL argument of the commands that load a trained model (generate, eval).
inline void add_model_argument(CLI::App* command, std::string& path) {
  command->add_option("model", path,
                      "a step-N checkpoint, a folder of checkpoints (the newest), or an exported model folder")
      ->required();
}

}  // namespace moe::apps
