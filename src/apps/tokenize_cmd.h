// `moetrain tokenize`: flags and dispatch (text/tokenize does the work).
#pragma once
#include <CLI/CLI.hpp>

#include "text/tokenize.h"

namespace moe::apps {

struct TokenizeCli {
  text::TokenizeOptions opts;
  bool quiet = false;
};

void add_tokenize_command(CLI::App& app, TokenizeCli& state);
// Runs tokenize when it was chosen (returns the exit code); -1 otherwise. Errors propagate as
// moe::Error (one line from the caller). Refused under a launcher with more than one rank.
int run_tokenize_command(CLI::App& app, TokenizeCli& state);

}  // namespace moe::apps
