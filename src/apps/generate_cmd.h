// `moetrain generate`: flags and printing (the library does the work: train/generate.h).
#pragma once
#include <CLI/CLI.hpp>

#include "train/generate.h"

namespace moe::apps {

struct GenerateCli {
  train::GenerateOptions opts;
  int threads = 1;
  bool ids = false;  // print token ids instead of text
};

void add_generate_command(CLI::App& app, GenerateCli& state);
// Runs generate when it was chosen (returns the exit code); -1 otherwise. Errors propagate as
// moe::Error (one line from the caller).
int run_generate_command(CLI::App& app, GenerateCli& state);

}  // namespace moe::apps
