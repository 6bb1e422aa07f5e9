// `moetrain upcycle DENSE --experts E --topk K -o OUT`: a dense model folder -> an MoE model folder
// whose routed experts start as copies (or slices) of the dense MLPs (train/upcycle.h has the
// rule); `moetrain train --init-from OUT` continues from it.
#pragma once
#include <CLI/CLI.hpp>

#include "train/upcycle.h"

namespace moe::apps {

void add_upcycle_command(CLI::App& app, train::UpcycleOptions& state);
// Runs upcycle when it was chosen (returns the exit code); -1 otherwise. Errors propagate as
// moe::Error (one line from the caller).
int run_upcycle_command(CLI::App& app, train::UpcycleOptions& state);

}  // namespace moe::apps
