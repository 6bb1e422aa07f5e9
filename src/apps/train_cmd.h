// `moetrain train`: the flags of train::TrainOptions, then train::run_training on every rank.
#pragma once
#include <CLI/CLI.hpp>

#include "train/trainer.h"

namespace moe::apps {

struct TrainCli {
  train::TrainOptions opts;
  bool quiet = false;
};
void add_train_command(CLI::App& app, TrainCli& state);
// Runs train when it was chosen (returns the exit code); -1 otherwise.
int run_train_command(CLI::App& app, TrainCli& state, int* argc, char*** argv);

}  // namespace moe::apps
